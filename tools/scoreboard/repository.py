"""What the source tree says: the chapters that have checkers, their titles,
the puzzle suites they name, and checker paths relative to the repository."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def source_path(path):
    """A checker's source file as GoogleTest gives it, relative to the repository
    when it lies inside it (what CI annotations and JUnit viewers expect)."""
    if not path:
        return ""
    try:
        return Path(path).resolve().relative_to(ROOT).as_posix()
    except (ValueError, OSError):
        return str(path)


def chapter_title(chapter):
    matches = sorted((ROOT / "chapters").glob(f"{chapter:02d}_*"))
    return matches[0].name if matches else f"{chapter:02d}"


def source_chapters():
    """Chapters that have checkers in tests/NN_name/."""
    chapters = []
    for folder in sorted((ROOT / "tests").glob("[0-9][0-9]_*")):
        if folder.is_dir() and any(folder.glob("*_test.cpp")):
            chapters.append(int(folder.name[:2]))
    return chapters


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
