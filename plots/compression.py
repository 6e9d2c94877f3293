#!/usr/bin/python3
"""Loss, bytes and step time of chapter 10's compressors, from dtp-bench-compression JSON lines.

    /usr/bin/python3 plots/compression.py bench/results/compression-cpu-*.jsonl

Writes docs/figures/compression.png (or into --out):

- left, the loss of every step for each method (the mean over the ranks);
  the uncompressed peers wide, under the others (a compressor that tracks
  its peer shows as a thin line inside a wide one); the AdamW methods
  (ddp-adamw and 1bit-adam) dashed, with a dotted line where 1-bit Adam's
  warm-up ends;
- right, each method's loss at the end (mean of the last 5 steps) against
  its time per step on the clock of the run's tier: a filled marker at
  compute + communication, a hollow one at the communication alone, joined
  by a dotted line; labels, in a column on the right, give the bytes per
  step against the method's uncompressed peer (ddp, ddp-adamw for
  1bit-adam, zero3 for zero++), whose markers are squares; zero++'s also
  the bytes its hpZ gathers inside a node.

When several lines measure the same method, the last one read wins, so pass
older files first. Lines of other benchmarks are skipped.
Needs matplotlib (Debian's python3-matplotlib, which only /usr/bin/python3 sees).
"""
import argparse
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from _bench_json import figure_folder, keep_last_setup, read_rows, run_footer  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

ORDER = ["ddp", "sign", "int8", "int4", "powersgd:1", "powersgd:4", "ddp-adamw", "1bit-adam", "zero3", "zero++"]
COLOURS = {"ddp": "black", "sign": "#d62728", "int8": "#1f77b4", "int4": "#17becf", "powersgd:1": "#9467bd",
           "powersgd:4": "#e377c2", "ddp-adamw": "#7f7f7f", "1bit-adam": "#ff7f0e", "zero3": "#8c564b",
           "zero++": "#2ca02c"}
PEERS = {"ddp", "ddp-adamw", "zero3"}


def setup_key(row):
    """What must agree for two rows to share a figure."""
    return (row.get("backend"), row.get("device"), row.get("dtype"), row.get("d_model"), row.get("layers"),
            row.get("heads"), row.get("vocab"), row.get("seq"), row.get("batch"), row.get("world"),
            row.get("tier"), row.get("node_ranks"), row.get("steps"))


def method_order(methods):
    """The benchmark's order, then anything else by name."""
    return sorted(methods, key=lambda m: (ORDER.index(m) if m in ORDER else len(ORDER), m))


def dashed(method):
    return "adam" in method


def plot_losses(axes, table, methods):
    for method in methods:
        row = table[method]
        losses = row["losses"]
        axes.plot(range(1, len(losses) + 1), losses, color=COLOURS.get(method, "0.5"),
                  linestyle="--" if dashed(method) else "-", linewidth=3.5 if method in PEERS else 1.3,
                  zorder=1 if method in PEERS else 2, label=f"{method} ({row['optimizer']})")
    if "1bit-adam" in table:
        warmup = table["1bit-adam"]["onebit_warmup"]
        axes.axvline(warmup + 0.5, color=COLOURS["1bit-adam"], linestyle=":", linewidth=1.0)
        axes.annotate(f"1-bit Adam's variance freezes (step {warmup})", (warmup + 0.5, axes.get_ylim()[1]),
                      xytext=(4, -12), textcoords="offset points", fontsize=8, color=COLOURS["1bit-adam"])
    axes.set_xlabel("step")
    axes.set_ylabel("loss (mean over the ranks)")
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=8, loc="lower left")
    axes.set_title("Loss per step", fontsize=11)


