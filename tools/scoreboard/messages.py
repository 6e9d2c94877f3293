"""The part of a GoogleTest failure message a student should read: the first
line for the table, the whole message without its file:line header for
--puzzle and -v."""

import re

LOCATION_RE = re.compile(r"^(unknown file|.*:\d+)(: Failure)?$")
EXCEPTION_RE = re.compile(r'C\+\+ exception with description "(.*)" thrown in (the test body|[^.]*)\.',
                          re.S)
ACTUAL_FALSE_RE = re.compile(r"Actual: false \((.*)\)\s*\nExpected: true", re.S)
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
