#!/usr/bin/env python3
"""The ./dtp driver's command-line errors: a wrong command line exits with
status 2 and a message that names what was wrong and what was expected,
before anything is configured, built or installed; runtime failures keep
exit status 1. Only commands that stop before a build are run here.

As a guard, cmake, ctest, doxygen, apt-get and sudo are replaced by stubs
that leave a mark and exit 97, and the build folders point into a temporary
folder: a driver that went on to build or install fails the test at once
instead of building.

Run: python3 tools/test_dtp_driver.py (CTest runs it as tools.dtp_driver).
"""

import os
import subprocess
import tempfile
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


if __name__ == "__main__":
    unittest.main()
