"""The Gradescope export (--gradescope): results.json as Gradescope's
autograder specification documents it
(https://gradescope-autograders.readthedocs.io/en/latest/specs/).

Scoring mirrors the scoreboard: a puzzle is worth 1 point and earns it only
when ALL its checkers pass. The point is shown split evenly over the puzzle's
checkers (each carries 1/n as max_score and scores it only if the whole puzzle
passes), so the per-test scores add up to the top-level score, the number of
puzzles solved."""

import json
import os
from pathlib import Path

from .messages import first_line
from .puzzles import FAILING
from .repository import source_puzzles

# Who sees the results: visible (default), hidden, after_due_date or
# after_published; $DTP_GRADESCOPE_VISIBILITY overrides it.
GRADESCOPE_VISIBILITIES = ("visible", "hidden", "after_due_date", "after_published")
GRADESCOPE_VISIBILITY = os.environ.get("DTP_GRADESCOPE_VISIBILITY", "") or "visible"


def checker_shares(puzzle):
    """Each checker's share of the puzzle's 1 point: 1/n over the n checkers that
    ran (skipped ones, e.g. GPU checkers on a machine without a GPU, get 0), the
    last one taking the rounding remainder so that the shares add up to 1."""
    graded = [t for t in puzzle.tests if t.status != "skipped"]
    shares, given = {}, 0.0
    for i, t in enumerate(graded):
        share = round(1.0 / len(graded), 6) if i < len(graded) - 1 else round(1.0 - given, 6)
        shares[id(t)] = share
        given += share
    return shares


def checker_output(chapter, puzzle, test):
    """What a student reads under one checker in Gradescope."""
    lines = []
    where = f"{test.file}:{test.line}" if test.file else ""
    passing = sum(1 for t in puzzle.tests if t.status == "passed")
    graded = sum(1 for t in puzzle.tests if t.status != "skipped")
    if test.status in FAILING:
        lines.append(f"{test.status.upper()}: "
                     + (first_line(test.messages[0]) if test.messages else "not run"))
    elif test.status == "skipped":
        lines.append("SKIPPED on the grading machine (e.g. it needs a GPU): not counted.")
    else:
        lines.append(f"passed ({test.seconds:.2f} s)")
    if puzzle.number and puzzle.verdict == "FAIL" and test.status == "passed":
        lines.append(f"This checker passes, but puzzle {puzzle.id} earns its point only when all "
                     f"{graded} of its checkers pass ({passing} do).")
    if where:
        lines.append(f"Checker: {test.suite}.{test.name} in {where}")
    if test.status in FAILING:
        lines.append("")
        lines.append("\n\n".join(test.messages) if test.messages else "not run")
        if puzzle.number:
            lines.append("")
            lines.append(f"Locally: ./dtp grade {chapter:02d} --puzzle {puzzle.id}")
    return "\n".join(lines)


def compile_failure_output(target, log_path, errors):
    """What a student reads under a chapter that does not compile."""
    return "\n".join([f"{target} does not compile; its puzzles are not graded. The compiler says:"]
                     + ["    " + line for line in errors or ["(no error line found)"]]
                     + [f"(whole build log: {log_path})"])


def checker_tests(chapter, puzzle):
    """One results.json test per checker of the puzzle. Returns (tests, points
    earned, points it is worth)."""
    shares = checker_shares(puzzle)
    solved = puzzle.verdict == "PASS"
    label = f"puzzle {puzzle.id} {puzzle.name}" if puzzle.number else puzzle.name
    canonical = f"Puzzle{chapter}_{puzzle.number}_{puzzle.name}"
    tests = []
    for t in puzzle.tests:
        check = t.name if t.suite == canonical else f"{t.suite}.{t.name}"
        share = shares.get(id(t), 0.0)
        entry = {
            "name": f"ch{chapter:02d} {label}: {check}"
                    + (" (skipped)" if t.status == "skipped" else ""),
            "score": share if solved else 0.0,
            "max_score": share,
        }
        if t.status != "skipped":  # neither passed nor failed: no status
            entry["status"] = "passed" if t.status == "passed" else "failed"
        entry.update({
            "output": checker_output(chapter, puzzle, t),
            "tags": [f"ch{chapter:02d}"] + ([f"puzzle {puzzle.id}"] if puzzle.number else []),
            "visibility": GRADESCOPE_VISIBILITY,
            "extra_data": {"suite": t.suite, "test": t.name, "file": t.file,
                           "line": t.line, "result": t.status,
                           "seconds": round(t.seconds, 3),
                           "puzzle": puzzle.id, "puzzle_solved": solved},
        })
        tests.append(entry)
    return tests, (1.0 if solved else 0.0), (1.0 if shares else 0.0)


def gradescope_results(graded, not_graded=(), problems=(), summaries=(), seconds=0.0):
    """The results.json document.

    graded: [(chapter, flavor, puzzles)] as the tables show them.
    not_graded: [(chapter, title, output)] for chapters that did not compile or
    ran no checker; each shows as one failed test worth its puzzles."""
    tests, score, total = [], 0.0, 0.0
    for chapter, flavor, puzzles in graded:
        for p in puzzles:
            puzzle_tests, earned, worth = checker_tests(chapter, p)
            tests += puzzle_tests
            score += earned
            total += worth
    for chapter, title, output in not_graded:
        worth = float(len(source_puzzles(chapter)))
        total += worth
        tests.append({
            "name": f"ch{chapter:02d}: {title}",
            "score": 0.0,
            "max_score": worth,
            "status": "failed",
            "output": output,
            "tags": [f"ch{chapter:02d}"],
            "visibility": GRADESCOPE_VISIBILITY,
        })
    head = (f"DTP scoreboard: {score:g} of {total:g} puzzles solved. A puzzle is worth 1 point, "
            f"earned only when all of its checkers pass; each checker shows its share of it.")
    text = "\n".join([head, ""] + list(summaries)
                     + [f"error: {problem}" for problem in problems])
    return {
        "score": score,
        "execution_time": int(round(seconds)),
        "output": text,
        "output_format": "text",
        "test_output_format": "text",
        "test_name_format": "text",
        "visibility": GRADESCOPE_VISIBILITY,
        "stdout_visibility": GRADESCOPE_VISIBILITY,
        "tests": tests,
    }


def write_gradescope(path, document):
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(document, indent=2, ensure_ascii=False, allow_nan=False)
    Path(path).write_text(text + "\n", encoding="utf-8")
