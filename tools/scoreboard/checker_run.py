"""Running one checker binary under timeouts: a test that hangs or crashes is
recorded against that test, and the binary runs again on the tests that have
not run yet, so one bad test does not hide the others."""

import fnmatch
import json
import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from .gtest_output import RUN_LINE, apply_json, apply_stdout, parse_test_list, read_locations
from .puzzles import TestResult


def checker_environment():
    """The environment the checkers run in: a recv that waits for a message
    that never comes fails after 5 s with a report instead of hanging until
    the test timeout, and gtest writes no colour codes into the messages."""
    env = dict(os.environ)
    env.setdefault("DTP_TIMEOUT", "5")
    env["GTEST_COLOR"] = "no"
    return env


def puzzle_filter(chapter, number):
    """The gtest filter of one puzzle's suites, parameterized ones included."""
    suite = f"Puzzle{chapter}_{number.replace('.', '_')}_*"
    return f"{suite}.*:*/{suite}.*"


def matches_filter(key, gtest_filter):
    """True when suite.name matches one of the ':'-separated gtest patterns."""
    name = f"{key[0]}.{key[1]}"
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in gtest_filter.split(":"))


def signal_name(returncode):
    try:
        return signal.Signals(-returncode).name
    except (ValueError, AttributeError):
        return f"signal {-returncode}"


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
    return parse_test_list(out.stdout)


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


def why_stopped(run, test_timeout, timeout):
    """Why a run ended without its report, as the test's message says it."""
    if run.outcome == "crashed":
        return f"crashed ({signal_name(run.returncode)})"
    if run.outcome == "exited":
        return f"exited with status {run.returncode} before writing its report"
    if run.outcome == "test-timeout":
        return f"timed out after {test_timeout:.0f} s"
    return f"ran out of time ({timeout:.0f} s for the binary)"


def tests_by_suite(binary_name, what, tests):
    """One problem line for the tests that crashed or timed out, counted per suite."""
    suites = {}
    for test in tests:
        suite = test.split(".", 1)[0]
        suites[suite] = suites.get(suite, 0) + 1
    return f"{binary_name}: tests {what} in " + ", ".join(
        f"{suite} ({count} test{'s' if count > 1 else ''})" for suite, count in suites.items())


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
        why = why_stopped(run, test_timeout, timeout)
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
            problems.append(tests_by_suite(binary.name, what, tests))
    return results, problems
