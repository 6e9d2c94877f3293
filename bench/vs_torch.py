#!/usr/bin/env python3
"""DTP's CPU training speed against PyTorch's, measured in the same run.

For each model size, rounds alternate between `dtp-train` (single device,
DTP_THREADS=N) and bench/torch_train_step.py (the same GPT in PyTorch eager,
torch.set_num_threads(N), math attention), same batch, sequence, width and
depth. With --world W > 1 both train data parallel on W ranks, the same
global batch: `dtp-train-reference --strategy ddp --world W` (chapter 02's
bucketed DDP, W rank threads sharing the N cores) against PyTorch's
DistributedDataParallel over gloo (W processes, N / W threads each, at
least 1). Each run trains --steps steps; the first --warmup are not timed. It
prints min and median tokens/s of each, their ratio (DTP / PyTorch), and
appends one JSON line per run and one per size to --json.

  python3 bench/vs_torch.py [--build-dir build] [--sizes default,3m] [--threads N] [--world W]
      [--attention naive|flash] [--rounds 3] [--steps 60] [--warmup 10]
      [--json bench/results/vs-torch-cpu-DATE.jsonl]

Sizes: default is dtp-train's default model (2 layers, d_model 64, 4 heads,
vocab 64, batch 16 x seq 64, 0.11M parameters); 3m is 6 layers, d_model 192,
6 heads, vocab 256, batch 8 x seq 128 (2.8M parameters); 3m-seq512 is the
same model on batch 2 x seq 512, where attention is a larger share.
--attention picks DTP's kernel (PyTorch 1.13 on the CPU has only the math one).
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile

SIZES = {
    "default": dict(layers=2, d_model=64, heads=4, vocab=64, batch=16, seq=64),
    "3m": dict(layers=6, d_model=192, heads=6, vocab=256, batch=8, seq=128),
    "3m-seq512": dict(layers=6, d_model=192, heads=6, vocab=256, batch=2, seq=512),
}
HERE = os.path.dirname(os.path.abspath(__file__))


def shape_flags(size):
    return [f"--{key.replace('_', '-')}={value}" for key, value in size.items()]


def run_dtp(args, size):
    with tempfile.NamedTemporaryFile(suffix=".jsonl") as log:
        env = dict(os.environ, DTP_THREADS=str(args.threads))  # rank threads split them
        program, strategy = "dtp-train", []
        if args.world > 1:
            program, strategy = "dtp-train-reference", ["--strategy=ddp", f"--world={args.world}"]
        command = [os.path.join(args.build_dir, "bin", program), f"--steps={args.steps}",
                   f"--attention={args.attention}", f"--json={log.name}"] + strategy + shape_flags(size)
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"vs_torch: {' '.join(command)} failed:\n{done.stdout}{done.stderr}")
        steps = [json.loads(line) for line in open(log.name) if '"kind":"step"' in line]
    timed = steps[args.warmup:]
    return sum(s["tokens"] for s in timed) / sum(s["seconds"] for s in timed), timed[-1].get("page_faults", 0)


def run_torch(args, size):
    with tempfile.NamedTemporaryFile(suffix=".jsonl") as out:
        threads = max(1, args.threads // args.world)  # per process
        command = [args.python, os.path.join(HERE, "torch_train_step.py"), "--device=cpu", "--attention=math",
                   f"--threads={threads}", f"--world={args.world}", f"--steps={args.steps - args.warmup}",
                   f"--warmup={args.warmup}", f"--json={out.name}"] + shape_flags(size)
        # OpenBLAS's own threads on top of torch's oversubscribe the cores
        # (measured: 2 threads at 1.7k tok/s with them, 3.8k without, on the 3m size).
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
        done = subprocess.run(command, capture_output=True, text=True, env=env)
        if done.returncode != 0 or "skipped" in done.stdout:
            sys.exit(f"vs_torch: {' '.join(command)} gave no measurement:\n{done.stdout}{done.stderr}")
        record = json.loads(open(out.name).read().splitlines()[-1])
    return record["tokens_per_s"], record["torch"]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build-dir", default="build")
    parser.add_argument("--sizes", default="default,3m")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--world", type=int, default=1, help="data-parallel ranks (default 1: one device)")
    parser.add_argument("--attention", default="naive", choices=["naive", "flash"], help="DTP's attention kernel")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--python", default="/usr/bin/python3", help="the Python that has torch (Debian's)")
    parser.add_argument("--json", default=os.path.join(
        HERE, "results", f"vs-torch-cpu-{datetime.date.today().isoformat()}.jsonl"))
    args = parser.parse_args()
    sizes = args.sizes.split(",")
    for name in sizes:
        if name not in SIZES:
            parser.error(f"--sizes: unknown size '{name}' (expected a comma list of {', '.join(SIZES)})")
    for flag in ("threads", "rounds", "world"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag} must be at least 1, got {getattr(args, flag)}")
    for name in sizes:
        if SIZES[name]["batch"] % args.world:
            parser.error(f"--world {args.world} must divide size {name}'s batch of {SIZES[name]['batch']}")
    if not 0 <= args.warmup < args.steps:
        parser.error(f"--warmup must be from 0 to --steps - 1 ({args.steps - 1}), got {args.warmup}")
    git = subprocess.run(["git", "-C", HERE, "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True).stdout.strip() or "unknown"
    host = os.uname().nodename
    print(f"DTP attention: {args.attention}")
    print(f"{'size':<9} {'world':>5} {'threads':>7} {'DTP tok/s min/median':>22} {'torch tok/s min/median':>24} {'DTP/torch':>9}"
          f" {'faults/step':>11}")
    with open(args.json, "a") as out:
        for name in sizes:
            size = SIZES[name]
            dtp, torch, faults, version = [], [], 0, "?"
            for _ in range(args.rounds):  # interleaved, so drift hits both alike
                rate, faults = run_dtp(args, size)
                dtp.append(rate)
                rate, version = run_torch(args, size)
                torch.append(rate)
            common = dict(size=name, world=args.world, threads=args.threads, attention=args.attention, git=git,
                          host=host, **size)
            for impl, rates in (("dtp", dtp), ("torch", torch)):
                for rate in rates:
                    out.write(json.dumps(dict(what="vs_torch_run", impl=impl, tokens_per_s=rate, **common)) + "\n")
            ratio = statistics.median(dtp) / statistics.median(torch)
            out.write(json.dumps(dict(what="vs_torch", torch=version, dtp_median=statistics.median(dtp),
                                      torch_median=statistics.median(torch), ratio=ratio,
                                      page_faults_last_step=faults, **common)) + "\n")
            print(f"{name:<9} {args.world:>5} {args.threads:>7} {min(dtp):>10,.0f} {statistics.median(dtp):>11,.0f}"
                  f" {min(torch):>12,.0f} {statistics.median(torch):>11,.0f} {ratio:>8.2f}x {faults:>11}")
    print(f"torch {version}; JSON lines appended to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
