#!/usr/bin/env python3
"""Every DTP program parses its command line the same way.

For every executable named dtp-* in the build's bin/ folder (the argument):
  PROGRAM --help          exits 0 within 5 s and prints "Usage" on stdout;
  PROGRAM --no-such-flag  exits 2 within 5 s and names '--no-such-flag' on stderr;
  PROGRAM stray           exits 2 within 5 s and names 'stray' on stderr.
Each runs in an empty temporary folder with no standard input, so a program
that starts working instead of stopping cannot read or write anything that
matters. Every failure names the program, the command line and what it did.

Then the bad inputs of BAD_INPUTS below: each must exit with its status at
once, say the expected text on stderr, and leave the folder empty. The
programs share dtp::cli (apps/cli/dtp_cli.h), so a row for one program
stands for the same flag kind in all of them.

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


# (program, arguments, environment, exit status, text on stderr)
SCHEDULE = ["--kind", "zb-h1", "--stages", "2", "--microbatches", "2"]
BAD_INPUTS = [
    # Numbers are decimal, whole and finite (CLI11 alone takes 0x4, ' 4' and nan).
    ("dtp-schedule-reference", ["--kind", "1f1b", "--stages", "4abc", "--microbatches", "2"], {}, 2,
     "--stages: expects an integer in [1, 64], got '4abc'"),
    ("dtp-schedule-reference", ["--kind", "1f1b", "--stages", "0x4", "--microbatches", "2"], {}, 2,
     "--stages: expects an integer in [1, 64], got '0x4'"),
    ("dtp-schedule-reference", ["--kind", "1f1b", "--stages", " 4", "--microbatches", "2"], {}, 2,
     "--stages: expects an integer in [1, 64], got ' 4'"),
    ("dtp-bench-collectives", ["--alpha-us", "nan"], {}, 2, "--alpha-us: expects a number in [0, 1000000], got 'nan'"),
    ("dtp-bench-collectives", ["-f", "nan"], {}, 2, "expects a number in [1, 1024], got 'nan'"),
    ("dtp-bench-collectives", ["-b", "1.5"], {}, 2, "a size is a whole number of bytes"),
    ("dtp-bench-collectives", ["-g", "2", "-r", "5"], {}, 2, "-r 5 is outside the world of -g 2 ranks"),
    ("dtp-bench-collectives", ["-b", "0x10"], {}, 2, "-b: unknown size suffix in '0x10'"),
    ("dtp-bench-tp-step", ["--nvlink", "0x3,450"], {}, 2, "takes ALPHA_US,GBPS"),
    ("dtp-bench-lora-finetune", ["--lora-lr", "inf"], {}, 2, "--lora-lr: expects a number in"),
    ("dtp-bench-train-step", ["--device", "cpu", "--peak-tflops", "nan"], {}, 2, "--peak-tflops: expects a number"),
    ("dtp-bench-lora-finetune", ["--ranks", "2", "--ranks", "4"], {}, 2, "--ranks was given more than once"),
    ("dtp-bench-lora-finetune", ["--ranks", "2,,4"], {}, 2, "--ranks: expects a comma list without empty items"),
    ("dtp-bench-zero-memory", ["--worlds=1,"], {}, 2, "--worlds: expects a comma list without empty items"),
    # A flag given twice; heads that do not divide the width, said before any work.
    ("dtp-schedule-reference", SCHEDULE + ["--stages", "3"], {}, 2, "--stages was given more than once"),
    ("dtp-export-step", ["--out", "e.json", "--d-model", "10", "--heads", "3"], {}, 2,
     "--d-model 10 must divide by --heads 3"),
    ("dtp-bench-train-step", ["--device", "cpu", "--d-model", "10", "--heads", "3"], {}, 2,
     "--d-model 10 must divide by --heads 3"),
    # Settings that would measure nothing of what was asked.
    ("dtp-bench-pp-step", ["--microbatches", "2", "--gantt-m", "3"], {}, 2, "--gantt-m 3 is not one of --microbatches"),
    ("dtp-bench-mixed-precision", ["--steps", "2", "--histogram-steps", "5"], {}, 2,
     "--histogram-steps 5 is past --steps 2"),
    ("dtp-bench-sequence-expert", ["--only", "moe", "--moe-experts", "2", "--moe-top-k", "3"], {}, 2,
     "every --moe-top-k is above every --moe-experts"),
    ("dtp-bench-tp-step", ["--tps", "3", "--heads", "2", "--json", "x.jsonl"], {}, 2, "--tps 3:"),
    # Pipeline costs are bounded (an unbounded chart took gigabytes and hung).
    ("dtp-schedule-reference", SCHEDULE + ["--costs", "0.001,1e9,1e-9"], {}, 2, "--costs: expects F,B,W"),
    ("dtp-schedule-reference", SCHEDULE + ["--costs", "1,inf,1"], {}, 2, "--costs: expects F,B,W"),
    ("dtp-schedule-reference", SCHEDULE + ["--costs", "1,50,0.1"], {}, 2, "at most 100 times the smallest"),
    ("dtp-schedule-reference", SCHEDULE + ["--impl", "puzzles"], {}, 2, "this program draws the reference"),
    ("dtp-schedule-reference", SCHEDULE + ["--chunks", "4"], {}, 2, "--chunks sets v of --kind interleaved"),
    # Files: not a checkpoint, outputs that cannot be written (said before the work, or as an error after it).
    ("dtp-checkpoint", ["/dev/null"], {}, 1, "/dev/null is not a regular file"),
    ("dtp-export-step", ["--out", "/dev/full", "--layers", "1", "--d-model", "8", "--heads", "2", "--vocab", "8",
                         "--context", "4", "--batch", "1", "--seq", "4"], {}, 1, "writing '/dev/full' failed"),
    ("dtp-export-step", ["--out", "no/such/folder/e.json"], {}, 2, "cannot write --out 'no/such/folder/e.json'"),
    ("dtp-bench-ddp-step", ["--json", "no/such/folder/x.jsonl"], {}, 2, "cannot append to --json"),
    ("dtp-bench-collectives", ["-g", "2", "-b", "1K", "-e", "1K", "-n", "1", "-w", "0", "--json", "/dev/full"], {}, 1,
     "cannot write the --json file /dev/full"),
    ("dtp-bench-train-step", ["--device", "cpu", "--json", "no/such/folder/x.jsonl"], {}, 2,
     "cannot append to --json"),
    # The environment the runtime reads: an error, not an abort.
    ("dtp-bench-ddp-step", [], {"DTP_BACKEND": "foo"}, 2, "dtp-bench-ddp-step: error: unknown backend 'foo'"),
    ("dtp-bench-ddp-step", [], {"DTP_TIMEOUT": "abc"}, 2, "dtp-bench-ddp-step: error:"),
    ("dtp-bench-pp-step", [], {"DTP_BACKEND": "foo"}, 2, "dtp-bench-pp-step: error: unknown backend 'foo'"),
    ("dtp-bench-tp-step", [], {"DTP_BACKEND": "foo"}, 2, "dtp-bench-tp-step: error: unknown backend 'foo'"),
    ("dtp-bench-sequence-expert", [], {"DTP_DEVICE": "gpu"}, 2, "dtp-bench-sequence-expert: error:"),
    ("dtp-bench-zero-memory", [], {"DTP_BACKEND": "foo"}, 2, "dtp-bench-zero-memory: error: unknown backend 'foo'"),
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


def check(program, args, status, stream, text, workdir, env=None):
    """Returns a failure message, or None."""
    name = os.path.basename(program)
    command = " ".join([f"{k}={v}" for k, v in (env or {}).items()] + [name] + [repr(a) if " " in a else a
                                                                                 for a in args])
    try:
        # A session of its own, so that a timeout ends whatever it started too.
        child = subprocess.Popen([program] + args, cwd=workdir, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, errors="replace", start_new_session=True,
                                 env=dict(os.environ, **(env or {})))
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


def check_bad_inputs(folder):
    failures = []
    for name, args, env, status, text in BAD_INPUTS:
        program = os.path.join(folder, name)
        if not os.path.exists(program):
            failures.append(f"{name}: not built in {folder}, so its bad-input row `{' '.join(args)}` cannot run")
            continue
        with tempfile.TemporaryDirectory(prefix="dtp-bad-input-") as workdir:
            message = check(program, args, status, "stderr", text, workdir, env)
            left = sorted(os.listdir(workdir))
            if not message and left:
                message = f"{name}: `{' '.join(args)}` failed as it should but left {', '.join(left)} behind"
        print(f"{'FAIL' if message else 'ok  '} {name} {' '.join(args)} {env or ''}")
        if message:
            failures.append(message)
    return failures


def check_found_through_path(folder):
    """dtp-schedule --impl reference runs its sibling, also when the shell found it through PATH (argv[0]
    then holds no folder)."""
    if not os.path.exists(os.path.join(folder, "dtp-schedule")):
        return [f"dtp-schedule: not built in {folder}"]
    env = dict(os.environ, PATH=os.path.abspath(folder) + os.pathsep + os.environ.get("PATH", ""))
    with tempfile.TemporaryDirectory(prefix="dtp-path-") as workdir:
        run = subprocess.run(["dtp-schedule", "--kind", "1f1b", "--stages", "2", "--microbatches", "2", "--impl",
                              "reference"], cwd=workdir, env=env, capture_output=True, text=True,
                             timeout=TIME_LIMIT_S, stdin=subprocess.DEVNULL)
    if run.returncode != 0 or "(reference)" not in run.stdout:
        return [f"dtp-schedule: `dtp-schedule --impl reference` found through PATH exited {run.returncode} without "
                f"drawing the reference.\n    stderr: {tail(run.stderr)}"]
    print("ok   dtp-schedule --impl reference, found through PATH")
    return []


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: program_flags.py BIN_FOLDER (the build's bin/, holding the dtp-* programs)")
    folder = os.path.abspath(sys.argv[1])
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
    failures += check_bad_inputs(folder)
    failures += check_found_through_path(folder)
    if failures:
        print(f"\n{len(failures)} problem(s) in {len(programs)} programs of {folder}:", file=sys.stderr)
        for message in failures:
            print(message, file=sys.stderr)
        return 1
    print(f"{len(programs)} programs: --help, an unknown flag and a stray argument handled as they should be")
    return 0


if __name__ == "__main__":
    sys.exit(main())
