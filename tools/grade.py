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
prints every failing checker's whole message; -v does that for all puzzles.

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

Standard library only, so any python3 runs it.
"""

import argparse
import fnmatch
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
import build_progress  # noqa: E402  (tools/build_progress.py)
BINARY_RE = re.compile(r"^ch(\d+)_(puzzles|reference)_tests$")
# Suite names: Puzzle1_4_ring_all_gather, possibly with a parameterized or
# typed prefix/suffix: Sizes/Puzzle1_4_ring_all_gather, Puzzle1_4_x/0.
PUZZLE_RE = re.compile(r"(?:^|/)Puzzle(\d+)_(\d+[a-z]*)_([A-Za-z0-9_]+?)(?:/\d+)?$")
LOCATION_RE = re.compile(r"^(unknown file|.*:\d+)(: Failure)?$")
EXCEPTION_RE = re.compile(r'C\+\+ exception with description "(.*)" thrown in (the test body|[^.]*)\.',
                          re.S)
ACTUAL_FALSE_RE = re.compile(r"Actual: false \((.*)\)\s*\nExpected: true", re.S)
PUZZLE_ID_RE = re.compile(r"^(\d+)\.(\d+[a-z]*)$")
# A first failure longer than this many wrapped lines ends with a pointer to
# --puzzle, which prints it whole.
MAX_ROW_LINES = 8


@dataclass
class TestResult:
    suite: str
    name: str
    status: str = "notrun"  # passed, failed, skipped, error, notrun
    messages: list = field(default_factory=list)
    seconds: float = 0.0
    file: str = ""  # the checker's source file (from GoogleTest), relative to the repository
    line: int = 0


@dataclass
class Puzzle:
    chapter: int
    number: str  # "4", "3a", or "" for a suite that is not a puzzle
    name: str
    tests: list = field(default_factory=list)

    @property
    def id(self):
        return f"{self.chapter}.{self.number}" if self.number else "-"

    def sort_key(self):
        m = re.match(r"(\d+)(.*)", self.number)
        return (0, int(m.group(1)), m.group(2)) if m else (1, 0, self.name)

    def count(self, status):
        return sum(1 for t in self.tests if t.status == status)

    @property
    def verdict(self):
        if any(t.status in ("failed", "error", "notrun") for t in self.tests):
            return "FAIL"
        if self.tests and all(t.status == "skipped" for t in self.tests):
            return "SKIP"
        return "PASS"


NOT_SOLVED_RE = re.compile(r"(rank \d+: )?puzzle \S+ \S+ is not solved yet")


def message_body(text):
    """A gtest failure without its file:line header, and a C++ exception's
    description without gtest's wrapping."""
    lines = text.strip("\n").splitlines()
    if lines and LOCATION_RE.match(lines[0].strip()):
        lines = lines[1:]
    body = "\n".join(lines).strip()
    m = EXCEPTION_RE.search(body)
    return (m.group(1).strip(), True) if m else (body, False)


def first_line(text):
    """The line of a gtest failure message a student should read first."""
    body, was_exception = message_body(text)
    if not was_exception:
        m = ACTUAL_FALSE_RE.search(body)
        if m:
            body = m.group(1).strip()
    # An unsolved stub says so somewhere in the message: that is the news.
    m = NOT_SOLVED_RE.search(body)
    if m:
        return m.group(0)
    lines = [l.strip() for l in body.splitlines() if l.strip()]
    # FAIL() << "..." puts a bare "Failed" first; the message follows.
    if len(lines) > 1 and lines[0] == "Failed":
        lines = lines[1:]
    if not lines:
        return "(no message)"
    line = lines[0]
    # "Expected equality of these values:" says nothing alone: add what follows.
    if line.endswith(":") and len(lines) > 1:
        line = " ".join(lines)
    return re.sub(r"\s+", " ", line)


