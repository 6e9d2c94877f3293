#!/usr/bin/env python3
"""Unit tests of the scoreboard (tools/grade.py and tools/scoreboard/): the
first failure is wrapped, never cut, so "expected ... got ..." always reaches
the student; --puzzle is validated; whole messages lose only gtest's file:line
header.
And the autograder exports: JUnit XML carries each checker's file and line and
its whole failure in <system-out>; --gradescope writes a results.json that
validate_gradescope() below accepts (Gradescope's documented format), whose
scores add up and whose failing checkers carry their messages. Bad values of
--timeout, --test-timeout and --jobs, and --junit/--gradescope files that
cannot be written, are argument errors (exit status 2, no traceback).

Run: python3 tools/test_grade.py, or python3 -m unittest tools/test_grade.py
(CTest runs it as tools.grade_text).
"""

import io
import json
import math
import os
import subprocess
import sys
import tempfile
import unittest
import xml.etree.ElementTree as ET
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import grade  # noqa: E402  (the entry point: main, and its path)
from scoreboard.alike import group_alike, where_of  # noqa: E402
from scoreboard.checker_run import matches_filter  # noqa: E402
from scoreboard.cli import positive_jobs, positive_seconds  # noqa: E402
from scoreboard.gradescope import gradescope_results, write_gradescope  # noqa: E402
from scoreboard.gtest_output import apply_json, read_locations  # noqa: E402
from scoreboard.junit import write_junit  # noqa: E402
from scoreboard.messages import first_line, full_message  # noqa: E402
from scoreboard.output_files import output_problem, write_output  # noqa: E402
from scoreboard.puzzles import Puzzle, TestResult  # noqa: E402
from scoreboard.repository import ROOT, source_path, source_puzzles  # noqa: E402
from scoreboard.table import print_failures, print_table  # noqa: E402

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
    p = Puzzle(1, "8", "ring_all_reduce")
    p.tests.append(TestResult("Puzzle1_8_ring_all_reduce", "ExactResults", status, [message]))
    return p


class FirstFailure(unittest.TestCase):
    def test_first_line_keeps_expected_and_got(self):
        line = first_line(LONG_FAILURE)
        self.assertIn("expected 16777218", line)
        self.assertIn("got 16777217 = rank 1's element 0 alone", line)

    def test_table_wraps_instead_of_cutting(self):
        out = Terminal()
        print_table(1, "ch01_puzzles_tests", [puzzle_with(LONG_FAILURE)], "puzzles", out)
        text = " ".join(out.getvalue().split())  # undo the wrapping
        self.assertIn("got 16777217 = rank 1's element 0 alone", text)
        self.assertNotIn("...", out.getvalue().replace("(no message)", ""))
        for row in out.getvalue().splitlines():
            self.assertLessEqual(len(row), 120, row)

    def test_very_long_failures_point_to_puzzle(self):
        out = Terminal()
        print_table(1, "ch01_puzzles_tests", [puzzle_with("x " * 2000)], "puzzles", out)
        self.assertIn("./dtp grade 01 --puzzle 1.8", out.getvalue())

    def test_full_message_drops_only_the_location(self):
        body = full_message(LONG_FAILURE)
        self.assertFalse(body.startswith("/src/"))
        self.assertIn("element 1 (chunk 0 of 2, offset 1)", body)

    def test_unsolved_stub_says_so(self):
        message = ('unknown file: Failure\nC++ exception with description "rank 0: puzzle 1.8 '
                   'ring_all_reduce is not solved yet" thrown in the test body.\n')
        self.assertEqual(first_line(message), "rank 0: puzzle 1.8 ring_all_reduce is not solved yet")


def rank_failure(n, rank, what="its output element 3: expected 6, got 3 = rank {r}'s alone"):
    """A failure as run_and_report() writes it, of rank `rank` on `n` ranks."""
    return (f"/src/tests/04_tensor_parallel/linears_test.cpp:180: Failure\nFailed\n"
            f"rank {rank}: {what.format(r=rank)}\n    [4.1 ColumnParallelLinear, plain, "
            f"on {n} rank(s)]\n")


