#!/usr/bin/env python3
"""Unit tests of the scoreboard's text (tools/grade.py): the first failure is
wrapped, never cut, so "expected ... got ..." always reaches the student;
--puzzle is validated; whole messages lose only gtest's file:line header.

Run: python3 tools/test_grade.py (CTest runs it as tools.grade_text).
"""

import io
import sys
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import grade  # noqa: E402

LONG_FAILURE = (
    "/src/tests/01_collectives/collectives_checks.h:295: Failure\n"
    "Value of: ranks_hold(context, outcomes, expected, n, key)\n"
    "  Actual: false (ring_all_reduce on N=2 with 1009 f64 elements: rank 1, 3 of 1009 elements "
    "wrong; element 0 (chunk 0 of 2, offset 0): expected 16777218 = the sum over all 2 ranks of "
    "element 0, got 16777217 = rank 1's element 0 alone; element 1 (chunk 0 of 2, offset 1): "
    "expected 16777220 = the sum over all 2 ranks of element 1, got 16777218 = rank 1's element 1 "
    "alone)\nExpected: true\n")


class Terminal(io.StringIO):
    def isatty(self):
        return False


def puzzle_with(message, status="failed"):
    p = grade.Puzzle(1, "8", "ring_all_reduce")
    p.tests.append(grade.TestResult("Puzzle1_8_ring_all_reduce", "ExactResults", status, [message]))
    return p


class FirstFailure(unittest.TestCase):
    def test_first_line_keeps_expected_and_got(self):
        line = grade.first_line(LONG_FAILURE)
        self.assertIn("expected 16777218", line)
        self.assertIn("got 16777217 = rank 1's element 0 alone", line)

    def test_table_wraps_instead_of_cutting(self):
        out = Terminal()
        grade.print_table(1, "ch01_puzzles_tests", [puzzle_with(LONG_FAILURE)], "puzzles", out)
        text = " ".join(out.getvalue().split())  # undo the wrapping
        self.assertIn("got 16777217 = rank 1's element 0 alone", text)
        self.assertNotIn("...", out.getvalue().replace("(no message)", ""))
        for row in out.getvalue().splitlines():
            self.assertLessEqual(len(row), 120, row)

    def test_very_long_failures_point_to_puzzle(self):
        out = Terminal()
        grade.print_table(1, "ch01_puzzles_tests", [puzzle_with("x " * 2000)], "puzzles", out)
        self.assertIn("./dtp grade 01 --puzzle 1.8", out.getvalue())

    def test_full_message_drops_only_the_location(self):
        body = grade.full_message(LONG_FAILURE)
        self.assertFalse(body.startswith("/src/"))
        self.assertIn("element 1 (chunk 0 of 2, offset 1)", body)

    def test_unsolved_stub_says_so(self):
        message = ('unknown file: Failure\nC++ exception with description "rank 0: puzzle 1.8 '
                   'ring_all_reduce is not solved yet" thrown in the test body.\n')
        self.assertEqual(grade.first_line(message), "rank 0: puzzle 1.8 ring_all_reduce is not solved yet")


class Arguments(unittest.TestCase):
    def run_main(self, *argv):
        err = io.StringIO()
        old = sys.stderr
        sys.stderr = err
        try:
            status = grade.main(list(argv) + ["--build-dir", "/nonexistent-dtp-build"])
        finally:
            sys.stderr = old
        return status, err.getvalue()

    def test_bad_puzzle_id(self):
        status, err = self.run_main("--puzzle", "ring")
        self.assertEqual(status, 2)
        self.assertIn("--puzzle takes a puzzle id like 1.4", err)

    def test_puzzle_of_another_chapter(self):
        status, err = self.run_main("02", "--puzzle", "1.4")
        self.assertEqual(status, 2)
        self.assertIn("puzzle 1.4 belongs to chapter 01, not 02", err)

    def test_nothing_built(self):
        status, err = self.run_main("01")
        self.assertEqual(status, 2)
        self.assertIn("ch01_puzzles_tests", err)

    def test_filter_matching(self):
        self.assertTrue(grade.matches_filter(("Puzzle1_4_ring_all_gather", "ExactResults"),
                                             "Puzzle1_4_*.*:*/Puzzle1_4_*.*"))
        self.assertFalse(grade.matches_filter(("Puzzle1_10_halving_doubling_all_reduce", "X"),
                                              "Puzzle1_1_*.*:*/Puzzle1_1_*.*"))


if __name__ == "__main__":
    unittest.main()
