#!/usr/bin/env python3
"""The ./dtp driver's command-line errors: a wrong command line exits with
status 2 and a message that names what was wrong and what was expected,
before anything is configured, built or installed; runtime failures keep
exit status 1. Only commands that stop before a build are run here, and
which target train and schedule ask cmake to build (the one program that
runs, not its sibling).

As a guard, cmake, ctest, doxygen, apt-get and sudo are replaced by stubs
that leave a mark and exit 97, and the build folders point into a temporary
folder: a driver that went on to build or install fails the test at once
instead of building.

Run: python3 tools/test_dtp_driver.py (CTest runs it as tools.dtp_driver).
"""

import os
import re
import signal
import subprocess
import tempfile
import time
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DTP = ROOT / "dtp"
GUARDED = ("cmake", "ctest", "doxygen", "apt-get", "sudo")


def matplotlib_ready():
    """./dtp plots installs matplotlib (apt) when /usr/bin/python3 lacks it."""
    python = Path("/usr/bin/python3")
    return python.exists() and subprocess.run(
        [str(python), "-c", "import matplotlib"], capture_output=True).returncode == 0


class Driver(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="dtp-driver-test-")
        tmp = Path(self.tmp.name)
        bin_dir = tmp / "bin"
        bin_dir.mkdir()
        self.marker = tmp / "reached"
        for name in GUARDED:
            stub = bin_dir / name
            stub.write_text(f"#!/bin/sh\necho {name} \"$@\" >> '{self.marker}'\nexit 97\n")
            stub.chmod(0o755)
        self.env = dict(os.environ,
                        PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
                        DTP_BUILD_DIR=str(tmp / "build"), DTP_CI_BUILD_DIR=str(tmp / "build-ci"))

    def tearDown(self):
        self.tmp.cleanup()

    def dtp(self, *args):
        run = subprocess.run(["bash", str(DTP), *args], cwd=ROOT, env=self.env,
                             stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
        reached = self.marker.read_text() if self.marker.exists() else ""
        self.marker.unlink(missing_ok=True)  # each command on its own
        self.assertEqual(reached, "", f"./dtp {' '.join(args)} went on to run: {reached}")
        return run

    def assert_usage_error(self, args, *expected):
        run = self.dtp(*args)
        where = f"./dtp {' '.join(args)}: stderr {run.stderr!r}"
        self.assertEqual(run.returncode, 2, where)
        self.assertIn("dtp: error: ", run.stderr, where)
        for text in expected:
            self.assertIn(text, run.stderr, where)
        self.assertNotIn("Traceback", run.stderr, where)
        self.assertEqual(run.stdout, "", where)

    # Rows: (arguments, what stderr must say).
    USAGE_ERRORS = [
        (("test", "--ci", "x"), "test --ci takes no arguments", "got: x"),
        (("test", "--ci", "-L", "ch01"), "test --ci takes no arguments", "got: -L ch01"),
        (("docs", "html"), "docs takes no arguments", "got: html"),
        (("bench", "--bogus"), "bench: unknown option '--bogus'",
         "expected the NAME of a benchmark, or --list"),
        (("bench", "-x", "collectives"), "bench: unknown option '-x'"),
        (("plots", "--bogus"), "plots: unknown option '--bogus'",
         "expected the NAME of a plot script, or --list"),
        (("plots", "no_such_plot"), "no plots/no_such_plot.py", "./dtp plots --list"),
        (("plots", "no_such_plot.py", "--titles", "x"), "no plots/no_such_plot.py"),
    ]

    def test_usage_errors_exit_2(self):
        for row in self.USAGE_ERRORS:
            args, expected = row[0], row[1:]
            with self.subTest(args=" ".join(args)):
                self.assert_usage_error(args, *expected)

    def test_unknown_command_exits_2_with_the_usage(self):
        run = self.dtp("no-such-command")
        self.assertEqual(run.returncode, 2)
        self.assertIn('unknown command "no-such-command"', run.stderr)
        self.assertIn("Usage: ./dtp COMMAND", run.stderr)

    def test_help(self):
        for args in ((), ("help",), ("-h",), ("--help",)):
            with self.subTest(args=" ".join(args)):
                run = self.dtp(*args)
                self.assertEqual(run.returncode, 0, run.stderr)
                self.assertIn("Usage: ./dtp COMMAND", run.stdout)
                self.assertIn("no NAME or --list: list them", run.stdout)

    def built_targets(self, *args):
        """The --target each cmake --build of `./dtp ARGS` asked for. Here cmake
        configures (does nothing, exit 0) and refuses to build (exit 97), so
        the command stops after its first build."""
        (Path(self.tmp.name) / "bin" / "cmake").write_text(
            "#!/bin/sh\n"
            f"case \" $* \" in *' --build '*) echo \"$@\" >> '{self.marker}'; exit 97 ;; esac\n"
            "exit 0\n")
        run = subprocess.run(["bash", str(DTP), *args], cwd=ROOT, env=self.env,
                             stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
        builds = self.marker.read_text().splitlines() if self.marker.exists() else []
        self.marker.unlink(missing_ok=True)
        self.assertEqual(run.returncode, 1, run.stderr)  # "the build failed"
        return [b.split("--target", 1)[1].split()[0] if "--target" in b else "(all)" for b in builds]

    def test_train_and_schedule_build_only_the_program_that_runs(self):
        # ./dtp train builds bin/dtp-train, or with --impl reference only
        # bin/dtp-train-reference; the same for schedule; plan builds bin/dtp-plan.
        # Each build is one target.
        for args, target in [(("train", "--steps", "2"), "dtp-train"),
                             (("train", "--impl", "puzzles"), "dtp-train"),
                             (("train", "--impl", "reference", "--steps", "2"), "dtp-train-reference"),
                             (("train", "--impl=reference"), "dtp-train-reference"),
                             (("schedule", "--kind", "1f1b"), "dtp-schedule"),
                             (("schedule", "--impl", "reference"), "dtp-schedule-reference"),
                             (("plan", "--validate"), "dtp-plan")]:
            with self.subTest(args=" ".join(args)):
                self.assertEqual(self.built_targets(*args), [target])

    @unittest.skipUnless(matplotlib_ready(), "no matplotlib for /usr/bin/python3 (./dtp plots would install it)")
    def test_plots_lists_its_scripts(self):
        # README: "./dtp plots [NAME] [ARGS]: list the matplotlib scripts in plots/".
        for args in (("plots",), ("plots", "--list"), ("plots", "-l"), ("plots", "--help")):
            with self.subTest(args=" ".join(args)):
                run = self.dtp(*args)
                self.assertEqual(run.returncode, 0, run.stderr)
                self.assertIn("Plot scripts", run.stdout)
                self.assertIn("  zero_memory\n", run.stdout)
                self.assertNotIn("_bench_json", run.stdout)


def read_hints(path):
    """{puzzle id: (name, [level texts])} of a chapter's hints.txt, parsed by the
    format its header states: "== N.k name" starts a puzzle, each "-- K" its
    next level; lines before the first "==" are the header."""
    puzzles, current, numbers = {}, None, {}
    for line in path.read_text().splitlines():
        if re.match(r"^== \d+\.\d+( |$)", line):
            fields = line.split(maxsplit=2)
            current = fields[1]
            puzzles[current] = (fields[2] if len(fields) > 2 else "", [])
            numbers[current] = []
        elif current and re.match(r"^-- \d+\s*$", line):
            numbers[current].append(int(line.split()[1]))
            puzzles[current][1].append("")
        elif current and puzzles[current][1]:
            levels = puzzles[current][1]
            levels[-1] += line + "\n"
    return {pid: (name, [text.strip() for text in levels], numbers[pid])
            for pid, (name, levels) in puzzles.items()}


def checker_puzzles(chapter_dir):
    """{puzzle id: name} from the checkers' suites: suite Puzzle4_6_vocab_parallel_cross_entropy
    is puzzle 4.6 vocab_parallel_cross_entropy (what ./dtp grade shows)."""
    found = {}
    for source in chapter_dir.glob("*.cpp"):
        for chapter, number, name in re.findall(
                r"\bTEST(?:_P|_F)?\(\s*Puzzle(\d+)_(\d+)_(\w+?)\s*,", source.read_text()):
            found[f"{int(chapter)}.{int(number)}"] = name
    return found


class Hints(unittest.TestCase):
    """The hint files themselves: every puzzle of chapters 01-12 has 2 to 4
    levels, under the id and name the scoreboard gives it, and every lesson
    tells the student where they are."""

    CHAPTERS = sorted(p for p in (ROOT / "chapters").glob("[0-9][0-9]_*") if p.is_dir())

    def test_chapters_01_to_12_are_all_here(self):
        self.assertEqual([p.name[:2] for p in self.CHAPTERS],
                         ["01", "02", "03", "04", "05", "06", "07", "08", "09", "10", "11", "12"])

    def test_every_puzzle_has_two_to_four_levels(self):
        for chapter in self.CHAPTERS:
            with self.subTest(chapter=chapter.name):
                hints_file = chapter / "hints.txt"
                self.assertTrue(hints_file.is_file(), f"{hints_file} is missing")
                hints = read_hints(hints_file)
                expected = checker_puzzles(ROOT / "tests" / chapter.name)
                self.assertTrue(expected, f"no Puzzle suites found in tests/{chapter.name}")
                self.assertEqual({pid: name for pid, (name, _, _) in hints.items()}, expected,
                                 f"{hints_file}: puzzle ids and names against the checkers' suites")
                for pid, (_, levels, numbers) in hints.items():
                    self.assertTrue(2 <= len(levels) <= 4,
                                    f"{hints_file}: puzzle {pid} has {len(levels)} levels, expected 2 to 4")
                    self.assertEqual(numbers, list(range(1, len(levels) + 1)),
                                     f"{hints_file}: puzzle {pid}'s levels must be numbered 1, 2, ... in order")
                    for k, text in enumerate(levels, 1):
                        self.assertTrue(text, f"{hints_file}: puzzle {pid} level {k} is empty")

    def test_every_lesson_points_to_the_hints(self):
        for chapter in self.CHAPTERS:
            with self.subTest(chapter=chapter.name):
                self.assertIn("./dtp hint", (chapter / "README.md").read_text(),
                              f"{chapter.name}/README.md never says ./dtp hint")


class HintAndWatch(unittest.TestCase):
    """./dtp hint and ./dtp watch, with the same guard as Driver: nothing may
    configure, build or install. watch watches a scratch puzzles folder
    (DTP_PUZZLES_DIR) and runs a stand-in for ./dtp grade (DTP_WATCH_GRADE)."""

    setUp = Driver.setUp
    tearDown = Driver.tearDown
    dtp = Driver.dtp
    assert_usage_error = Driver.assert_usage_error

    HINTS_04 = read_hints(ROOT / "chapters" / "04_tensor_parallel" / "hints.txt")

    USAGE_ERRORS = [
        (("hint",), "hint: which puzzle?", "./dtp hint 4.6",
         "chapter 01: 1.1 1.2 1.3", "chapter 08: 8.1 8.2 8.3 8.4"),
        (("hint", "4.9"), "chapter 04 has no puzzle 4.9",
         "its puzzles are 4.1 4.2 4.3 4.4 4.5 4.6 4.7 4.8"),
        (("hint", "1.12"), "chapter 01 has no puzzle 1.12", "1.10 1.11"),
        (("hint", "42.1"), "chapter 42 has no hints", "chapter 04: 4.1"),
        (("hint", "four"), "'four' is not a puzzle number", "CHAPTER.PUZZLE"),
        (("hint", "4.6", "--level", "9"), "puzzle 4.6 has levels 1 to 4; got --level 9"),
        (("hint", "4.6", "--level", "0"), "puzzle 4.6 has levels 1 to 4"),
        (("hint", "4.6", "--level"), "--level needs a number"),
        (("hint", "4.6", "--bogus"), "unknown option '--bogus'", "--level K or --reset"),
        (("hint", "4.6", "4.7"), "one puzzle at a time"),
        (("watch",), "watch: which chapter?", "01 02 03 04 05 06 07 08 09 10"),
        (("watch", "x4"), "'x4' is not a chapter number", "01 02 03 04 05 06 07 08 09 10"),
        (("watch", "42"), "no chapter 42", "01 02 03 04 05 06 07 08 09 10"),
    ]

    def test_usage_errors_exit_2(self):
        for row in self.USAGE_ERRORS:
            args, expected = row[0], row[1:]
            with self.subTest(args=" ".join(args)):
                self.assert_usage_error(args, *expected)

    def hint(self, *args):
        run = self.dtp("hint", *args)
        self.assertEqual(run.returncode, 0, run.stderr)
        return run.stdout

    def level_shown(self, out, puzzle, levels):
        found = re.search(rf"^Puzzle {re.escape(puzzle)} \S+: hint (\d) of {levels}$", out, re.M)
        self.assertTrue(found, f"no 'Puzzle {puzzle} ...: hint K of {levels}' line in {out!r}")
        return int(found.group(1))

    def test_each_call_shows_the_next_level_then_repeats_the_last(self):
        _, levels, _ = self.HINTS_04["4.6"]
        for k in range(1, len(levels) + 1):
            out = self.hint("4.6")
            self.assertEqual(self.level_shown(out, "4.6", len(levels)), k)
            self.assertIn(levels[k - 1], out)
            self.assertNotIn("No more hints", out)
        for _ in range(2):
            out = self.hint("4.6")
            self.assertIn("No more hints for puzzle 4.6", out)
            self.assertEqual(self.level_shown(out, "4.6", len(levels)), len(levels))
            self.assertIn(levels[-1], out)

    def test_level_reset_and_puzzles_apart(self):
        _, levels, _ = self.HINTS_04["4.6"]
        self.assertEqual(self.level_shown(self.hint("4.6", "--level", "2"), "4.6", len(levels)), 2)
        self.assertEqual(self.level_shown(self.hint("4.6"), "4.6", len(levels)), 3)
        self.assertEqual(self.level_shown(self.hint("4.6", "--level=1"), "4.6", len(levels)), 1)
        self.assertEqual(self.level_shown(self.hint("4.6"), "4.6", len(levels)), 4)  # past 3, not 2
        self.assertIn("start again at level 1", self.hint("4.6", "--reset"))
        self.assertEqual(self.level_shown(self.hint("4.6"), "4.6", len(levels)), 1)
        # Each puzzle keeps its own level, 1.1 apart from 1.10, and 04.06 is 4.6.
        self.hint("1.10")
        self.assertEqual(self.level_shown(self.hint("1.1"), "1.1", 3), 1)
        self.assertEqual(self.level_shown(self.hint("1.10"), "1.10", 4), 2)
        self.assertEqual(self.level_shown(self.hint("04.06"), "4.6", len(levels)), 2)

    def test_levels_are_kept_in_the_build_folder(self):
        self.hint("2.3")
        state = Path(self.env["DTP_BUILD_DIR"]) / "dtp-hint-levels"
        self.assertEqual(state.read_text(), "2.3 1\n")
        # The default build folder, where a student's levels go, is not tracked.
        if (ROOT / ".git").exists():
            ignored = subprocess.run(["git", "check-ignore", "-q", "build/dtp-hint-levels"], cwd=ROOT)
            self.assertEqual(ignored.returncode, 0, "git does not ignore build/dtp-hint-levels")

    def test_watch_regrades_on_a_save_and_stops_on_ctrl_c(self):
        tmp = Path(self.tmp.name)
        chapter = tmp / "puzzles" / "04_tensor_parallel"
        chapter.mkdir(parents=True)
        source = chapter / "tensor_parallel.cpp"
        source.write_text("// a stub\n")
        log = tmp / "grades.log"
        grade = tmp / "grade.sh"
        grade.write_text(f"#!/bin/sh\necho \"$*\" >> '{log}'\n")
        env = dict(self.env, DTP_PUZZLES_DIR=str(tmp / "puzzles"), DTP_WATCH_GRADE=f"sh '{grade}'")
        watch = subprocess.Popen(["bash", str(DTP), "watch", "4", "--puzzle", "4.6"], cwd=ROOT, env=env,
                                 stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, start_new_session=True)

        def grades(count, within):
            deadline = time.monotonic() + within
            while time.monotonic() < deadline:
                lines = log.read_text().splitlines() if log.exists() else []
                if len(lines) >= count:
                    return lines
                time.sleep(0.05)
            return log.read_text().splitlines() if log.exists() else []

        try:
            self.assertEqual(grades(1, 5), ["04 --puzzle 4.6"], "no first grade when watch started")
            # An editor's scratch file is not a save.
            (chapter / ".tensor_parallel.cpp.swp").write_text("x")
            (chapter / "tensor_parallel.cpp~").write_text("x")
            self.assertEqual(len(grades(2, 1.6)), 1, "a scratch file triggered a grade")
            source.write_text("// a stub, saved\n")
            later = time.time() + 2  # a later time even where mtimes are coarse
            os.utime(source, (later, later))
            self.assertEqual(grades(2, 5), ["04 --puzzle 4.6"] * 2, "the save did not trigger a grade")
        finally:
            os.killpg(watch.pid, signal.SIGINT)
            try:
                out, err = watch.communicate(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(watch.pid, signal.SIGKILL)
                out, err = watch.communicate()
                self.fail(f"watch did not stop on Ctrl-C (SIGINT): {err!r}")
        self.assertEqual(watch.returncode, 0, err)
        self.assertIn("stopped watching", err)
        self.assertIn("saved: tensor_parallel.cpp", err)
        marker = Path(self.tmp.name) / "reached"
        self.assertFalse(marker.exists(), f"watch went on to run: {marker.read_text() if marker.exists() else ''}")


if __name__ == "__main__":
    unittest.main()