class AlikeFailures(unittest.TestCase):
    """--puzzle and -v show each distinct failure once, with where it occurred:
    failures that differ only in the rank, the world size or gtest's file:line
    are one; any other difference keeps them apart."""

    def puzzle(self):
        p = Puzzle(4, "1", "column_parallel_linear")
        plain = TestResult("Puzzle4_1_column_parallel_linear", "Plain", "failed",
                           [rank_failure(n, r) for n in (2, 3, 4) for r in range(n)])
        plain.messages.append(rank_failure(4, 2, "its bias gradient: expected 1, got 0"))
        stub = ('unknown file: Failure\nC++ exception with description "rank {r}: puzzle 4.1 '
                'column_parallel_linear is not solved yet" thrown in the test body.\n')
        sp = TestResult("Puzzle4_1_column_parallel_linear", "SequenceParallel", "failed",
                        [stub.format(r=1)])
        again = TestResult("Puzzle4_1_column_parallel_linear", "Again", "failed", [stub.format(r=0)])
        p.tests = [plain, sp, TestResult("Puzzle4_1_column_parallel_linear", "Ok", "passed"), again]
        return p

    def test_where_parts_are_taken_out(self):
        a, places_a = where_of("rank 1: x on 2 rank(s) --sp 2 (TP rank 0); tree_reduce on N=2")
        b, places_b = where_of("rank 3: x on 4 rank(s) --sp 4 (TP rank 1); tree_reduce on N=4")
        self.assertEqual(a, b)
        self.assertEqual(places_a, {"rank": {1}, "N": {2}, "--sp": {2}, "TP rank": {0}})
        self.assertEqual(places_b["N"], {4})
        trace, _ = where_of("boom\nGoogle Test trace:\n/src/tests/x_test.cpp:40: world size 3")
        self.assertEqual(trace, "boom Google Test trace: world size #")

    def test_other_differences_stay_apart(self):
        self.assertNotEqual(where_of("rank 1: element 3 expected 6, got 3")[0],
                            where_of("rank 1: element 4 expected 6, got 3")[0])
        self.assertNotEqual(where_of("ring_all_reduce on N=4 with 1009 f64 elements")[0],
                            where_of("ring_all_reduce on N=4 with 1008 f64 elements")[0])

    def test_groups(self):
        groups = group_alike([t for t in self.puzzle().tests if t.status == "failed"])
        self.assertEqual(len(groups), 3)
        first, bias, stub = groups
        self.assertEqual(first.count, 9)
        self.assertEqual(first.where(), "on N=2, 3, 4; ranks 0-3")
        self.assertEqual(first.message, "rank 0: its output element 3: expected 6, got 3 = rank 0's "
                                        "alone\n    [4.1 ColumnParallelLinear, plain, on 2 rank(s)]")
        self.assertEqual((bias.count, bias.where()), (1, "on N=4; rank 2"))
        self.assertEqual([t.name for t in stub.checkers], ["SequenceParallel", "Again"])
        self.assertEqual((stub.count, stub.where()), (2, "ranks 0, 1"))

    def test_printed_once_with_where(self):
        out = Terminal()
        print_failures([self.puzzle()], out)
        text = out.getvalue()
        self.assertEqual(text.count("its output element 3"), 1, text)
        self.assertIn("(9 times alike: on N=2, 3, 4; ranks 0-3; the first in full:)", text)
        self.assertEqual(text.count("its bias gradient: expected 1, got 0"), 1, text)
        self.assertEqual(text.count("is not solved yet"), 1, text)
        self.assertIn("--- puzzle 4.1 column_parallel_linear: Puzzle4_1_column_parallel_linear."
                      "SequenceParallel (FAILED, 0.0 s)\n"
                      "    and Puzzle4_1_column_parallel_linear.Again (FAILED, 0.0 s)\n", text)
        self.assertNotIn(".Ok", text)  # a passing checker has nothing to say
        self.assertNotIn("linears_test.cpp:180", text)  # gtest's location header is left out

    def test_failures_alike_but_for_their_numbers(self):
        t = TestResult("Puzzle6_4_zigzag", "Forward", "failed", [
            f"rank {r}'s output differs in {96 + r} of 192 elements; first at position {24 + r}: "
            f"expected 0.06, got -{r}.5e-3\n    [zigzag ring attention, forward, on 4 rank(s)]"
            for r in range(4)])
        (alike,) = group_alike([t])
        self.assertEqual(alike.summary(), "(4 times alike but for their numbers (values, positions, "
                                          "counts): on N=4; ranks 0-3; the first in full:)")
        self.assertIn("96 of 192 elements", alike.message)
        self.assertEqual(len(group_alike([t], numbers=False)), 4)
        # --every-failure: each one, as it came.
        out = Terminal()
        p = Puzzle(6, "4", "zigzag")
        p.tests = [t]
        print_failures([p], out, every=True)
        for r in range(4):
            self.assertIn(f"{96 + r} of 192 elements", out.getvalue())
        self.assertNotIn("alike", out.getvalue())

    def test_a_failure_seen_once_says_nothing_more(self):
        out = Terminal()
        print_failures([puzzle_with(LONG_FAILURE)], out)
        self.assertNotIn("alike", out.getvalue())
        self.assertIn("element 1 (chunk 0 of 2, offset 1)", out.getvalue())


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
        self.assertTrue(matches_filter(("Puzzle1_4_ring_all_gather", "ExactResults"),
                                             "Puzzle1_4_*.*:*/Puzzle1_4_*.*"))
        self.assertFalse(matches_filter(("Puzzle1_10_halving_doubling_all_reduce", "X"),
                                              "Puzzle1_1_*.*:*/Puzzle1_1_*.*"))


