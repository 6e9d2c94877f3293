"""The command line of ./dtp grade (tools/grade.py): its flags, the checks of
their values, and main(). A wrong command line exits with status 2 before
anything is built or graded."""

import argparse
import math
import os
import re
import sys
import time

from .gradescope import (GRADESCOPE_VISIBILITIES, GRADESCOPE_VISIBILITY, gradescope_results,
                         write_gradescope)
from .grading import Selection, UsageError, grade
from .output_files import output_problem, write_output
from .repository import ROOT

PUZZLE_ID_RE = re.compile(r"^(\d+)\.(\d+[a-z]*)$")


def positive_seconds(text):
    """argparse type= for --timeout and --test-timeout: a finite number of
    seconds above zero (nan, inf, 0 or a negative number would make every
    test "time out" or crash the timer). argparse prefixes its message with
    "argument --flag: " and exits with status 2."""
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is None or not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expects a positive number of seconds, got {text!r}")
    return value


def positive_jobs(text):
    """argparse type= for --jobs: a whole number of at least 1."""
    try:
        value = int(text.strip(), 10)
    except ValueError:
        value = None
    if value is None or value < 1:
        raise argparse.ArgumentTypeError(
            f"expects a whole number of compile jobs, at least 1, got {text!r}")
    return value


def build_parser():
    parser = argparse.ArgumentParser(
        prog="dtp grade",
        description="Run the puzzle checkers and print which puzzles are solved.",
        epilog="Exit status: 0 when every checker binary ran (even with unsolved puzzles), "
               "1 when a chapter did not compile, a binary crashed or timed out (or, with "
               "--expect-unsolved, a puzzle passed on its stub), 2 when there was nothing to "
               "grade, the arguments were wrong or a --junit/--gradescope FILE cannot be "
               "written. Autograder setups (GitHub Actions, GitLab CI, Gradescope): "
               "docs/instructors.md.")
    parser.add_argument("chapter", nargs="?", help="only this chapter, e.g. 01 or 1")
    parser.add_argument("--puzzle", metavar="N.k",
                        help="only this puzzle (e.g. 1.4), with each distinct failure's whole message "
                             "(once, with where it occurred)")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="print each distinct failure's whole message, for every puzzle")
    parser.add_argument("--every-failure", action="store_true",
                        help="like -v, but every failure of every checker, none taken as "
                             "alike")
    parser.add_argument("--junit", metavar="FILE",
                        help="also write JUnit XML: one testsuite per puzzle, one testcase per "
                             "checker with its file and line, the whole failure in <system-out>")
    parser.add_argument("--gradescope", metavar="FILE",
                        help="also write Gradescope's results.json: one test per checker; a puzzle "
                             "is worth 1 point, earned only when all its checkers pass (shown split "
                             "evenly over them). Written even when grading fails, with the reason. "
                             "$DTP_GRADESCOPE_VISIBILITY: visible (default), hidden, after_due_date "
                             "or after_published")
    parser.add_argument("--reference", action="store_true",
                        help="grade the reference solution instead of the puzzles (instructors)")
    parser.add_argument("--build", action="store_true",
                        help="build each chapter's checkers first, one chapter at a time")
    parser.add_argument("--jobs", type=positive_jobs,
                        default=os.cpu_count() or 2, metavar="N",
                        help="parallel compile jobs with --build (default: all cores)")
    parser.add_argument("--build-dir", metavar="DIR",
                        default=os.environ.get("DTP_BUILD_DIR", str(ROOT / "build")),
                        help="build folder (default: $DTP_BUILD_DIR or build/)")
    parser.add_argument("--timeout", type=positive_seconds, default=300.0, metavar="S",
                        help="seconds one checker binary may run in all (default 300)")
    parser.add_argument("--test-timeout", type=positive_seconds, default=60.0, metavar="S",
                        help="seconds one test may run before it counts as hung (default 60)")
    parser.add_argument("--expect-unsolved", action="store_true",
                        help="CI: exit 1 if any puzzle passes (checkers must fail on stubs)")
    return parser


def selection_of(args):
    """The chapter and puzzle that args ask for; UsageError for an id that
    cannot be one, or a puzzle outside the chapter given."""
    puzzle_chapter = puzzle_number = None
    if args.puzzle is not None:
        m = PUZZLE_ID_RE.match(args.puzzle.strip())
        if not m:
            raise UsageError(f"--puzzle takes a puzzle id like 1.4 or 2.3, got '{args.puzzle}'")
        puzzle_chapter, puzzle_number = int(m.group(1)), m.group(2)
    wanted = None
    if args.chapter is not None:
        if not args.chapter.isdigit():
            raise UsageError(f"chapter must be a number like 01 or 1, got '{args.chapter}'")
        wanted = int(args.chapter)
    if puzzle_chapter is not None:
        if wanted is not None and wanted != puzzle_chapter:
            raise UsageError(f"puzzle {args.puzzle} belongs to chapter {puzzle_chapter:02d}, "
                             f"not {wanted:02d}")
        wanted = puzzle_chapter
    return Selection(chapter=wanted, puzzle=args.puzzle, puzzle_number=puzzle_number,
                     flavor="reference" if args.reference else "puzzles")


def check_visibility(args):
    if args.gradescope and GRADESCOPE_VISIBILITY not in GRADESCOPE_VISIBILITIES:
        # No results.json: every visibility field in it would carry the bad value.
        raise UsageError(f"DTP_GRADESCOPE_VISIBILITY must be one of "
                         f"{', '.join(GRADESCOPE_VISIBILITIES)}, got '{GRADESCOPE_VISIBILITY}'",
                         fits_results_json=False)


def refuse(args, error, started):
    """Says why nothing (more) is graded, also in the --gradescope file; exit status 2."""
    print(f"grade: {error}", file=sys.stderr)
    if args.gradescope and error.fits_results_json:
        document = gradescope_results([], seconds=time.monotonic() - started)
        document["output"] = f"Grading failed before any checker ran: {error}"
        write_output("--gradescope", args.gradescope,
                     lambda: write_gradescope(args.gradescope, document))
    return 2


def main(argv=None):
    args = build_parser().parse_args(argv)
    started = time.monotonic()

    # The exports are checked before anything is built or graded: a path that
    # cannot be written is said now, not as a traceback after the whole run.
    for flag, path in (("--junit", args.junit), ("--gradescope", args.gradescope)):
        if path:
            why = output_problem(path)
            if why:
                print(f"grade: error: cannot write {flag} {path}: {why}", file=sys.stderr)
                return 2

    try:
        selection = selection_of(args)
        check_visibility(args)
        return grade(args, selection, started)
    except UsageError as error:
        return refuse(args, error, started)