def full_message(text):
    """A gtest failure without its file:line header, for --puzzle and -v."""
    body, _ = message_body(text)
    if body.startswith("Failed\n"):
        body = body[len("Failed\n"):]
    return body or "(no message)"


def terminal_width(out):
    try:
        if out.isatty():
            return max(60, os.get_terminal_size(out.fileno()).columns)
    except (OSError, AttributeError, ValueError):
        pass
    return max(60, int(os.environ.get("COLUMNS", "120") or 120))


def signal_name(returncode):
    try:
        return signal.Signals(-returncode).name
    except (ValueError, AttributeError):
        return f"signal {-returncode}"


def source_path(path):
    """A checker's source file as GoogleTest gives it, relative to the repository
    when it lies inside it (what CI annotations and JUnit viewers expect)."""
    if not path:
        return ""
    try:
        return Path(path).resolve().relative_to(ROOT).as_posix()
    except (ValueError, OSError):
        return str(path)


def read_locations(report, locations):
    """{(suite, name): (file, line)} from a GoogleTest JSON report or test list."""
    for suite in report.get("testsuites", []):
        for test in suite.get("testsuite", []):
            if test.get("file"):
                try:
                    line = int(test.get("line", 0) or 0)
                except (TypeError, ValueError):
                    line = 0
                locations[(suite.get("name", ""), test.get("name", ""))] = \
                    (source_path(test["file"]), line)


def list_tests(binary, env, timeout, locations=None):
    """All tests of a gtest binary in order, as (suite, name) pairs. With a dict
    as `locations`, also fills it with each test's (file, line), which
    GoogleTest writes for a listing too; a test that later crashes, and so is
    missing from the run's JSON, keeps its location."""
    with tempfile.TemporaryDirectory(prefix="dtp-grade-list-") as tmp:
        json_path = Path(tmp) / "list.json"
        out = subprocess.run([str(binary), "--gtest_list_tests", f"--gtest_output=json:{json_path}"],
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, env=env, timeout=timeout, text=True,
                             errors="replace")
        if locations is not None and json_path.exists():
            try:
                read_locations(json.loads(json_path.read_text(errors="replace")), locations)
            except (json.JSONDecodeError, AttributeError):
                pass
    if out.returncode != 0:
        raise RuntimeError(f"--gtest_list_tests exited with {out.returncode}:\n{out.stdout[-2000:]}")
    tests, suite = [], None
    for raw in out.stdout.splitlines():
        line = raw.split("#", 1)[0].rstrip()
        if not line:
            continue
        if not raw.startswith(" ") and line.endswith("."):
            suite = line[:-1]
        elif raw.startswith("  ") and suite is not None:
            tests.append((suite, line.strip()))
    return tests


RUN_LINE = re.compile(r"^\[ +(RUN|OK|FAILED|SKIPPED) +\] ([^\s.]+)\.(\S+?)(?:,? where .*?)?( \(\d+ ms\))?$")


@dataclass
class Run:
    """What one run of a gtest binary left behind."""
    outcome: str  # "finished", "crashed", "exited", "test-timeout", "binary-timeout"
    returncode: object
    report: object  # the parsed JSON, or None
    stdout: str
    running: object  # (suite, name) of the test running when it was stopped


