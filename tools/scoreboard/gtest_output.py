"""Reading what a GoogleTest binary writes: its test listing, its JSON report
and, for a run that never wrote the report, its console log."""

import re

from .puzzles import TestResult
from .repository import source_path

RUN_LINE = re.compile(r"^\[ +(RUN|OK|FAILED|SKIPPED) +\] ([^\s.]+)\.(\S+?)(?:,? where .*?)?( \(\d+ ms\))?$")


def parse_test_list(listing):
    """The (suite, name) pairs of --gtest_list_tests output, in order."""
    tests, suite = [], None
    for raw in listing.splitlines():
        line = raw.split("#", 1)[0].rstrip()
        if not line:
            continue
        if not raw.startswith(" ") and line.endswith("."):
            suite = line[:-1]
        elif raw.startswith("  ") and suite is not None:
            tests.append((suite, line.strip()))
    return tests


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


def apply_json(report, results):
    """Fills {(suite, name): TestResult} from a GoogleTest JSON report."""
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
