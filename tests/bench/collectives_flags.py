#!/usr/bin/env python3
"""dtp-bench-collectives speaks nccl-tests' flags: -o is the reduction
(sum, avg, max, min), --collective names the collective, each table ends with
"# Out of bounds values" and "# Avg bus bandwidth", every row says its
reduction and placement, and a world of one rank prints sensible figures.

  collectives_flags.py BUILD/bin/dtp-bench-collectives
"""
import json
import os
import subprocess
import sys
import tempfile

FAILURES = []


def expect(condition, message):
    if not condition:
        FAILURES.append(message)
    return condition


def run(argv):
    env = dict(os.environ, DTP_BACKEND="thread", DTP_DEVICE="cpu")
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env, stdin=subprocess.DEVNULL)


def show(result):
    return f"exit {result.returncode}\n--- stdout ---\n{result.stdout[-2500:]}\n--- stderr ---\n{result.stderr[-800:]}"


def main():
    bench = sys.argv[1]
    small = ["-b", "1K", "-e", "4K", "-f", "4", "-n", "2", "-w", "1"]
    with tempfile.TemporaryDirectory() as folder:
        log = os.path.join(folder, "c.jsonl")
        argv = [bench, "-g", "3", *small, "-o", "all", "--collective", "all_reduce,reduce_scatter,all_gather",
                "--impl", "library,ring", "--json", log]
        result = run(argv)
        if expect(result.returncode == 0, f"{' '.join(argv)} must measure and exit 0; got {show(result)}"):
            out = result.stdout
            expect(out.count("# Out of bounds values : 0 OK") == 3,
                   f"each of the 3 tables must end with '# Out of bounds values : 0 OK'; got {show(result)}")
            expect(out.count("# Avg bus bandwidth    : ") == 3,
                   f"each of the 3 tables must end with '# Avg bus bandwidth    : X'; got {show(result)}")
            expect("# all_reduce (in-place)" in out and "# all_gather (out-of-place)" in out,
                   f"each table must say whether it is in place or out of place; got {show(result)}")
            rows = [json.loads(line) for line in open(log)] if os.path.exists(log) else []
            expect(rows, f"--json {log} must hold the rows; it is missing or empty")
            measured = [r for r in rows if r["what"] == "collective"]
            # all_reduce and reduce_scatter: 2 sizes x 4 reductions with the library, 2 sizes x sum with the ring.
            for op in ("all_reduce", "reduce_scatter"):
                got = sorted({(r["redop"], r["impl"]) for r in measured if r["op"] == op})
                want = sorted([(o, "library") for o in ("avg", "max", "min", "sum")] + [("sum", "ring")])
                expect(got == want, f"-o all on {op}: expected rows for {want} (the ring sums only); got {got}")
            gathers = {(r["redop"], r["placement"], r["root"]) for r in measured if r["op"] == "all_gather"}
            expect(gathers == {("none", "out-of-place", -1)},
                   f"all_gather rows: redop none, out-of-place, root -1 (as nccl-tests); got {gathers}")
            expect(all(r["wrong"] == 0 for r in measured),
                   f"every checked row must have 0 wrong elements; got {[r for r in measured if r['wrong']]}")
            expect(all(r["average"] == 1 for r in measured), "the default -a is 1 (the mean), as in nccl-tests")

    # nccl-tests' -o sum is the reduction, not an unknown collective.
    result = run([bench, "-g", "2", *small, "-o", "sum"])
    expect(result.returncode == 0 and " sum " in result.stdout and "# all_reduce (in-place)" in result.stdout,
           f"-o sum must run the all_reduce table with sum; got {show(result)}")
    result = run([bench, "-o", "prod"])
    expect(result.returncode == 2 and "-o" in result.stderr and "prod" in result.stderr,
           f"-o prod must be refused (exit 2) naming -o and prod; got {show(result)}")

    # One rank: busbw 0 as in nccl-tests, no roofline for an in-place collective (never 800%).
    result = run([bench, "-g", "1", *small, "--collective", "all_reduce,all_gather", "--impl", "library"])
    if expect(result.returncode == 0, f"-g 1 must measure; got {show(result)}"):
        reduce_rows = [l for l in result.stdout.splitlines() if l.strip() and not l.startswith("#")
                       and " sum " in l]
        expect(reduce_rows and all(l.split()[-3:-1] == ["N/A", "N/A"] for l in reduce_rows),
               f"-g 1: an in-place all_reduce has nothing to move: roofline and %roof must be N/A; got {reduce_rows}")
        expect("one rank: nothing moves between ranks" in result.stdout,
               f"-g 1: the header must explain the figures of one rank; got {show(result)}")

    for failure in FAILURES:
        print("FAILED:", failure, "\n")
    print(f"collectives flags: {'passed' if not FAILURES else f'{len(FAILURES)} failure(s)'}")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