GRADE_PY = Path(grade.__file__).resolve()


def run_grade(*argv, env=None):
    """tools/grade.py as ./dtp grade runs it, in a process of its own: argparse's
    errors exit, and a traceback would show on stderr."""
    return subprocess.run([sys.executable, str(GRADE_PY), *argv], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=60, env=env)


class BadFlagValues(unittest.TestCase):
    """--timeout, --test-timeout and --jobs refuse values that would make every
    test "time out", crash the timer (nan) or reach the build (negative jobs):
    argparse's error, exit status 2, the flag and what it expects, no traceback."""

    CASES = [
        ("--timeout", "nan", "a positive number of seconds"),
        ("--timeout", "inf", "a positive number of seconds"),
        ("--timeout", "-1", "a positive number of seconds"),
        ("--timeout", "0", "a positive number of seconds"),
        ("--timeout", "soon", "a positive number of seconds"),
        ("--test-timeout", "0", "a positive number of seconds"),
        ("--test-timeout", "NaN", "a positive number of seconds"),
        ("--test-timeout", "-inf", "a positive number of seconds"),
        ("--jobs", "-3", "a whole number of compile jobs, at least 1"),
        ("--jobs", "0", "a whole number of compile jobs, at least 1"),
        ("--jobs", "2.5", "a whole number of compile jobs, at least 1"),
        ("--jobs", "many", "a whole number of compile jobs, at least 1"),
    ]

    def test_refused_with_the_flag_named(self):
        for flag, value, expects in self.CASES:
            with self.subTest(flag=flag, value=value):
                run = run_grade("--build-dir", "/nonexistent-dtp-build", f"{flag}={value}", "01")
                self.assertEqual(run.returncode, 2, run.stderr)
                self.assertNotIn("Traceback", run.stderr)
                self.assertIn(f"argument {flag}: expects {expects}, got '{value}'", run.stderr)

    def test_good_values_still_accepted(self):
        self.assertEqual((positive_seconds("0.5"), positive_seconds("1e3"),
                          positive_jobs("4")), (0.5, 1000.0, 4))
        run = run_grade("--build-dir", "/nonexistent-dtp-build", "--timeout", "0.5",
                        "--test-timeout", "1e3", "--jobs", "4", "01")
        self.assertEqual(run.returncode, 2, run.stderr)  # nothing built there, but parsed
        self.assertIn("ch01_puzzles_tests", run.stderr)
        self.assertNotIn("argument", run.stderr)


