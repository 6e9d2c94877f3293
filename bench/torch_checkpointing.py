#!/usr/bin/env python3
"""The PyTorch peer of dtp-bench-checkpointing: what full recomputation of every
block costs PyTorch's eager CPU step, next to what it costs DTP's.

The model is torch_train_step.py's (DTP's GPT, math attention), at
dtp-bench-checkpointing's default shape. "plain" trains it as it is; "full"
wraps every block's forward in torch.utils.checkpoint.checkpoint (the
non-reentrant form), which keeps only the block's input and runs its forward
again in the backward: DTP's FullRecomputation. Whole steps (forward,
backward, SGD with momentum 0.9) are timed one by one; the two modes run in
turn, --repeats times (round-robin, as the DTP program does) after one untimed
round, and each mode's time is the median of its steps after --warmup untimed
ones of every run.

  /usr/bin/python3 bench/torch_checkpointing.py [--threads N] [--steps 8] [--warmup 2]
      [--repeats 5] [--batch 4] [--seq 128] [--layers 8] [--d-model 128] [--heads 4]
      [--vocab 256] [--json FILE]

Prints one line per mode and appends one JSON object per mode to --json
("what": "checkpointing_torch"). Exits 0 with "skipped" where torch is missing.
"""
import argparse
import datetime
import json
import os
import platform
import socket
import subprocess
import sys
import time

# OpenBLAS's own threads on top of torch's oversubscribe the cores (bench/vs_torch.py).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_train_step import build  # noqa: E402


def median(values):
    """The upper middle value, as bench_common.h's median()."""
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def checkpoint_every_block(model):
    """Every block keeps its input only and runs its forward again in the backward."""
    from torch.utils.checkpoint import checkpoint
    for block in model.blocks:
        forward = block.forward
        block.forward = lambda x, forward=forward: checkpoint(forward, x, use_reentrant=False)


def run(torch, args, mode):
    """One run: args.warmup + args.steps steps; the seconds of the timed ones and the losses."""
    torch.manual_seed(0)
    model = build(torch, args)
    if mode == "full":
        checkpoint_every_block(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, args.vocab, (args.batch, args.seq), generator=generator)
    targets = torch.randint(0, args.vocab, (args.batch, args.seq), generator=generator)
    seconds, losses = [], []
    for step in range(args.warmup + args.steps):
        start = time.perf_counter()
        loss = model(ids, targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if step >= args.warmup:
            seconds.append(time.perf_counter() - start)
    return seconds, losses


def git_revision():
    try:
        return subprocess.run(["git", "-C", os.path.dirname(os.path.abspath(__file__)), "rev-parse", "--short",
                               "HEAD"], capture_output=True, text=True, timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def cpu_model():
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, default in [("batch", 4), ("seq", 128), ("layers", 8), ("d-model", 128), ("heads", 4),
                          ("vocab", 256), ("steps", 8), ("warmup", 2), ("repeats", 5)]:
        parser.add_argument("--" + name, type=int, default=default, help=f"(default {default})")
    parser.add_argument("--threads", type=int, default=os.cpu_count(),
                        help="torch.set_num_threads (default: the cores, as DTP's thread pool)")
    parser.add_argument("--json", default=None, help="append one JSON object per mode to FILE")
    args = parser.parse_args()
    for name in ("batch", "seq", "layers", "d_model", "heads", "vocab", "steps", "repeats", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.warmup < 0:
        parser.error(f"--warmup must be at least 0, got {args.warmup}")
    if args.d_model % args.heads:
        parser.error(f"--d-model {args.d_model} must divide by --heads {args.heads}")
    args.attention, args.device = "math", "cpu"
    try:
        import torch
    except ImportError:
        print("torch not installed: skipped")
        return 0
    torch.set_num_threads(args.threads)

    modes = ["plain", "full"]
    times = {m: [] for m in modes}
    losses = {}
    # Round 0 is not timed: the process's first runs pay torch's one-time set-up.
    for round in range(args.repeats + 1):
        for mode in modes:
            seconds, mode_losses = run(torch, args, mode)
            if round > 0:
                times[mode] += seconds
            losses.setdefault(mode, mode_losses)
    plain_s = median(times["plain"])
    same = losses["full"] == losses["plain"]
    print(f"# torch {torch.__version__} eager on the CPU, {args.threads} thread(s), math attention; d_model "
          f"{args.d_model}, {args.layers} layers, {args.heads} heads, vocab {args.vocab}; batch {args.batch} x seq "
          f"{args.seq}; median of {args.steps} steps x {args.repeats} rounds")
    print(f"{'mode':<6} {'step ms':>9} {'time x':>7}")
    for mode in modes:
        step_s = median(times[mode])
        print(f"{mode:<6} {step_s * 1e3:9.1f} {step_s / plain_s:6.2f}x")
    print(f"# torch.utils.checkpoint on every block costs {100 * (median(times['full']) / plain_s - 1):.0f}% of a "
          f"plain step; losses {'equal' if same else 'DIFFER'} to the plain run's")
    if args.json:
        date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        with open(args.json, "a") as out:
            for mode in modes:
                step_s = median(times[mode])
                out.write(json.dumps({
                    "what": "checkpointing_torch", "policy": "none" if mode == "plain" else "full",
                    "attention": "naive", "torch": torch.__version__, "threads": args.threads,
                    "dtype": "f32", "optimizer": "sgd", "d_model": args.d_model, "layers": args.layers,
                    "heads": args.heads, "vocab": args.vocab, "seq": args.seq, "batch": args.batch,
                    "step_s": step_s, "plain_step_s": plain_s, "time_ratio": step_s / plain_s,
                    "step_s_samples": times[mode], "loss_equals_plain": losses[mode] == losses["plain"],
                    "steps": args.steps, "warmup": args.warmup, "repeats": args.repeats,
                    "backend": "torch", "device": "cpu", "date": date, "git": git_revision(),
                    "hostname": socket.gethostname(), "cpu": cpu_model(), "cores": os.cpu_count()}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