def plot_loss_time(axes, table, methods):
    labels = []
    for method in methods:
        row = table[method]
        colour = COLOURS.get(method, "0.5")
        marker = "s" if method in PEERS else "o"
        step_ms, comm_ms, loss = row["step_s"] * 1e3, row["mean_comm_s"] * 1e3, row["final_loss"]
        axes.plot([comm_ms, step_ms], [loss, loss], color=colour, linestyle=":", linewidth=1.0, zorder=2)
        axes.plot([step_ms], [loss], marker=marker, color=colour, markersize=9, linestyle="none", zorder=3)
        axes.plot([comm_ms], [loss], marker=marker, markerfacecolor="white", markeredgecolor=colour,
                  markeredgewidth=1.5, markersize=9, linestyle="none", zorder=3)
        text = (f"{method}: {row['bytes_ratio']:.3g}x bytes" if method not in PEERS
                else f"{method} (uncompressed): {row['mean_bytes_per_step'] / 1e6:.2f} MB")
        if row.get("node_formula_bytes_per_step"):
            text += f" between nodes, + {row['node_formula_bytes_per_step'] / 1e6:.2f} MB inside"
        labels.append((step_ms, loss, text, colour))
    axes.set_xscale("log")
    # The labels stand in one column right of every marker, in the order of
    # their losses, each joined to its filled marker by a faint line.
    bottom, top = axes.get_ylim()
    gap = (top - bottom) / 14
    column = 1.8 * max(x for x, _, _, _ in labels)
    placed = []
    for x, y, text, colour in sorted(labels, key=lambda label: label[1]):
        at = y if not placed else max(y, placed[-1] + gap)
        placed.append(at)
        axes.annotate(text, (x, y), xytext=(column, at), textcoords="data", fontsize=8, color=colour,
                      va="center", ha="left", zorder=5,
                      arrowprops=dict(arrowstyle="-", color=colour, alpha=0.4, linewidth=0.8, shrinkA=0,
                                      shrinkB=5))
    left, _ = axes.get_xlim()
    axes.set_xlim(left, column * 45)  # room for the labels on the right
    axes.set_ylim(bottom, max(top, placed[-1] + gap))
    r = table[methods[0]]
    nodes = f", nodes of {r['node_ranks']} on {r['node_tier']}" if r.get("node_ranks") else ""
    axes.set_xlabel(f"ms per step on the clock: {r['tier']} ({r['alpha_us']:g} us, {r['bandwidth_GBps']:g} GB/s), "
                    f"{r['world']} ranks{nodes}")
    axes.set_ylabel(f"loss at the end (mean of the last 5 of {r['steps']} steps)")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(handles=[
        Line2D([], [], marker="o", color="0.3", linestyle="none", markersize=9,
               label="compute + communication"),
        Line2D([], [], marker="o", markerfacecolor="white", markeredgecolor="0.3", linestyle="none", markersize=9,
               label="communication alone (clock)"),
        Line2D([], [], marker="s", color="0.3", linestyle="none", markersize=9, label="uncompressed peer")],
        fontsize=8, loc="center left")
    axes.set_title("Loss at the end against time per step", fontsize=11)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="+", help="JSON-lines files written by dtp-bench-compression --json")
    parser.add_argument("--out", default=None, help="folder for the PNG [docs/figures of this repository]")
    args = parser.parse_args()

    out_dir = figure_folder(args.out)
    rows = [r for r in read_rows(args.files) if r.get("what") == "compression"]
    if not rows:
        sys.exit("no dtp-bench-compression measurements in " + ", ".join(args.files))
    rows = keep_last_setup(rows, setup_key, "compression.py")
    table = {r["method"]: r for r in rows}
    methods = method_order(table)

    figure, axes = plt.subplots(1, 2, figsize=(13.0, 5.4), dpi=120)
    plot_losses(axes[0], table, methods)
    plot_loss_time(axes[1], table, methods)
    r = rows[-1]
    sgd = next((x["lr"] for x in rows if x["optimizer"] == "sgd"), None)
    adam = next((x["lr"] for x in rows if x["optimizer"] != "sgd"), None)
    lrs = ", ".join(s for s in (f"SGD lr {sgd:g}" if sgd is not None else "",
                                f"Adam lr {adam:g}" if adam is not None else "") if s)
    figure.suptitle(f"Compressed data parallelism: GPT d_model {r['d_model']}, {r['layers']} layers, "
                    f"{r['parameters']:,} parameters, {r['world']} ranks, batch {r['batch']} x seq {r['seq']}, "
                    f"{r['dtype']}; {lrs}", fontsize=11)
    figure.text(0.5, 0.005, run_footer(rows, "dtp-bench-compression"), ha="center", va="bottom", fontsize=7,
                color="0.35")
    figure.tight_layout(rect=(0, 0.03, 1, 0.96))
    path = os.path.join(out_dir, "compression.png")
    figure.savefig(path)
    plt.close(figure)
    print(path)


if __name__ == "__main__":
    main()
