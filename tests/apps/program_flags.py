#!/usr/bin/env python3
"""Every DTP program parses its command line the same way (issue 10).

For every executable named dtp-* in the build's bin/ folder (the argument):
  PROGRAM --help          exits 0 within 5 s and prints "Usage" on stdout;
  PROGRAM --no-such-flag  exits 2 within 5 s and names '--no-such-flag' on stderr;
  PROGRAM stray           exits 2 within 5 s and names 'stray' on stderr.
Each runs in an empty temporary folder with no standard input, so a program
that starts working instead of stopping cannot read or write anything that
matters. Every failure names the program, the command line and what it did.

Run: python3 tests/apps/program_flags.py build/bin
"""
import os
import signal
import subprocess
import sys
import tempfile

TIME_LIMIT_S = 5.0

# (arguments, exit status, stream that must hold the text, text)
CHECKS = [
    (["--help"], 0, "stdout", "Usage"),
    (["--no-such-flag"], 2, "stderr", "--no-such-flag"),
    (["stray"], 2, "stderr", "stray"),
]


def programs_in(folder):
    found = []
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if name.startswith("dtp-") and os.path.isfile(path) and os.access(path, os.X_OK):
            found.append(path)
    return found


def tail(text, lines=6):
    text = text.rstrip()
    if not text:
        return "(nothing)"
    kept = text.splitlines()[-lines:]
    return "\n      ".join(kept)


def check(program, args, status, stream, text, workdir):
    """Returns a failure message, or None."""
    name = os.path.basename(program)
    command = " ".join([name] + args)
    try:
        # A session of its own, so that a timeout ends whatever it started too.
        child = subprocess.Popen([program] + args, cwd=workdir, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, errors="replace", start_new_session=True)
    except OSError as e:
        return f"{name}: `{command}` could not start: {e}"
    try:
        stdout, stderr = child.communicate(timeout=TIME_LIMIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        stdout, _ = child.communicate()
        return (f"{name}: `{command}` did not return within {TIME_LIMIT_S:g} s (killed); it must stop at once.\n"
                f"    stdout: {tail(stdout)}")
    run = subprocess.CompletedProcess(child.args, child.returncode, stdout, stderr)
    problems = []
    if run.returncode != status:
        how = f"was killed by signal {-run.returncode}" if run.returncode < 0 else f"exited {run.returncode}"
        problems.append(f"{how}, expected exit {status}")
    captured = run.stdout if stream == "stdout" else run.stderr
    if text not in captured:
        problems.append(f"did not print {text!r} on {stream}")
    if not problems:
        return None
    return (f"{name}: `{command}` {' and '.join(problems)}.\n"
            f"    stdout: {tail(run.stdout)}\n"
            f"    stderr: {tail(run.stderr)}")


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: program_flags.py BIN_FOLDER (the build's bin/, holding the dtp-* programs)")
    folder = sys.argv[1]
    if not os.path.isdir(folder):
        sys.exit(f"program_flags.py: no folder {folder}")
    programs = programs_in(folder)
    if not programs:
        sys.exit(f"program_flags.py: no dtp-* programs in {folder}: build them first")
    failures = []
    for program in programs:
        name = os.path.basename(program)
        failed = False
        with tempfile.TemporaryDirectory(prefix="dtp-program-flags-") as workdir:
            for args, status, stream, text in CHECKS:
                message = check(program, args, status, stream, text, workdir)
                if message:
                    failures.append(message)
                    failed = True
            left = sorted(os.listdir(workdir))
            if left:
                failures.append(f"{name}: wrote {', '.join(left)} into its working folder when it was only to "
                                f"parse its command line ({', '.join(' '.join(c[0]) for c in CHECKS)})")
                failed = True
        print(f"{'FAIL' if failed else 'ok  '} {name}")
    if failures:
        print(f"\n{len(failures)} problem(s) in {len(programs)} programs of {folder}:", file=sys.stderr)
        for message in failures:
            print(message, file=sys.stderr)
        return 1
    print(f"{len(programs)} programs: --help, an unknown flag and a stray argument handled as they should be")
    return 0


if __name__ == "__main__":
    sys.exit(main())
