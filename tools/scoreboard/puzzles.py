"""A checker's result, a puzzle's verdict, and the grouping of GoogleTest
suites into puzzles (suite Puzzle1_4_ring_all_gather is puzzle 1.4
ring_all_gather)."""

import re
from dataclasses import dataclass, field

# Suite names: Puzzle1_4_ring_all_gather, possibly with a parameterized or
# typed prefix/suffix: Sizes/Puzzle1_4_ring_all_gather, Puzzle1_4_x/0.
PUZZLE_RE = re.compile(r"(?:^|/)Puzzle(\d+)_(\d+[a-z]*)_([A-Za-z0-9_]+?)(?:/\d+)?$")
# The statuses that keep a puzzle from being solved.
FAILING = ("failed", "error", "notrun")


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
        if any(t.status in FAILING for t in self.tests):
            return "FAIL"
        if self.tests and all(t.status == "skipped" for t in self.tests):
            return "SKIP"
        return "PASS"


def group_puzzles(chapter, results):
    """The puzzles of one chapter's {(suite, name): TestResult}, in puzzle
    order; a suite of another chapter or no puzzle at all still gets a row."""
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
