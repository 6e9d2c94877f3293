#!/usr/bin/env python3
"""Runs dtp-train on every row of bad_inputs.txt and checks that each is a
clear usage error: exit status 2, quickly, with the expected text (which
names the flag) in stderr, no training, and nothing lost or left behind (the
folder's files keep their bytes, and the run creates none). Prints every
row that failed."""
import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile


def rows(table):
    for number, line in enumerate(open(table), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        expected, _, arguments = line.partition(" | ")
        yield number, expected.strip(), arguments.strip()


def snapshot(folder):
    """Every entry of the folder: a file's bytes, or None for a folder."""
    entries = {}
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        entries[name] = None if os.path.isdir(path) else open(path, "rb").read()
    return entries


def restore(folder, entries):
    """Puts the folder back as @p entries had it, so one row's damage does not fail the next."""
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        if name not in entries:
            shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
    for name, content in entries.items():
        path = os.path.join(folder, name)
        if content is None:
            os.makedirs(path, exist_ok=True)
        else:
            open(path, "wb").write(content)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--program", required=True)
    parser.add_argument("--table", required=True)
    args = parser.parse_args()
    failures = []
    count = 0
    with tempfile.TemporaryDirectory() as folder:
        open(os.path.join(folder, "three.txt"), "w").write("abc")
        open(os.path.join(folder, "empty.txt"), "w").close()
        os.mkdir(os.path.join(folder, "busy.ckpt.tmp"))  # --save busy.ckpt cannot write its temporary file
        before = snapshot(folder)
        missing = os.path.join(folder, "no-such-folder")
        env = dict(os.environ, DTP_BACKEND="thread")
        for number, expected, arguments in rows(args.table):
            count += 1
            fill = lambda text: (text.replace("{dir}", folder).replace("{missing}", missing)
                                 .replace("{dirname}", os.path.basename(folder)))
            words = [fill(a) for a in shlex.split(arguments)]
            # Leading NAME=VALUE words set the environment, as in a shell.
            row_env = dict(env)
            while words and re.match(r"^[A-Z_]+=", words[0]):
                name, _, value = words.pop(0).partition("=")
                row_env[name] = value
            argv = [args.program] + words
            want = fill(expected)
            try:
                run = subprocess.run(argv, capture_output=True, text=True, timeout=30, env=row_env,
                                     stdin=subprocess.DEVNULL)
            except subprocess.TimeoutExpired:
                failures.append(f"line {number}: `{arguments}`: expected exit 2 at once, "
                                f"got no exit within 30 s (a hang or a run)")
                continue
            problems = []
            if run.returncode != 2:
                problems.append(f"exit status {run.returncode} (expected 2)")
            if want not in run.stderr:
                problems.append(f"stderr without '{want}'")
            if "trained" in run.stdout or "step " in run.stdout:
                problems.append("it trained")
            after = snapshot(folder)
            if after != before:
                changed = sorted(set(before) ^ set(after)) + sorted(n for n in before if n in after and
                                                                    before[n] != after[n])
                problems.append(f"the folder's files changed: {', '.join(changed)} (a usage error must "
                                f"write nothing)")
                restore(folder, before)
            if problems:
                failures.append(f"line {number}: `{arguments}`: " + "; ".join(problems) +
                                f"\n    stderr: {run.stderr.strip()[:400]!r}")
    for failure in failures:
        print(failure)
    print(f"{count - len(failures)} of {count} bad command lines were clear usage errors")
    return 1 if failures or count == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
