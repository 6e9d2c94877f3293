"""The build folder: building one chapter's checker binary, and finding the
checker binaries that are built."""

import os
import re
import sys
from pathlib import Path

import build_progress  # tools/build_progress.py

BINARY_RE = re.compile(r"^ch(\d+)_(puzzles|reference)_tests$")


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


def built_checkers(tests_dir, flavor, leave_out=()):
    """{chapter: path} of the executable chNN_<flavor>_tests in tests_dir,
    without the chapters in leave_out (those that did not compile: an older
    binary of theirs would grade code that is no longer there)."""
    binaries = {}
    for path in sorted(Path(tests_dir).glob(f"ch*_{flavor}_tests")):
        m = BINARY_RE.match(path.name)
        if m and path.is_file() and os.access(path, os.X_OK) and int(m.group(1)) not in leave_out:
            binaries[int(m.group(1))] = path
    return binaries
