"""One grading run: builds the chapters asked for (--build), runs each
chapter's checkers, prints a table per chapter and the summaries, writes the
--junit and --gradescope files and decides the exit status."""

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .building import build_chapter, built_checkers
from .checker_run import checker_environment, grade_binary, puzzle_filter
from .gradescope import compile_failure_output, gradescope_results, write_gradescope
from .junit import write_junit
from .output_files import write_output
from .puzzles import group_puzzles
from .repository import source_chapters
from .table import print_compile_failure, print_failures, print_table


class UsageError(Exception):
    """What was asked cannot be graded: exit status 2. The reason also goes into
    the --gradescope file (an autograder shows it instead of "results.json not
    found"), unless that file could not hold it."""

    def __init__(self, message, fits_results_json=True):
        super().__init__(message)
        self.fits_results_json = fits_results_json


@dataclass
class Selection:
    """What the command line asks to grade."""
    chapter: object = None  # int, or None for every chapter
    puzzle: object = None  # the --puzzle id as given ("1.4"), or None
    puzzle_number: object = None  # its number within the chapter ("4"), or None
    flavor: str = "puzzles"  # or "reference": which solution the checkers are built with

    @property
    def gtest_filter(self):
        if self.puzzle_number is None:
            return None
        return puzzle_filter(self.chapter, self.puzzle_number)


@dataclass
class Scoreboard:
    """What the chapters graded so far leave for the summaries and the exports."""
    graded: list = field(default_factory=list)  # [(chapter, flavor, puzzles)]
    not_graded: list = field(default_factory=list)  # [(chapter, title, output)]
    summaries: list = field(default_factory=list)  # one line per chapter
    problems: list = field(default_factory=list)  # each makes the exit status 1
    unexpected: list = field(default_factory=list)  # puzzles that pass, for --expect-unsolved


def build_chapters(args, selection):
    """Builds each chapter on its own: one chapter's compile error does not stop
    the others. Returns {chapter: (target, log path, error lines)} of the
    chapters that do not compile."""
    chapters = source_chapters()
    if selection.chapter is not None:
        if selection.chapter not in chapters:
            have = ", ".join(f"{c:02d}" for c in chapters) or "none"
            raise UsageError(f"no checkers for chapter {selection.chapter:02d} in tests/ "
                             f"(chapters: {have})")
        chapters = [selection.chapter]
    compile_failures = {}
    for chapter in chapters:
        ok, log_path, errors = build_chapter(args.build_dir, chapter, selection.flavor, args.jobs)
        if not ok:
            compile_failures[chapter] = (f"ch{chapter:02d}_{selection.flavor}_tests", log_path, errors)
    return compile_failures


def checkers_to_run(tests_dir, selection, compile_failures):
    """{chapter: binary} of the built checkers asked for."""
    wanted, flavor = selection.chapter, selection.flavor
    binaries = built_checkers(tests_dir, flavor, leave_out=compile_failures)
    if wanted is not None:
        if wanted not in binaries and wanted not in compile_failures:
            have = ", ".join(f"{c:02d}" for c in sorted(binaries)) or "none"
            raise UsageError(f"no {tests_dir}/ch{wanted:02d}_{flavor}_tests (built chapters: {have}).")
        binaries = {c: b for c, b in binaries.items() if c == wanted}
    if not binaries and not compile_failures:
        raise UsageError(f"no checker binaries ch*_{flavor}_tests in {tests_dir}; build first "
                         f"(./dtp build).")
    return binaries


def record_compile_failure(board, chapter, failure):
    board.summaries.append(print_compile_failure(chapter, *failure, sys.stdout))
    board.problems.append(f"ch{chapter:02d} does not compile (see its table)")
    board.not_graded.append((chapter, "does not compile", compile_failure_output(*failure)))


def grade_chapter(board, chapter, binary, args, selection, env):
    """Runs one chapter's checkers and prints its table."""
    print(f"grade: running {binary.name} ...", file=sys.stderr, flush=True)
    results, binary_problems = grade_binary(binary, env, args.timeout, args.test_timeout,
                                            selection.gtest_filter)
    board.problems += binary_problems
    puzzles = group_puzzles(chapter, results)
    if selection.puzzle_number is not None:
        puzzles = [p for p in puzzles if p.number == selection.puzzle_number]
        if not puzzles:
            raise UsageError(f"chapter {chapter:02d} has no puzzle {selection.puzzle}")
    board.graded.append((chapter, selection.flavor, puzzles))
    whole_messages = args.verbose or args.every_failure or selection.puzzle_number is not None
    hint = "" if whole_messages else \
        f"(each distinct failure in full: ./dtp grade {chapter:02d} --puzzle N.k, or -v)"
    summary = print_table(chapter, binary.name, puzzles, selection.flavor, sys.stdout, hint)
    if not puzzles:
        summary += " (no tests found)"
        if selection.puzzle_number is None:
            board.not_graded.append((chapter, "no checker ran", "\n".join(
                [f"{binary.name} ran no checker."] + binary_problems)))
    board.summaries.append(summary)
    if whole_messages:
        print_failures(puzzles, sys.stdout, every=args.every_failure)
    sys.stdout.flush()
    board.unexpected += [f"ch{chapter:02d} puzzle {p.id} {p.name}"
                         for p in puzzles if p.verdict == "PASS"]


def write_exports(args, board, started):
    """Writes the --junit and --gradescope files; returns 2 when one could not
    be written, else 0."""
    status = 0
    if args.junit:
        if write_output("--junit", args.junit, lambda: write_junit(args.junit, board.graded)):
            print(f"JUnit XML written to {args.junit}")
        else:
            status = 2
    if args.gradescope:
        document = gradescope_results(board.graded, board.not_graded, board.problems,
                                      board.summaries, time.monotonic() - started)
        if write_output("--gradescope", args.gradescope,
                        lambda: write_gradescope(args.gradescope, document)):
            print(f"Gradescope results written to {args.gradescope}")
        else:
            status = 2
    return status


def grade(args, selection, started):
    """Grades what selection asks for; returns the exit status. Raises
    UsageError when there is nothing to grade."""
    tests_dir = Path(args.build_dir) / "tests"
    compile_failures = build_chapters(args, selection) if args.build else {}
    binaries = checkers_to_run(tests_dir, selection, compile_failures)
    env = checker_environment()
    board = Scoreboard()
    for chapter in sorted(set(binaries) | set(compile_failures)):
        print(file=sys.stdout)
        if chapter in compile_failures:
            record_compile_failure(board, chapter, compile_failures[chapter])
        else:
            grade_chapter(board, chapter, binaries[chapter], args, selection, env)

    print()
    for line in board.summaries:
        print(line)
    status = write_exports(args, board, started)
    sys.stdout.flush()
    for problem in board.problems:
        print(f"grade: error: {problem}", file=sys.stderr)
        status = max(status, 1)
    if args.expect_unsolved and board.unexpected:
        print("grade: error: these checkers pass on their stubs (a checker must fail on a stub): "
              + ", ".join(board.unexpected), file=sys.stderr)
        status = max(status, 1)
    sys.stdout.flush()
    return status