def run_gtest(binary, env, gtest_filter, test_timeout, deadline):
    """Runs the binary once, watching its console: a test that runs longer than
    test_timeout, or a run that passes the deadline, is killed."""
    with tempfile.TemporaryDirectory(prefix="dtp-grade-") as tmp:
        json_path = Path(tmp) / "result.json"
        log_path = Path(tmp) / "stdout.txt"
        args = [str(binary), f"--gtest_output=json:{json_path}", "--gtest_color=no"]
        if gtest_filter:
            args.append(f"--gtest_filter={gtest_filter}")
        running, started, pending = None, time.monotonic(), ""
        outcome = None
        with open(log_path, "wb") as log, open(log_path, "rb") as watch:
            proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, env=env, start_new_session=True)
            while True:
                try:
                    proc.wait(timeout=0.1)
                    break
                except subprocess.TimeoutExpired:
                    pass
                pending += watch.read().decode(errors="replace")
                *lines, pending = pending.split("\n")
                for line in lines:
                    m = RUN_LINE.match(line)
                    if m and m.group(1) == "RUN":
                        running, started = (m.group(2), m.group(3)), time.monotonic()
                    elif m and m.group(4) is not None:
                        running = None
                now = time.monotonic()
                if running is not None and now - started > test_timeout:
                    outcome = "test-timeout"
                elif now > deadline:
                    outcome = "binary-timeout"
                if outcome:
                    try:
                        os.killpg(proc.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    proc.wait()
                    break
        stdout = log_path.read_text(errors="replace")
        report = None
        if outcome is None and json_path.exists():
            try:
                report = json.loads(json_path.read_text(errors="replace"))
            except json.JSONDecodeError:
                report = None
        if outcome is None:
            if report is not None:
                outcome = "finished"
            elif proc.returncode < 0:
                outcome = "crashed"
            else:
                outcome = "exited"
        return Run(outcome, proc.returncode, report, stdout, running)


def apply_json(report, results):
    for suite in report.get("testsuites", []):
        for test in suite.get("testsuite", []):
            key = (suite.get("name", ""), test.get("name", ""))
            result = results.get(key)
            if result is None:
                result = results[key] = TestResult(*key)
            failures = [f.get("failure", "") for f in test.get("failures", [])]
            if test.get("file"):
                result.file = source_path(test["file"])
                try:
                    result.line = int(test.get("line", 0) or 0)
                except (TypeError, ValueError):
                    pass
            try:
                result.seconds = float(str(test.get("time", "0")).rstrip("s") or 0)
            except ValueError:
                pass
            if test.get("status") == "NOTRUN" or test.get("result") == "SUPPRESSED":
                result.status = "notrun"
                result.messages = ["disabled"]
            elif failures:
                result.status = "failed"
                result.messages = failures
            elif test.get("result") == "SKIPPED":
                result.status = "skipped"
            else:
                result.status = "passed"


def apply_stdout(stdout, results):
    """Recovers results from the console log of a run that never wrote its JSON.
    Returns the test that was running when the log stops, if any."""
    running, text = None, []
    for line in stdout.splitlines():
        m = RUN_LINE.match(line)
        if not m:
            if running is not None:
                text.append(line)
            continue
        kind, key = m.group(1), (m.group(2), m.group(3))
        if kind == "RUN":
            running, text = key, []
            continue
        if key != running or m.group(4) is None:
            continue  # the FAILED summary at the end repeats names without a time
        result = results.setdefault(key, TestResult(*key))
        if kind == "OK":
            result.status = "passed"
        elif kind == "SKIPPED":
            result.status = "skipped"
        else:
            result.status = "failed"
            blocks = re.split(r"(?m)^(?=\S.*: Failure$|unknown file: Failure$)", "\n".join(text))
            result.messages = [b for b in blocks if b.strip()] or ["failed (see the test log)"]
        running = None
    return running


def matches_filter(key, gtest_filter):
    """True when suite.name matches one of the ':'-separated gtest patterns."""
    name = f"{key[0]}.{key[1]}"
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in gtest_filter.split(":"))