class UnwritableExports(unittest.TestCase):
    """--junit FILE and --gradescope FILE that cannot be written are said before
    anything is built or graded: "grade: error: cannot write --junit FILE:
    REASON", exit status 2, no traceback; a writable path behaves as before."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = Path(self.tmp.name)
        self.a_file = self.dir / "plain.txt"
        self.a_file.write_text("keep me\n")

    def tearDown(self):
        self.tmp.cleanup()

    def bad_paths(self):
        paths = [(self.a_file / "sub" / "out.xml", "cannot create the folder"),
                 (self.dir, "it is a folder")]
        if Path("/proc/self").is_dir():  # Linux: no folder can be made in /proc
            paths.append((Path("/proc/x/y"), "cannot create the folder /proc/x"))
        return paths

    def test_refused_before_anything_is_built(self):
        # A cmake that leaves a mark: --build must not reach it.
        bin_dir = self.dir / "bin"
        bin_dir.mkdir()
        marker = self.dir / "cmake-ran"
        fake = bin_dir / "cmake"
        fake.write_text(f"#!/bin/sh\ntouch '{marker}'\nexit 97\n")
        fake.chmod(0o755)
        env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
        for flag in ("--junit", "--gradescope"):
            for path, reason in self.bad_paths():
                with self.subTest(flag=flag, path=str(path)):
                    run = run_grade("--build", "--build-dir", str(self.dir / "build"),
                                    flag, str(path), "01", env=env)
                    self.assertEqual(run.returncode, 2, run.stderr)
                    self.assertNotIn("Traceback", run.stderr)
                    self.assertIn(f"grade: error: cannot write {flag} {path}: ", run.stderr)
                    self.assertIn(reason, run.stderr)
                    self.assertFalse(marker.exists(), "grade.py built before checking " + flag)
        self.assertEqual(self.a_file.read_text(), "keep me\n")

    def test_checking_leaves_no_trace(self):
        existing = self.dir / "junit.xml"
        existing.write_text("an older report\n")
        nested = self.dir / "new" / "deeper" / "junit.xml"
        for path in (existing, nested):
            self.assertIsNone(output_problem(path))
        self.assertEqual(existing.read_text(), "an older report\n")  # not truncated
        self.assertFalse((self.dir / "new").exists())  # the writers make it at the end

    def test_writable_paths_as_before(self):
        results = self.dir / "results" / "results.json"
        junit = self.dir / "junit" / "junit.xml"
        run = run_grade("01", "--build-dir", "/nonexistent-dtp-build",
                        "--gradescope", str(results), "--junit", str(junit))
        self.assertEqual(run.returncode, 2, run.stderr)  # nothing to grade
        self.assertNotIn("Traceback", run.stderr)
        self.assertEqual(json.loads(results.read_text())["tests"], [])  # still written
        self.assertFalse(junit.parent.exists())  # as before: no JUnit without grading

    def test_late_write_failure_is_reported(self):
        err, old = io.StringIO(), sys.stderr
        sys.stderr = err

        def writer():
            raise OSError(28, "No space left on device")

        try:
            ok = write_output("--junit", "j.xml", writer)
        finally:
            sys.stderr = old
        self.assertFalse(ok)
        self.assertIn("grade: error: cannot write --junit j.xml: No space left on device", err.getvalue())


# --- Gradescope's results.json, as documented at
# https://gradescope-autograders.readthedocs.io/en/latest/specs/ ("Output
# format"): every field is optional except that a score must be given, at the
# top level or on every test; a top-level score overrides the tests' total.
GS_TOP_FIELDS = {
    "score": "number", "execution_time": "number", "output": "string",
    "output_format": "format", "test_output_format": "format", "test_name_format": "format",
    "visibility": "visibility", "stdout_visibility": "visibility", "extra_data": "object",
    "tests": "array", "leaderboard": "array",
}
GS_TEST_FIELDS = {
    "score": "number", "max_score": "number", "status": "status", "name": "string",
    "name_format": "format", "number": "string", "output": "string", "output_format": "format",
    "tags": "strings", "visibility": "visibility", "extra_data": "object",
}
GS_ENUMS = {
    "format": {"text", "html", "simple_format", "md", "ansi"},
    "visibility": {"hidden", "after_due_date", "after_published", "visible"},
    "status": {"passed", "failed"},
}


def gs_type_error(where, kind, value):
    if kind == "number":
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    elif kind == "string":
        ok = isinstance(value, str)
    elif kind == "object":
        ok = isinstance(value, dict)
    elif kind == "array":
        ok = isinstance(value, list)
    elif kind == "strings":
        ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
    else:
        ok = value in GS_ENUMS[kind]
        kind = "one of " + ", ".join(sorted(GS_ENUMS[kind]))
    return None if ok else f"{where}: expected {kind}, got {value!r}"


def validate_gradescope(document):
    """The problems of a results.json document (an empty list when valid):
    unknown fields (typos), wrong types, enum values, a missing score."""
    problems = []
    if not isinstance(document, dict):
        return ["the document is not a JSON object"]
    for key, value in document.items():
        if key not in GS_TOP_FIELDS:
            problems.append(f"unknown top-level field {key!r}")
        else:
            problems.append(gs_type_error(key, GS_TOP_FIELDS[key], value))
    tests = document.get("tests", [])
    if "score" not in document and "tests" not in document:
        problems.append("neither a top-level score nor tests")
    for i, test in enumerate(tests if isinstance(tests, list) else []):
        if not isinstance(test, dict):
            problems.append(f"tests[{i}] is not an object")
            continue
        for key, value in test.items():
            if key not in GS_TEST_FIELDS:
                problems.append(f"tests[{i}]: unknown field {key!r}")
            else:
                problems.append(gs_type_error(f"tests[{i}].{key}", GS_TEST_FIELDS[key], value))
        if "score" not in document and "score" not in test:
            problems.append(f"tests[{i}]: no score and no top-level score")
        for key in ("score", "max_score"):
            if isinstance(test.get(key), (int, float)) and test[key] < 0:
                problems.append(f"tests[{i}].{key} is negative")
    return [p for p in problems if p]


def checker(suite, name, status, messages=(), file="tests/01_collectives/x_test.cpp", line=10):
    return TestResult(suite, name, status, list(messages), 0.25, file, line)


def sample_puzzles():
    """Puzzle 1.4 half solved (one checker fails), 1.8 solved, 1.9 skipped (no GPU)."""
    half = Puzzle(1, "4", "ring_all_gather")
    half.tests = [checker("Puzzle1_4_ring_all_gather", "ExactResults", "failed", [LONG_FAILURE], line=41),
                  checker("Puzzle1_4_ring_all_gather", "AnyRoot", "passed", line=42),
                  checker("Sizes/Puzzle1_4_ring_all_gather", "Large/0", "passed", line=43)]
    solved = Puzzle(1, "8", "ring_all_reduce")
    solved.tests = [checker("Puzzle1_8_ring_all_reduce", n, "passed", line=50 + i)
                    for i, n in enumerate(["A", "B", "C", "D", "E", "F", "G"])]
    gpu = Puzzle(1, "9", "tree_all_reduce")
    gpu.tests = [checker("Puzzle1_9_tree_all_reduce", "OnGpu", "skipped", line=60)]
    return [half, solved, gpu]


class Gradescope(unittest.TestCase):
    def results(self, **kwargs):
        document = gradescope_results([(1, "puzzles", sample_puzzles())], **kwargs)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "results" / "results.json"
            write_gradescope(path, document)
            return json.loads(path.read_text(encoding="utf-8"))

    def test_valid_results_json(self):
        self.assertEqual(validate_gradescope(self.results()), [])

    def test_validator_catches_mistakes(self):
        bad = {"tests": [{"name": 3, "max_score": "1", "status": "ok", "visiblity": "visible"}],
               "visibility": "public"}
        problems = " | ".join(validate_gradescope(bad))
        for expected in ("tests[0].name", "tests[0].max_score", "tests[0].status",
                         "unknown field 'visiblity'", "tests[0]: no score", "visibility: expected"):
            self.assertIn(expected, problems)

    def test_one_test_per_checker_with_file_and_line(self):
        tests = self.results()["tests"]
        self.assertEqual(len(tests), 3 + 7 + 1)
        self.assertEqual(tests[0]["name"], "ch01 puzzle 1.4 ring_all_gather: ExactResults")
        self.assertEqual(tests[2]["name"], "ch01 puzzle 1.4 ring_all_gather: Sizes/Puzzle1_4_ring_all_gather.Large/0")
        self.assertIn("tests/01_collectives/x_test.cpp:41", tests[0]["output"])
        self.assertEqual((tests[0]["extra_data"]["file"], tests[0]["extra_data"]["line"]),
                         ("tests/01_collectives/x_test.cpp", 41))

    def test_failing_checker_shows_its_whole_message(self):
        first = self.results()["tests"][0]
        self.assertEqual(first["status"], "failed")
        self.assertIn("got 16777217 = rank 1's element 0 alone", first["output"])
        self.assertIn("element 1 (chunk 0 of 2, offset 1)", first["output"])  # the whole message
        self.assertIn("./dtp grade 01 --puzzle 1.4", first["output"])

    def test_scores_add_up_per_puzzle_and_in_total(self):
        document = self.results()
        by_puzzle = {}
        for test in document["tests"]:
            self.assertLessEqual(test["score"], test["max_score"])
            puzzle = test["extra_data"]["puzzle"]
            got, worth = by_puzzle.get(puzzle, (0.0, 0.0))
            by_puzzle[puzzle] = (got + test["score"], worth + test["max_score"])
        self.assertAlmostEqual(by_puzzle["1.4"][1], 1.0, places=6)  # worth 1 ...
        self.assertEqual(by_puzzle["1.4"][0], 0.0)  # ... earned only when every checker passes
        self.assertAlmostEqual(by_puzzle["1.8"][0], 1.0, places=6)
        self.assertEqual(by_puzzle["1.9"], (0.0, 0.0))  # all skipped: not graded here
        self.assertEqual(document["score"], 1.0)
        self.assertAlmostEqual(sum(t["score"] for t in document["tests"]), document["score"], places=6)

    def test_passing_checker_of_unsolved_puzzle_says_why_no_points(self):
        second = self.results()["tests"][1]
        self.assertEqual((second["status"], second["score"]), ("passed", 0.0))
        self.assertIn("all 3 of its checkers pass (2 do)", second["output"])

    def test_skipped_checker_has_no_status(self):
        skipped = self.results()["tests"][-1]
        self.assertNotIn("status", skipped)
        self.assertTrue(skipped["name"].endswith("(skipped)"))

    def test_chapter_that_does_not_compile_loses_its_puzzles(self):
        document = self.results(not_graded=[(1, "does not compile", "x.cpp:2: error: expected")],
                                problems=["ch01 does not compile (see its table)"])
        self.assertEqual(validate_gradescope(document), [])
        broken = document["tests"][-1]
        self.assertEqual((broken["status"], broken["score"]), ("failed", 0.0))
        self.assertEqual(broken["max_score"], float(len(source_puzzles(1))))
        self.assertGreaterEqual(broken["max_score"], 10.0)  # chapter 01 has ten puzzles
        self.assertIn("x.cpp:2: error: expected", broken["output"])
        self.assertIn("ch01 does not compile", document["output"])

    def test_written_even_when_nothing_can_be_graded(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "results.json"
            err, old = io.StringIO(), sys.stderr
            sys.stderr = err
            try:
                status = grade.main(["01", "--build-dir", "/nonexistent-dtp-build",
                                     "--gradescope", str(path)])
            finally:
                sys.stderr = old
            self.assertEqual(status, 2)
            document = json.loads(path.read_text())
        self.assertEqual(validate_gradescope(document), [])
        self.assertEqual((document["score"], document["tests"]), (0.0, []))
        self.assertIn("ch01_puzzles_tests", document["output"])


class JUnit(unittest.TestCase):
    def test_file_line_and_system_out(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "junit.xml"
            write_junit(path, [(1, "puzzles", sample_puzzles())])
            root = ET.parse(path).getroot()
        cases = root.findall(".//testcase")
        self.assertEqual(len(cases), 11)
        self.assertTrue(all(c.get("file") == "tests/01_collectives/x_test.cpp" for c in cases))
        self.assertEqual(cases[0].get("line"), "41")
        self.assertIn("element 1 (chunk 0 of 2, offset 1)", cases[0].find("system-out").text)
        self.assertIsNone(cases[1].find("system-out"))  # a passing checker has nothing to say
        self.assertEqual(root.get("failures"), "1")

    def test_control_characters_do_not_break_the_xml(self):
        p = puzzle_with("\x1b[31mred\x1b[0m and a \x00 byte")
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "junit.xml"
            write_junit(path, [(1, "puzzles", [p])])
            text = ET.parse(path).getroot().find(".//system-out").text
        self.assertIn("red", text)


class Locations(unittest.TestCase):
    REPORT = {"testsuites": [{"name": "Puzzle1_4_ring_all_gather", "testsuite": [
        {"name": "ExactResults", "file": str(ROOT / "tests/01_collectives/all_gather_test.cpp"),
         "line": 77, "result": "COMPLETED", "failures": [{"failure": "boom", "type": ""}]}]}]}

    def test_apply_json_keeps_file_and_line(self):
        results = {}
        apply_json(self.REPORT, results)
        result = results[("Puzzle1_4_ring_all_gather", "ExactResults")]
        self.assertEqual((result.file, result.line, result.status),
                         ("tests/01_collectives/all_gather_test.cpp", 77, "failed"))

    def test_listing_locations(self):
        locations = {}
        read_locations(self.REPORT, locations)
        self.assertEqual(locations, {("Puzzle1_4_ring_all_gather", "ExactResults"):
                                     ("tests/01_collectives/all_gather_test.cpp", 77)})
        self.assertEqual(source_path("/elsewhere/x_test.cpp"), "/elsewhere/x_test.cpp")


BUILD_DIR = Path(os.environ.get("DTP_BUILD_DIR", ROOT / "build"))
CH01 = BUILD_DIR / "tests" / "ch01_puzzles_tests"


@unittest.skipUnless(os.access(CH01, os.X_OK), f"no {CH01} (build first)")
class RealCheckers(unittest.TestCase):
    """Grades puzzle 1.1 on the built stubs: every export names the checker's
    file and line and carries the stub's "not solved yet"."""

    def test_exports_of_a_real_run(self):
        with tempfile.TemporaryDirectory() as tmp:
            junit, results = Path(tmp) / "j.xml", Path(tmp) / "r.json"
            out, err = io.StringIO(), io.StringIO()
            old = sys.stdout, sys.stderr
            sys.stdout, sys.stderr = out, err
            try:
                status = grade.main(["--puzzle", "1.1", "--build-dir", str(BUILD_DIR),
                                     "--junit", str(junit), "--gradescope", str(results)])
            finally:
                sys.stdout, sys.stderr = old
            self.assertEqual(status, 0, err.getvalue())
            document = json.loads(results.read_text())
            cases = ET.parse(junit).getroot().findall(".//testcase")
        self.assertEqual(validate_gradescope(document), [])
        self.assertTrue(document["tests"])
        self.assertEqual(len(cases), len(document["tests"]))
        for test, case in zip(document["tests"], cases):
            self.assertTrue(case.get("file", "").startswith("tests/01_collectives/"), case.attrib)
            self.assertGreater(int(case.get("line", "0")), 0)
            self.assertIn(f'{case.get("file")}:{case.get("line")}', test["output"])
        self.assertAlmostEqual(sum(t["max_score"] for t in document["tests"]), 1.0, places=6)
        if document["score"] == 0:  # the stub: every checker fails with the news
            self.assertIn("puzzle 1.1 tree_broadcast is not solved yet", document["tests"][0]["output"])


if __name__ == "__main__":
    unittest.main()
