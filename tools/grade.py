#!/usr/bin/env python3
"""The DTP scoreboard: runs the puzzle checkers and says which puzzles are solved.

Usage (normally through ./dtp grade):
    tools/grade.py [CHAPTER] [--puzzle N.k] [-v] [--junit FILE] [--gradescope FILE]
                   [--reference] [--build] [--build-dir DIR] [--expect-unsolved]

With --build it first builds each chapter's checkers on its own (a chapter
whose puzzles do not compile shows its compiler errors; the other chapters are
still graded). It runs build/tests/chNN_puzzles_tests (or chNN_reference_tests
with --reference) under a timeout with GoogleTest's JSON output, groups the
tests by suite into puzzles (suite Puzzle1_4_ring_all_gather is puzzle 1.4
ring_all_gather) and prints one table per chapter with the first failure of
every unsolved puzzle, wrapped, never cut. --puzzle N.k grades one puzzle and
prints each distinct failure's whole message once, with the checkers, world
sizes and ranks it occurred on; -v does that for all puzzles.

For autograders: --junit FILE writes JUnit XML (one testsuite per puzzle, one
testcase per checker with its source file and line, the whole failure message
in <failure> and <system-out>); --gradescope FILE writes Gradescope's
results.json (one test per checker). Gradescope scoring mirrors the scoreboard:
a puzzle is worth 1 point and earns it only when ALL its checkers pass; the
point is shown split evenly over the puzzle's checkers (each carries 1/n as
max_score and scores it only if the whole puzzle passes), so the per-test
scores add up to the top-level score, the number of puzzles solved.

Exit status: 0 when every binary ran to the end (even if puzzles fail: this is
a report), 1 when a chapter did not compile, a binary crashed or timed out
(or, with --expect-unsolved, a puzzle passed on its stub), 2 when there was
nothing to grade, the arguments were wrong or a --junit/--gradescope FILE
cannot be written (checked before anything is built or graded).

The code lives in tools/scoreboard/ (its __init__.py names each module).
Standard library only, so any python3 runs it.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scoreboard.cli import main  # noqa: E402  (tools/scoreboard/)

if __name__ == "__main__":
    sys.exit(main())