def grade_binary(binary, env, timeout, test_timeout, only=None):
    """Runs one checker binary; returns ({(suite, name): TestResult}, [problems]).

    A crash or a hung test does not hide the others: the binary runs again on
    the tests that have not run yet. A hung test also skips the rest of its
    puzzle (they would most likely hang too). Everything stops at `timeout`
    seconds for the binary; tests not run by then are marked so."""
    locations = {}
    try:
        order = list_tests(binary, env, min(timeout, 60), locations)
    except (subprocess.TimeoutExpired, RuntimeError, OSError) as error:
        return {}, [f"could not list the tests of {binary.name}: {error}"]
    if only:
        order = [key for key in order if matches_filter(key, only)]
    results = {key: TestResult(*key, file=locations.get(key, ("", 0))[0],
                               line=locations.get(key, ("", 0))[1]) for key in order}
    deadline = time.monotonic() + timeout
    crashes, hangs, problems = [], [], []
    gtest_filter = only
    while True:
        run = run_gtest(binary, env, gtest_filter, test_timeout, deadline)
        if run.outcome == "finished":
            apply_json(run.report, results)
            if run.returncode not in (0, 1):
                problems.append(f"{binary.name} exited with status {run.returncode}")
            break
        culprit = apply_stdout(run.stdout, results) or run.running
        # The console output of the test that was running, for the JUnit report.
        last_run = run.stdout.rfind("[ RUN      ]")
        tail = "\n".join(run.stdout[max(last_run, 0):].splitlines()[-30:])
        if run.outcome == "crashed":
            why = f"crashed ({signal_name(run.returncode)})"
        elif run.outcome == "exited":
            why = f"exited with status {run.returncode} before writing its report"
        elif run.outcome == "test-timeout":
            why = f"timed out after {test_timeout:.0f} s"
        else:
            why = f"ran out of time ({timeout:.0f} s for the binary)"
        if culprit is not None:
            result = results.setdefault(culprit, TestResult(*culprit))
            result.status = "error"
            result.messages = [f"{why} in this test\n{tail}"]
            (hangs if "time" in run.outcome else crashes).append(f"{culprit[0]}.{culprit[1]}")
            if run.outcome == "test-timeout":
                for key in order:
                    if key[0] == culprit[0] and results[key].status == "notrun":
                        results[key].status = "error"
                        results[key].messages = [f"not run: {culprit[1]} of this puzzle hung"]
        pending = [k for k in order if results[k].status == "notrun"]
        if run.outcome == "binary-timeout" or culprit is None or time.monotonic() > deadline:
            if culprit is None and run.outcome != "binary-timeout":
                problems.append(f"{binary.name} {why} outside any test")
            if pending:
                problems.append(f"{binary.name}: {len(pending)} test(s) not run "
                                f"(the binary ran out of time or crashed outside a test)")
            for key in pending:
                results[key].status = "error"
                results[key].messages = [f"not run: {binary.name} {why}\n{tail}"]
            break
        if not pending:
            break
        gtest_filter = ":".join(f"{s}.{n}" for s, n in pending)
    for what, tests in (("crashed", crashes), ("timed out", hangs)):
        if tests:
            suites = {}
            for test in tests:
                suite = test.split(".", 1)[0]
                suites[suite] = suites.get(suite, 0) + 1
            problems.append(f"{binary.name}: tests {what} in " + ", ".join(
                f"{suite} ({count} test{'s' if count > 1 else ''})" for suite, count in suites.items()))
    return results, problems


def group_puzzles(chapter, results):
    puzzles = {}
    for result in results.values():
        m = PUZZLE_RE.search(result.suite)
        if m and int(m.group(1)) == chapter:
            key = (m.group(2), m.group(3))
        elif m:
            key = (f"{m.group(2)}", f"{m.group(3)} (chapter {m.group(1)}?)")
        else:
            key = ("", result.suite)
        puzzle = puzzles.get(key)
        if puzzle is None:
            puzzle = puzzles[key] = Puzzle(chapter, key[0], key[1])
        puzzle.tests.append(result)
    return sorted(puzzles.values(), key=Puzzle.sort_key)


def chapter_title(chapter):
    matches = sorted((ROOT / "chapters").glob(f"{chapter:02d}_*"))
    return matches[0].name if matches else f"{chapter:02d}"


def first_failure(puzzle):
    for test in puzzle.tests:
        if test.status in ("failed", "error", "notrun") and test.messages:
            return first_line(test.messages[0])
    return ""


