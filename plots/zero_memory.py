#!/usr/bin/python3
"""Memory per rank and step time of the ZeRO stages, from dtp-bench-zero-memory JSON lines.

    /usr/bin/python3 plots/zero_memory.py bench/results/zero-memory-*.jsonl

Writes two PNGs into docs/figures/ (or --out):

- zero_memory.png: per world size, one bar per stage (DDP, ZeRO-1, ZeRO-2,
  ZeRO-3, ZeRO-3 with prefetch, ZeRO-1 with offload), the peak bytes of rank 0
  stacked by category (parameters, gradients, optimizer state; optimizer
  state in host memory hatched, GPU runs only), and a black marker at the
  lesson's formula for the same rank. Rank 0 holds the longest shards
  (chunk_range gives the first ranks ceil-sized ones), so it is the rank that
  limits the model size.
- zero_step_time.png: the median step time of each stage against the world
  size (left), and its ratio to DDP at the same world (right), with the
  chapter's goal for ZeRO-3 with prefetch (1.15x DDP) as a dashed line.

When several lines measure the same (stage, world), the last one read wins, so
pass older files first. Lines of another benchmark are skipped. Needs
matplotlib (Debian's python3-matplotlib, which only /usr/bin/python3 sees).
"""
import argparse
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from _bench_json import figure_folder, keep_last_setup, provenance, read_rows  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

# Table order of bench/zero_memory.cpp.
STAGES = ["ddp", "zero1", "zero2", "zero3", "zero3-prefetch", "zero1-offload"]
STAGE_LABELS = {"ddp": "DDP", "zero1": "ZeRO-1", "zero2": "ZeRO-2", "zero3": "ZeRO-3",
                "zero3-prefetch": "ZeRO-3 + prefetch", "zero1-offload": "ZeRO-1 + offload"}
STAGE_SHORT = {"ddp": "D", "zero1": "1", "zero2": "2", "zero3": "3", "zero3-prefetch": "3p",
               "zero1-offload": "1o"}
STAGE_COLOURS = dict(zip(STAGES, ["#7f7f7f", "#1f77b4", "#2ca02c", "#d62728", "#9467bd", "#ff7f0e"]))
CATEGORY_COLOURS = {"params": "#4c72b0", "grads": "#dd8452", "optimizer": "#55a868"}
MIB = 1024.0 * 1024.0
PREFETCH_GOAL = 1.15


def setup_key(row):
    """What must agree for two rows to share a figure."""
    return (row.get("backend"), row.get("device"), row.get("dtype"), row.get("optimizer"), row.get("d_model"),
            row.get("layers"), row.get("heads"), tuple(row.get("unit_numel", [])))


def footer(rows):
    any_row = rows[-1]
    psi = sum(any_row.get("unit_numel", []))
    return (f"dtp-bench-zero-memory · {any_row.get('backend')}/{any_row.get('device')} · "
            f"GPT d_model {any_row.get('d_model')}, {any_row.get('layers')} layers, "
            f"{len(any_row.get('unit_numel', []))} units, Psi = {psi:,} parameters, {any_row.get('dtype')}, "
            f"{any_row.get('optimizer')} · {provenance(rows)}")


def plot_memory(table, worlds, stages, rows, path):
    figure, axes = plt.subplots(figsize=(12.5, 5.6), dpi=120)
    width = 0.8 / len(stages)
    any_host = any(table[(s, w)].get("host_optimizer_bytes", 0) > 0 for (s, w) in table)
    ticks, labels = [], []
    for wi, world in enumerate(worlds):
        for si, stage in enumerate(stages):
            row = table.get((stage, world))
            if row is None:
                continue
            x = wi + (si - (len(stages) - 1) / 2) * width
            bottom = 0.0
            for category in ("params", "grads", "optimizer"):
                value = row[f"{category}_bytes"] / MIB
                axes.bar(x, value, width * 0.92, bottom=bottom, color=CATEGORY_COLOURS[category],
                         edgecolor="white", linewidth=0.5)
                bottom += value
            host = row.get("host_optimizer_bytes", 0) / MIB
            if host > 0:
                axes.bar(x, host, width * 0.92, bottom=bottom, color="white", hatch="///",
                         edgecolor=CATEGORY_COLOURS["optimizer"], linewidth=0.8)
            formula = (row["formula_params_bytes"] + row["formula_grads_bytes"] + row["formula_optimizer_bytes"]
                       + (row.get("formula_host_optimizer_bytes", 0) if host > 0 else 0)) / MIB
            axes.plot([x], [formula], marker="_", color="black", markersize=11, markeredgewidth=2.0)
            ticks.append(x)
            labels.append(STAGE_SHORT[stage])
    axes.set_xticks(ticks)
    axes.set_xticklabels(labels, fontsize=7)
    axes.tick_params(axis="x", length=0, pad=2)
    for wi, world in enumerate(worlds):
        axes.text(wi, -0.075, f"N = {world}", transform=axes.get_xaxis_transform(), ha="center", va="top",
                  fontsize=10)
    axes.set_xlim(-0.6, len(worlds) - 0.4)
    axes.set_ylabel("peak bytes of rank 0 (MiB)")
    axes.set_title("Model-state memory per rank: DDP and the ZeRO stages against the world size N", fontsize=12)
    axes.grid(True, axis="y", alpha=0.3)
    handles = [Patch(color=CATEGORY_COLOURS[c], label=name) for c, name in
               (("params", "parameters"), ("grads", "gradients"), ("optimizer", "optimizer state"))]
    if any_host:
        handles.append(Patch(facecolor="white", hatch="///", edgecolor=CATEGORY_COLOURS["optimizer"],
                             label="optimizer state in host memory"))
    handles.append(Line2D([], [], marker="_", color="black", linestyle="none", markersize=11, markeredgewidth=2.0,
                          label="the lesson's formula (same rank)"))
    handles += [Patch(facecolor="none", edgecolor="none", label=f"{STAGE_SHORT[s]}: {STAGE_LABELS[s]}")
                for s in stages]
    axes.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    worst = max((abs(r.get("worst_ratio_to_formula", 1.0) - 1.0) for r in table.values()), default=0.0)
    note = ("every bar equals its formula exactly" if worst < 1e-9 else
            f"largest deviation from a formula (any rank, any category): {100 * worst:.2f}%")
    axes.text(0.99, 0.98, note, transform=axes.transAxes, ha="right", va="top", fontsize=8, color="0.25")
    figure.text(0.5, 0.005, footer(rows), ha="center", va="bottom", fontsize=7, color="0.35")
    figure.tight_layout(rect=(0, 0.03, 1, 1))
    figure.savefig(path)
    plt.close(figure)


