#!/usr/bin/python3
"""MFU and memory per GPU against GPU count, from `dtp plan --sweep --json` lines.

    ./dtp plan --model llama3-70b --gpu h100 --sweep --global-batch 1024 --sp \\
        --recompute selective --json bench/results/plan-llama3-70b-h100-2026-11-29.jsonl
    /usr/bin/python3 plots/plan.py bench/results/plan-llama3-70b-h100-*.jsonl

Writes docs/figures/plan_scaling.png (or into --out):

- left, the predicted MFU of each layout (tp x pp, dp the rest) as the GPU
  count grows with the global batch fixed: fewer micro-batches per replica
  grow the pipeline bubble, and the data-parallel all-reduce crosses more
  nodes. A filled marker fits in the GPU's memory, a hollow one does not;
- right, the memory per GPU of the fullest stage (parameters, gradients,
  optimizer state and activations), with the GPU's memory as a line.

These are predictions of the planner (drivers/12_3d_parallelism/plan.h),
not measurements. When several lines describe the same layout and GPU
count, the last one read wins. Lines of other programs are skipped.
Needs matplotlib (Debian's python3-matplotlib, which only /usr/bin/python3 sees).
"""
import argparse
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from _bench_json import figure_folder, keep_last_setup, read_rows  # noqa: E402

GIB = 1024.0**3


def setup_key(row):
    """What must agree for two rows to share a figure."""
    return (row.get("model"), row.get("gpu"), row.get("global_batch"), row.get("sp"), row.get("recompute"),
            row.get("zero"), row.get("schedule"))


def layout_name(row):
    return f"tp {row['tp']} x pp {row['pp']}"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", help="JSON lines of dtp plan --sweep --json")
    parser.add_argument("--out", help="folder for the PNG (default docs/figures)")
    args = parser.parse_args()
    rows = [r for r in read_rows(args.files) if r.get("what") == "plan"]
    if not rows:
        sys.exit("plan.py: no lines of dtp plan in " + ", ".join(args.files))
    rows = keep_last_setup(rows, setup_key, "plan.py")
    by_layout = {}
    for r in rows:
        by_layout.setdefault(layout_name(r), {})[r["gpus"]] = r
    order = sorted(by_layout, key=lambda name: (by_layout[name][min(by_layout[name])]["pp"],
                                                -by_layout[name][min(by_layout[name])]["tp"]))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    for i, name in enumerate(order):
        points = [by_layout[name][g] for g in sorted(by_layout[name])]
        colour = colours[i % len(colours)]
        gpus = [p["gpus"] for p in points]
        left.plot(gpus, [100 * p["mfu"] for p in points], "-", color=colour, label=name)
        for p in points:
            left.plot(p["gpus"], 100 * p["mfu"], "o", color=colour,
                      markerfacecolor=colour if p["fits"] else "white")
        memory = [(p["params_bytes"] + p["grads_bytes"] + p["optimizer_bytes"] + p["activations_bytes"]) / GIB
                  for p in points]
        right.plot(gpus, memory, "o-", color=colour, label=name)
    hbm = rows[-1]["hbm_bytes"] / GIB
    right.axhline(hbm, color="black", linestyle="--", linewidth=1)
    right.text(min(r["gpus"] for r in rows), hbm * 1.03, f"{rows[-1]['gpu']} memory ({hbm:.1f} GiB)", fontsize=8)
    for axis in (left, right):
        axis.set_xscale("log", base=2)
        axis.set_xlabel("GPUs (global batch fixed)")
        axis.grid(True, which="both", alpha=0.3)
    left.set_ylabel("predicted MFU (%)")
    left.set_title("MFU: filled markers fit in memory")
    left.legend(fontsize=8)
    right.set_ylabel("GiB per GPU (fullest stage)")
    right.set_title("memory per GPU")
    r = rows[-1]
    fig.suptitle(f"dtp plan: {r['model']} on {r['gpu']}, global batch {r['global_batch']} sequences, "
                 f"recompute {r['recompute']}{', sp' if r['sp'] else ''}, zero {r['zero']}", fontsize=11)
    fig.text(0.5, 0.005, "predictions of drivers/12_3d_parallelism/plan.h on the runtime's alpha-beta clock",
             ha="center", fontsize=8, color="grey")
    fig.tight_layout(rect=(0, 0.03, 1, 0.95))
    path = os.path.join(figure_folder(args.out), "plan_scaling.png")
    fig.savefig(path, dpi=120)
    print(path)


if __name__ == "__main__":
    main()