def print_table(chapter, binary_name, puzzles, flavor, out, hint=""):
    """One row per puzzle; the first failure is wrapped under its column."""
    title = f"Chapter {chapter_title(chapter)} ({binary_name})"
    print(title, file=out)
    print("=" * len(title), file=out)
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
    summary = f"ch{chapter:02d}: {solved} of {len(puzzles)} puzzles {word}"
    return summary


def print_failures(puzzles, out):
    """Every failing checker of these puzzles with its whole message."""
    for p in puzzles:
        for t in p.tests:
            if t.status not in ("failed", "error", "notrun"):
                continue
            print(f"\n--- puzzle {p.id} {p.name}: {t.suite}.{t.name} "
                  f"({t.status.upper()}, {t.seconds:.1f} s)", file=out)
            for message in t.messages or ["not run"]:
                print(textwrap.indent(full_message(message), "    "), file=out)


def print_compile_failure(chapter, target, log_path, errors, out):
    title = f"Chapter {chapter_title(chapter)} ({target})"
    print(title, file=out)
    print("=" * len(title), file=out)
    print(f"does not compile; its puzzles are not graded. The compiler says:", file=out)
    for line in errors or ["(no error line found)"]:
        print("    " + line, file=out)
    print(f"(whole build log: {log_path})", file=out)
    return f"ch{chapter:02d}: does not compile"


def source_chapters():
    """Chapters that have checkers in tests/NN_name/."""
    chapters = []
    for folder in sorted((ROOT / "tests").glob("[0-9][0-9]_*")):
        if folder.is_dir() and any(folder.glob("*_test.cpp")):
            chapters.append(int(folder.name[:2]))
    return chapters


def build_chapter(build_dir, chapter, flavor, jobs):
    """Builds one chapter's checker binary. Returns (ok, log path, error lines)."""
    target = f"ch{chapter:02d}_{flavor}_tests"
    log_path = Path(build_dir) / f"dtp-build-{target}.log"
    command = ["cmake", "--build", str(build_dir), "--target", target, "-j", str(jobs)]
    status, text = build_progress.run(str(log_path), command, out=sys.stderr,
                                      label=f"grade: building {target} ")
    if status == 0:
        return True, log_path, []
    return False, log_path, build_progress.error_lines(text, limit=40)


XML_ILLEGAL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def xml_text(text):
    """Text XML 1.0 can hold: control characters (ANSI colours, stray bytes)
    become U+FFFD instead of making the whole report unreadable."""
    return XML_ILLEGAL.sub("\ufffd", text)


def write_junit(path, graded):
    root = ET.Element("testsuites", name="DTP puzzles")
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for chapter, flavor, puzzles in graded:
        for p in puzzles:
            name = f"ch{chapter:02d} puzzle {p.id} {p.name}" if p.number else f"ch{chapter:02d} {p.name}"
            counts = {
                "tests": len(p.tests),
                "failures": p.count("failed"),
                "errors": p.count("error") + p.count("notrun"),
                "skipped": p.count("skipped"),
            }
            suite = ET.SubElement(root, "testsuite", name=name,
                                  time=f"{sum(t.seconds for t in p.tests):.3f}",
                                  **{k: str(v) for k, v in counts.items()})
            for k in totals:
                totals[k] += counts[k]
            for t in p.tests:
                where = {"file": t.file, "line": str(t.line)} if t.file else {}
                case = ET.SubElement(suite, "testcase", classname=f"ch{chapter:02d}.{t.suite}",
                                     name=t.name, time=f"{t.seconds:.3f}", **where)
                text = xml_text("\n\n".join(t.messages))
                if t.status == "failed":
                    ET.SubElement(case, "failure", message=xml_text(first_line(t.messages[0])),
                                  type="failure").text = text
                elif t.status in ("error", "notrun"):
                    message = xml_text(first_line(t.messages[0]) if t.messages else "not run")
                    ET.SubElement(case, "error", message=message, type="error").text = text
                elif t.status == "skipped":
                    ET.SubElement(case, "skipped")
                if t.status in ("failed", "error", "notrun"):
                    # The whole message again as the test's output: GitLab and
                    # most JUnit viewers show <system-out>, some only that.
                    ET.SubElement(case, "system-out").text = text or "not run"
    for k, v in totals.items():
        root.set(k, str(v))
    tree = ET.ElementTree(root)
    ET.indent(tree)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tree.write(path, encoding="utf-8", xml_declaration=True)