def plot_step_time(table, worlds, stages, rows, path):
    figure, (left, right) = plt.subplots(1, 2, figsize=(12.5, 4.8), dpi=120)
    for stage in stages:
        points = [(w, table[(stage, w)]["step_s"] * 1e3) for w in worlds if (stage, w) in table]
        if points:
            left.plot([p[0] for p in points], [p[1] for p in points], "o-", color=STAGE_COLOURS[stage],
                      label=STAGE_LABELS[stage], linewidth=1.6, markersize=4)
    left.set_xlabel("world size N (ranks)")
    left.set_ylabel("median step time (ms, slowest rank)")
    left.set_xticks(worlds)
    left.grid(True, alpha=0.3)
    left.legend(fontsize=8)
    left.set_title("Step time", fontsize=11)

    others = [s for s in stages if s != "ddp"]
    width = 0.8 / max(len(others), 1)
    ratios = [1.0, PREFETCH_GOAL]
    for si, stage in enumerate(others):
        xs, ys = [], []
        for wi, world in enumerate(worlds):
            row = table.get((stage, world))
            if row and row.get("vs_ddp"):
                xs.append(wi + (si - (len(others) - 1) / 2) * width)
                ys.append(row["vs_ddp"])
        ratios += ys
        right.bar(xs, ys, width * 0.92, color=STAGE_COLOURS[stage], label=STAGE_LABELS[stage])
    right.axhline(1.0, color="black", linewidth=1.0)
    right.axhline(PREFETCH_GOAL, color=STAGE_COLOURS["zero3-prefetch"], linestyle="--", linewidth=1.2,
                  label=f"goal for ZeRO-3 + prefetch: {PREFETCH_GOAL:g}x DDP")
    right.set_xticks(range(len(worlds)))
    right.set_xticklabels([str(w) for w in worlds])
    right.set_xlabel("world size N (ranks)")
    right.set_ylabel("step time / DDP's at the same N")
    # Not from 0: the differences are tens of percent. Headroom for the legend.
    low, high = min(ratios), max(ratios)
    right.set_ylim(min(0.9, low - 0.05), high + 0.35 * (high - min(0.9, low - 0.05)))
    right.grid(True, axis="y", alpha=0.3)
    right.legend(fontsize=8, ncol=2, loc="upper left")
    right.set_title("Against DDP", fontsize=11)
    figure.text(0.5, 0.005, footer(rows), ha="center", va="bottom", fontsize=7, color="0.35")
    figure.tight_layout(rect=(0, 0.04, 1, 1))
    figure.savefig(path)
    plt.close(figure)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="+", help="JSON-lines files written by dtp-bench-zero-memory --json")
    parser.add_argument("--out", default=None, help="folder for the PNGs [docs/figures of this repository]")
    args = parser.parse_args()

    out_dir = figure_folder(args.out)
    rows = [r for r in read_rows(args.files) if r.get("what") == "zero_memory"]
    if not rows:
        sys.exit("no dtp-bench-zero-memory measurements in " + ", ".join(args.files))
    rows = keep_last_setup(rows, setup_key, "zero_memory.py")
    table = {(r["stage"], r["world"]): r for r in rows}
    worlds = sorted({w for (_, w) in table})
    stages = [s for s in STAGES if any((s, w) in table for w in worlds)]

    memory_path = os.path.join(out_dir, "zero_memory.png")
    plot_memory(table, worlds, stages, rows, memory_path)
    print(memory_path)
    time_path = os.path.join(out_dir, "zero_step_time.png")
    plot_step_time(table, worlds, stages, rows, time_path)
    print(time_path)


if __name__ == "__main__":
    main()
