"""The scoreboard text: one table per chapter with a row per puzzle, its first
failure wrapped under its column (never cut), and each distinct failure's
whole message, once, for --puzzle and -v."""

import os
import textwrap

from .alike import group_alike
from .messages import first_line, full_message
from .puzzles import FAILING
from .repository import chapter_title

# A first failure longer than this many wrapped lines ends with a pointer to
# --puzzle, which prints it whole.
MAX_ROW_LINES = 8


def terminal_width(out):
    try:
        if out.isatty():
            return max(60, os.get_terminal_size(out.fileno()).columns)
    except (OSError, AttributeError, ValueError):
        pass
    return max(60, int(os.environ.get("COLUMNS", "120") or 120))


def first_failure(puzzle):
    for test in puzzle.tests:
        if test.status in FAILING and test.messages:
            return first_line(test.messages[0])
    return ""


def print_title(chapter, binary_name, out):
    title = f"Chapter {chapter_title(chapter)} ({binary_name})"
    print(title, file=out)
    print("=" * len(title), file=out)


def print_table(chapter, binary_name, puzzles, flavor, out, hint=""):
    """One row per puzzle; the first failure is wrapped under its column.
    Returns the chapter's one-line summary."""
    print_title(chapter, binary_name, out)
    width = max([len("name")] + [len(p.name) for p in puzzles])
    rows = []
    for p in puzzles:
        tests = f"{p.count('passed')}/{len(p.tests) - p.count('skipped')}"
        if p.count("skipped"):
            tests += f" ({p.count('skipped')} skipped)"
        rows.append((p, tests))
    tests_width = max([len("tests")] + [len(t) for _, t in rows])
    indent = 7 + 1 + width + 2 + 6 + 2 + tests_width + 2
    text_width = max(40, terminal_width(out) - indent)
    print(f"{'puzzle':<7} {'name':<{width}}  {'result':<6}  {'tests':<{tests_width}}  first failure",
          file=out)
    for p, tests in rows:
        lines = textwrap.wrap(first_failure(p), text_width, break_on_hyphens=False) or [""]
        if len(lines) > MAX_ROW_LINES:
            lines = lines[:MAX_ROW_LINES - 1] + [
                f"... (the whole message: ./dtp grade {chapter:02d} --puzzle {p.id})"]
        print(f"{p.id:<7} {p.name:<{width}}  {p.verdict:<6}  {tests:<{tests_width}}  "
              f"{lines[0]}".rstrip(), file=out)
        for line in lines[1:]:
            print(" " * indent + line, file=out)
    if hint and any(p.verdict == "FAIL" for p in puzzles):
        print(hint, file=out)
    solved = sum(1 for p in puzzles if p.verdict == "PASS")
    word = "solved" if flavor == "puzzles" else "pass (reference)"
    return f"ch{chapter:02d}: {solved} of {len(puzzles)} puzzles {word}"


def print_failures(puzzles, out, every=False):
    """Each distinct failure of these puzzles' failing checkers, whole, once:
    the checkers it occurred in, and where when it occurred more than once
    ("12 times alike: on N=2, 3, 4; ranks 0-3"). `every`: each failure of
    each checker instead, as it came."""
    for p in puzzles:
        failing = [t for t in p.tests if t.status in FAILING]
        if every:
            for t in failing:
                print(f"\n--- puzzle {p.id} {p.name}: {t.suite}.{t.name} "
                      f"({t.status.upper()}, {t.seconds:.1f} s)", file=out)
                for message in t.messages or ["not run"]:
                    print(textwrap.indent(full_message(message), "    "), file=out)
            continue
        for alike in group_alike(failing):
            checkers = [f"{t.suite}.{t.name} ({t.status.upper()}, {t.seconds:.1f} s)"
                        for t in alike.checkers]
            print(f"\n--- puzzle {p.id} {p.name}: {checkers[0]}", file=out)
            for checker in checkers[1:]:
                print(f"    and {checker}", file=out)
            if alike.summary():
                print(f"    {alike.summary()}", file=out)
            print(textwrap.indent(alike.message, "    "), file=out)


def print_compile_failure(chapter, target, log_path, errors, out):
    """A chapter that does not compile, in place of its table. Returns its summary."""
    print_title(chapter, target, out)
    print("does not compile; its puzzles are not graded. The compiler says:", file=out)
    for line in errors or ["(no error line found)"]:
        print("    " + line, file=out)
    print(f"(whole build log: {log_path})", file=out)
    return f"ch{chapter:02d}: does not compile"
