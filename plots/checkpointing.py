#!/usr/bin/python3
"""Memory against step time of each activation-checkpointing policy, from dtp-bench-checkpointing JSON lines.

    /usr/bin/python3 plots/checkpointing.py bench/results/checkpointing-*.jsonl

Writes docs/figures/checkpointing.png (or into --out):

- one panel per attention kernel (naive, flash): for each policy (none, full,
  every:K, selective) its peak of activations and recomputed activations
  together (MiB) against its median step time (ms), a filled labelled marker
  with the steps' interquartile range as a horizontal bar, and the lesson's
  formula for the same peak as a hollow ring at the same time (on the marker
  when they agree, as the benchmark requires);
- a last panel of what each policy costs against the plain step of the same
  kernel: the measured time ratio as a bar, the ratio of counted matrix
  FLOPs as a black mark. Lines of bench/torch_checkpointing.py in the files
  ("what": "checkpointing_torch") add PyTorch's time ratio for full
  recomputation (torch.utils.checkpoint on every block) as a hatched bar.

When several lines measure the same (attention, policy), the last one read
wins, so pass older files first. Lines of other benchmarks are skipped.
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
from matplotlib.patches import Patch  # noqa: E402

ATTENTIONS = ["naive", "flash"]
ATTENTION_COLOURS = {"naive": "#4c72b0", "flash": "#dd8452"}
FIXED_COLOURS = {"none": "#7f7f7f", "full": "#d62728", "selective": "#2ca02c"}
EVERY_COLOURS = ["#1f77b4", "#9467bd", "#17becf", "#8c564b", "#e377c2"]
MIB = 1024.0 * 1024.0


def setup_key(row):
    """What must agree for two rows to share a figure."""
    return (row.get("backend"), row.get("device"), row.get("dtype"), row.get("optimizer"), row.get("d_model"),
            row.get("layers"), row.get("heads"), row.get("vocab"), row.get("seq"), row.get("batch"))


def policy_order(policies):
    """none, full, every:K by K, selective, then anything else by name."""
    def key(name):
        if name == "none":
            return (0, 0, name)
        if name == "full":
            return (1, 0, name)
        if name.startswith("every:") and name[6:].isdigit():
            return (2, int(name[6:]), name)
        if name == "selective":
            return (3, 0, name)
        return (4, 0, name)
    return sorted(policies, key=key)


def colours_for(policies):
    everies = [p for p in policies if p not in FIXED_COLOURS]
    colours = dict(FIXED_COLOURS)
    for i, p in enumerate(everies):
        colours[p] = EVERY_COLOURS[i % len(EVERY_COLOURS)]
    return colours


def quartiles(samples):
    ordered = sorted(samples)
    return ordered[len(ordered) // 4], ordered[(3 * len(ordered)) // 4]


def plot_memory_time(axes, table, attention, policies, colours):
    """Draws the markers; returns the labels to place: (x, y, text, colour)."""
    labels = []
    for policy in policies:
        row = table.get((attention, policy))
        if row is None:
            continue
        ms = row["step_s"] * 1e3
        peak = row["combined_bytes"] / MIB
        formula = row["formula_combined_bytes"] / MIB
        samples = row.get("step_s_samples") or [row["step_s"]]
        low, high = (q * 1e3 for q in quartiles(samples))
        axes.errorbar([ms], [peak], xerr=[[ms - low], [high - ms]], fmt="o", color=colours[policy], markersize=8,
                      elinewidth=1.2, capsize=3, zorder=3)
        axes.plot([ms], [formula], marker="o", markersize=15, markerfacecolor="none", markeredgecolor="black",
                  markeredgewidth=1.2, linestyle="none", zorder=4)
        labels.append((high, peak, f"{policy}: {peak:.1f} MiB, {row['time_ratio']:.2f}x time", colours[policy]))
    axes.set_xlabel("median step time (ms)")
    axes.set_ylabel("peak activations + recompute (MiB)")
    axes.grid(True, alpha=0.3)
    axes.set_title(f"{attention} attention", fontsize=11)
    return labels


def place_labels(axes, labels):
    """Each label right of its marker's bar, moved up or down just enough
    that no two labels overlap (at least a twelfth of the height apart)."""
    bottom, top = axes.get_ylim()
    gap = (top - bottom) / 12
    placed = []
    for x, y, text, colour in sorted(labels, key=lambda label: label[1]):
        at = y if not placed else max(y, placed[-1] + gap)
        placed.append(at)
        axes.annotate(text, (x, at), xytext=(10, 0), textcoords="offset points", fontsize=8, color=colour,
                      va="center", ha="left", zorder=5)
    left, right = axes.get_xlim()
    axes.set_xlim(left, right + 0.6 * (right - left))  # room for the labels on the right


def plot_ratios(axes, table, attentions, policies, colours, torch_full):
    others = [p for p in policies if p != "none"]
    series = [(a, ATTENTION_COLOURS.get(a, "0.5")) for a in attentions]
    bars = len(series) + (1 if torch_full else 0)
    width = 0.8 / bars
    offset = lambda i: (i - (bars - 1) / 2) * width  # noqa: E731
    top, bottom = 1.0, 1.0
    for pi, policy in enumerate(others):
        for si, (attention, colour) in enumerate(series):
            row = table.get((attention, policy))
            if row is None:
                continue
            x = pi + offset(si)
            axes.bar(x, row["time_ratio"], width * 0.9, color=colour)
            axes.plot([x], [row["flop_ratio"]], marker="_", color="black", markersize=13, markeredgewidth=2.0)
            top = max(top, row["time_ratio"], row["flop_ratio"])
            bottom = min(bottom, row["time_ratio"])
        if policy == "full" and torch_full:
            x = pi + offset(len(series))
            axes.bar(x, torch_full["time_ratio"], width * 0.9, color="white", hatch="///", edgecolor="0.3")
            top = max(top, torch_full["time_ratio"])
    axes.axhline(1.0, color="black", linewidth=1.0)
    axes.set_xticks(range(len(others)))
    axes.set_xticklabels(others)
    axes.set_ylabel("against the plain step (same kernel)")
    low = min(0.9, bottom - 0.05)
    axes.set_ylim(low, top + 0.5 * (top - low))  # room for the legend
    axes.grid(True, axis="y", alpha=0.3)
    handles = [Patch(color=c, label=f"time, {a} attention") for a, c in series]
    if torch_full:
        handles.append(Patch(facecolor="white", hatch="///", edgecolor="0.3",
                             label=f"time, PyTorch {torch_full.get('torch', '')} checkpoint (math attention)"))
    handles.append(Line2D([], [], marker="_", color="black", linestyle="none", markersize=13, markeredgewidth=2.0,
                          label="matrix FLOPs (counted)"))
    axes.legend(handles=handles, fontsize=8, loc="upper right")
    axes.set_title("What recomputation costs", fontsize=11)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="+", help="JSON-lines files written by dtp-bench-checkpointing --json "
                                                 "(and bench/torch_checkpointing.py --json)")
    parser.add_argument("--out", default=None, help="folder for the PNG [docs/figures of this repository]")
    args = parser.parse_args()

    out_dir = figure_folder(args.out)
    all_rows = read_rows(args.files)
    rows = [r for r in all_rows if r.get("what") == "checkpointing"]
    if not rows:
        sys.exit("no dtp-bench-checkpointing measurements in " + ", ".join(args.files))
    rows = keep_last_setup(rows, setup_key, "checkpointing.py")
    table = {(r["attention"], r["policy"]): r for r in rows}
    attentions = [a for a in ATTENTIONS if any(k[0] == a for k in table)]
    policies = policy_order({p for (_, p) in table})
    colours = colours_for(policies)
    shape = {k: rows[-1].get(k) for k in ("d_model", "layers", "heads", "vocab", "seq", "batch")}
    torch_rows = [r for r in all_rows if r.get("what") == "checkpointing_torch" and r.get("policy") == "full"
                  and all(r.get(k) == v for k, v in shape.items())]
    torch_full = torch_rows[-1] if torch_rows else None

    figure, axes = plt.subplots(1, len(attentions) + 1, figsize=(5.2 * (len(attentions) + 1), 5.0), dpi=120)
    labels = [plot_memory_time(axis, table, attention, policies, colours)
              for axis, attention in zip(axes, attentions)]
    top = 1.1 * max(a.get_ylim()[1] for a in axes[:len(attentions)])
    for axis, panel_labels in zip(axes, labels):
        axis.set_ylim(0, top)
        place_labels(axis, panel_labels)
    axes[0].legend(handles=[
        Line2D([], [], marker="o", color="0.3", linestyle="none", markersize=8,
               label="measured (bar: middle half of the steps)"),
        Line2D([], [], marker="o", markerfacecolor="none", markeredgecolor="black", linestyle="none",
               markersize=15, label="the lesson's formula")], fontsize=8, loc="lower left")
    plot_ratios(axes[-1], table, attentions, policies, colours, torch_full)
    r = rows[-1]
    figure.suptitle(f"Activation checkpointing: GPT d_model {r['d_model']}, {r['layers']} layers, {r['heads']} heads, "
                    f"batch {r['batch']} x seq {r['seq']}, {r['dtype']}", fontsize=12)
    footer = run_footer(rows, "dtp-bench-checkpointing")
    if torch_full:
        footer += f" · PyTorch peer: bench/torch_checkpointing.py, {torch_full.get('threads')} threads"
    figure.text(0.5, 0.005, footer, ha="center", va="bottom", fontsize=7, color="0.35")
    figure.tight_layout(rect=(0, 0.03, 1, 0.96))
    path = os.path.join(out_dir, "checkpointing.png")
    figure.savefig(path)
    plt.close(figure)
    print(path)


if __name__ == "__main__":
    main()