# Gradescope's results.json, as its autograder specification documents it
# (https://gradescope-autograders.readthedocs.io/en/latest/specs/).
# Who sees the results: visible (default), hidden, after_due_date or
# after_published; $DTP_GRADESCOPE_VISIBILITY overrides it.
GRADESCOPE_VISIBILITIES = ("visible", "hidden", "after_due_date", "after_published")
GRADESCOPE_VISIBILITY = os.environ.get("DTP_GRADESCOPE_VISIBILITY", "") or "visible"
FAILING = ("failed", "error", "notrun")


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


def source_puzzles(chapter):
    """The puzzle suites named in tests/NN_name/ (for a chapter that does not
    compile, so that its points still show as lost)."""
    names = set()
    for folder in (ROOT / "tests").glob(f"{chapter:02d}_*"):
        for path in list(folder.glob("*.cpp")) + list(folder.glob("*.h")):
            try:
                text = path.read_text(errors="replace")
            except OSError:
                continue
            for m in re.finditer(rf"\bPuzzle{chapter}_(\d+[a-z]*)_[A-Za-z0-9_]*[A-Za-z0-9]", text):
                names.add(m.group(0))
    return sorted(names)


def gradescope_results(graded, not_graded=(), problems=(), summaries=(), seconds=0.0):
    """The results.json document.

    graded: [(chapter, flavor, puzzles)] as the tables show them.
    not_graded: [(chapter, title, output)] for chapters that did not compile or
    ran no checker; each shows as one failed test worth its puzzles."""
    tests, score, total = [], 0.0, 0.0
    for chapter, flavor, puzzles in graded:
        for p in puzzles:
            shares = checker_shares(p)
            solved = p.verdict == "PASS"
            score += 1.0 if solved else 0.0
            total += 1.0 if shares else 0.0
            label = f"puzzle {p.id} {p.name}" if p.number else p.name
            canonical = f"Puzzle{chapter}_{p.number}_{p.name}"
            for t in p.tests:
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
                    "output": checker_output(chapter, p, t),
                    "tags": [f"ch{chapter:02d}"] + ([f"puzzle {p.id}"] if p.number else []),
                    "visibility": GRADESCOPE_VISIBILITY,
                    "extra_data": {"suite": t.suite, "test": t.name, "file": t.file,
                                   "line": t.line, "result": t.status,
                                   "seconds": round(t.seconds, 3),
                                   "puzzle": p.id, "puzzle_solved": solved},
                })
                tests.append(entry)
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


def compile_failure_output(target, log_path, errors):
    return "\n".join([f"{target} does not compile; its puzzles are not graded. The compiler says:"]
                     + ["    " + line for line in errors or ["(no error line found)"]]
                     + [f"(whole build log: {log_path})"])


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


def output_problem(path):
    """Why FILE cannot be written (None when it can): tries it now, before any
    building or grading, and leaves no trace (a folder it had to create is
    removed again, an existing file is opened for appending, not truncated;
    the writers create the folder again at the end)."""
    target = Path(path)
    if target.is_dir():
        return "it is a folder"
    created = []
    try:
        missing = [folder for folder in [target.parent, *target.parent.parents]
                   if not folder.exists()]
        for folder in reversed(missing):
            try:
                folder.mkdir()
            except OSError as e:
                return f"cannot create the folder {folder} ({e.strerror or e})"
            created.append(folder)
        existed = target.exists()
        try:
            with open(target, "a", encoding="utf-8"):
                pass
        except OSError as e:
            return e.strerror or str(e)
        if not existed:
            try:
                target.unlink()
            except OSError:
                pass
        return None
    finally:
        for folder in reversed(created):
            try:
                folder.rmdir()
            except OSError:
                pass


