#!/usr/bin/env python3
"""Runs a CMake build and shows where it is instead of silence.

Usage (normally through ./dtp):
    tools/build_progress.py LOG -- cmake --build DIR [ARGS...]

The build's whole output goes to LOG. On a terminal one line updates in place
("[ 42%] ch01_puzzles_tests: puzzles/01_collectives/collectives.cpp"); when
the output is not a terminal, a plain progress line is printed every 10
percent, so a CI log or a pipe still shows the build moving. Compiler errors
are printed in full when the build fails. The exit status is the build's.

Standard library only.
"""

import os
import re
import subprocess
import sys
import time

# "[ 42%] Building CXX object runtime/CMakeFiles/dtp_runtime.dir/src/nn/gpt.cpp.o"
# "[ 43%] Linking CXX executable ../bin/dtp-train"
PROGRESS_RE = re.compile(r"^\[\s*(\d+)%\]\s+(.*)$")
OBJECT_RE = re.compile(r"^Building \w+ object (?:(.*?)/)?CMakeFiles/([^/]+)\.dir/(.*)\.o$")
LINK_RE = re.compile(r"^Linking \w+ (?:static library|executable|shared library) (.*)$")


def describe(step):
    """A short name for a CMake progress step: the target and the source."""
    m = OBJECT_RE.match(step)
    if m:
        folder, target, source = m.group(1), m.group(2), m.group(3)
        source = re.sub(r"^(__/)+", "", source)  # sources outside the target's folder
        if folder and not source.startswith(folder):
            source = f"{folder}/{source}"
        return f"{target}: {source}"
    m = LINK_RE.match(step)
    if m:
        return f"linking {os.path.basename(m.group(1))}"
    return step


def error_lines(log_text, limit=60):
    """The lines of a failed build that a reader needs: compiler errors with
    their context lines, and make's summary."""
    keep = []
    lines = log_text.splitlines()
    for i, line in enumerate(lines):
        if re.search(r"\berror\b|: fatal|undefined reference|Error \d+|CMake Error", line):
            keep.append(line)
            # The compiler's caret lines follow an error.
            for follow in lines[i + 1:i + 3]:
                if follow.startswith(" ") and follow not in keep:
                    keep.append(follow)
    # make's own "Error 2" lines only repeat that something failed; keep them
    # only when the compiler said nothing.
    compiler = [line for line in keep if not re.match(r"^g?make(\[\d+\])?: \*\*\*", line)]
    return (compiler or keep)[:limit]


def run(log_path, command, out=sys.stderr, label=""):
    """Runs `command` (a cmake --build line), logs everything to log_path and
    shows progress on `out`. Returns (exit status, the whole output)."""
    tty = out.isatty()
    width = 100
    if tty:
        try:
            width = os.get_terminal_size(out.fileno()).columns
        except OSError:
            pass
    last_percent_shown = -10
    shown = False
    chunks = []
    start = time.monotonic()
    with open(log_path, "w", encoding="utf-8", errors="replace") as log:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, text=True, errors="replace", bufsize=1)
        for line in proc.stdout:
            log.write(line)
            chunks.append(line)
            m = PROGRESS_RE.match(line.rstrip("\n"))
            if not m:
                continue
            if not (OBJECT_RE.match(m.group(2)) or LINK_RE.match(m.group(2))):
                continue  # "Built target x": nothing is being done
            percent, step = int(m.group(1)), describe(m.group(2))
            text = f"{label}[{percent:3d}%] {step}"
            if tty:
                out.write("\r" + text[: max(width - 1, 20)].ljust(max(width - 1, 20)))
                out.flush()
                shown = True
            elif percent >= last_percent_shown + 10:
                last_percent_shown = percent - percent % 10
                out.write(f"{text}  ({time.monotonic() - start:.0f} s)\n")
                out.flush()
        status = proc.wait()
    if shown:
        out.write("\r" + " " * max(width - 1, 20) + "\r")
        out.flush()
    return status, "".join(chunks)


def main(argv):
    if len(argv) < 3 or argv[1] != "--":
        print(__doc__, file=sys.stderr)
        return 2
    log_path, command = argv[0], argv[2:]
    status, text = run(log_path, command)
    if status != 0:
        lines = error_lines(text)
        print("\n".join(lines) if lines else text[-4000:], file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
