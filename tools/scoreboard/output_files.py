"""The --junit and --gradescope files: whether they can be written, checked
before anything is built or graded, and writing them without a traceback."""

import sys
from pathlib import Path


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