def write_output(flag, path, writer):
    """Runs writer(); on an OSError says which file could not be written and
    returns False instead of a traceback."""
    try:
        writer()
        return True
    except OSError as e:
        print(f"grade: error: cannot write {flag} {path}: {e.strerror or e}", file=sys.stderr)
        return False


def main(argv=None):
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
                        help="only this puzzle (e.g. 1.4), with every failing checker's whole message")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="print every failing checker's whole message")
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
    args = parser.parse_args(argv)
    started = time.monotonic()

    # The exports are checked before anything is built or graded: a path that
    # cannot be written is said now, not as a traceback after the whole run.
    for flag, path in (("--junit", args.junit), ("--gradescope", args.gradescope)):
        if path:
            why = output_problem(path)
            if why:
                print(f"grade: error: cannot write {flag} {path}: {why}", file=sys.stderr)
                return 2

    def usage_error(message):
        print(f"grade: {message}", file=sys.stderr)
        if args.gradescope:
            # An autograder shows this instead of "results.json not found".
            document = gradescope_results([], seconds=time.monotonic() - started)
            document["output"] = f"Grading failed before any checker ran: {message}"
            write_output("--gradescope", args.gradescope,
                         lambda: write_gradescope(args.gradescope, document))
        return 2

    puzzle_chapter = puzzle_number = None
    if args.puzzle is not None:
        m = PUZZLE_ID_RE.match(args.puzzle.strip())
        if not m:
            return usage_error(f"--puzzle takes a puzzle id like 1.4 or 2.3, got '{args.puzzle}'")
        puzzle_chapter, puzzle_number = int(m.group(1)), m.group(2)
    wanted = None
    if args.chapter is not None:
        if not args.chapter.isdigit():
            return usage_error(f"chapter must be a number like 01 or 1, got '{args.chapter}'")
        wanted = int(args.chapter)
    if puzzle_chapter is not None:
        if wanted is not None and wanted != puzzle_chapter:
            return usage_error(f"puzzle {args.puzzle} belongs to chapter {puzzle_chapter:02d}, "
                               f"not {wanted:02d}")
        wanted = puzzle_chapter

    if args.gradescope and GRADESCOPE_VISIBILITY not in GRADESCOPE_VISIBILITIES:
        bad, args.gradescope = GRADESCOPE_VISIBILITY, None  # a results.json could not say it
        return usage_error(f"DTP_GRADESCOPE_VISIBILITY must be one of "
                           f"{', '.join(GRADESCOPE_VISIBILITIES)}, got '{bad}'")

    flavor = "reference" if args.reference else "puzzles"
    tests_dir = Path(args.build_dir) / "tests"
    problems = []

    # Build each chapter on its own: one chapter's compile error does not stop the others.
    compile_failures = {}
    if args.build:
        chapters = source_chapters()
        if wanted is not None:
            if wanted not in chapters:
                have = ", ".join(f"{c:02d}" for c in chapters) or "none"
                return usage_error(f"no checkers for chapter {wanted:02d} in tests/ (chapters: {have})")
            chapters = [wanted]
        for chapter in chapters:
            ok, log_path, errors = build_chapter(args.build_dir, chapter, flavor, args.jobs)
            if not ok:
                compile_failures[chapter] = (f"ch{chapter:02d}_{flavor}_tests", log_path, errors)

    binaries = {}
    for path in sorted(tests_dir.glob(f"ch*_{flavor}_tests")):
        m = BINARY_RE.match(path.name)
        if m and path.is_file() and os.access(path, os.X_OK) and int(m.group(1)) not in compile_failures:
            binaries[int(m.group(1))] = path
    if wanted is not None:
        if wanted not in binaries and wanted not in compile_failures:
            have = ", ".join(f"{c:02d}" for c in sorted(binaries)) or "none"
            return usage_error(f"no {tests_dir}/ch{wanted:02d}_{flavor}_tests (built chapters: {have}).")
        binaries = {c: b for c, b in binaries.items() if c == wanted}
    if not binaries and not compile_failures:
        return usage_error(f"no checker binaries ch*_{flavor}_tests in {tests_dir}; build first "
                           f"(./dtp build).")

    env = dict(os.environ)
    env.setdefault("DTP_TIMEOUT", "5")
    env["GTEST_COLOR"] = "no"
    gtest_filter = None
    if puzzle_number is not None:
        suite = f"Puzzle{puzzle_chapter}_{puzzle_number.replace('.', '_')}_*"
        gtest_filter = f"{suite}.*:*/{suite}.*"

    graded, summaries, unexpected, not_graded = [], [], [], []
    for chapter in sorted(set(binaries) | set(compile_failures)):
        print(file=sys.stdout)
        if chapter in compile_failures:
            summaries.append(print_compile_failure(chapter, *compile_failures[chapter], sys.stdout))
            problems.append(f"ch{chapter:02d} does not compile (see its table)")
            not_graded.append((chapter, "does not compile",
                               compile_failure_output(*compile_failures[chapter])))
            continue
        binary = binaries[chapter]
        print(f"grade: running {binary.name} ...", file=sys.stderr, flush=True)
        results, binary_problems = grade_binary(binary, env, args.timeout, args.test_timeout,
                                                gtest_filter)
        problems += binary_problems
        puzzles = group_puzzles(chapter, results)
        if puzzle_number is not None:
            puzzles = [p for p in puzzles if p.number == puzzle_number]
            if not puzzles:
                return usage_error(f"chapter {chapter:02d} has no puzzle {args.puzzle}")
        graded.append((chapter, flavor, puzzles))
        hint = "" if (args.verbose or puzzle_number) else \
            f"(every failing checker in full: ./dtp grade {chapter:02d} --puzzle N.k, or -v)"
        summaries.append(print_table(chapter, binary.name, puzzles, flavor, sys.stdout, hint))
        if not puzzles:
            summaries[-1] += " (no tests found)"
            if puzzle_number is None:
                not_graded.append((chapter, "no checker ran", "\n".join(
                    [f"{binary.name} ran no checker."] + binary_problems)))
        if args.verbose or puzzle_number is not None:
            print_failures(puzzles, sys.stdout)
        sys.stdout.flush()
        unexpected += [f"ch{chapter:02d} puzzle {p.id} {p.name}" for p in puzzles if p.verdict == "PASS"]

    print()
    for line in summaries:
        print(line)
    status = 0
    if args.junit:
        if write_output("--junit", args.junit, lambda: write_junit(args.junit, graded)):
            print(f"JUnit XML written to {args.junit}")
        else:
            status = 2
    if args.gradescope:
        document = gradescope_results(graded, not_graded, problems, summaries,
                                      time.monotonic() - started)
        if write_output("--gradescope", args.gradescope,
                        lambda: write_gradescope(args.gradescope, document)):
            print(f"Gradescope results written to {args.gradescope}")
        else:
            status = 2
    sys.stdout.flush()
    for problem in problems:
        print(f"grade: error: {problem}", file=sys.stderr)
        status = max(status, 1)
    if args.expect_unsolved and unexpected:
        print("grade: error: these checkers pass on their stubs (a checker must fail on a stub): "
              + ", ".join(unexpected), file=sys.stderr)
        status = max(status, 1)
    sys.stdout.flush()
    return status


if __name__ == "__main__":
    sys.exit(main())
