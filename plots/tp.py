#!/usr/bin/python3
"""Tensor parallelism's memory, step time and predicted communication, from dtp-bench-tp-step JSON lines.

    /usr/bin/python3 plots/tp.py bench/results/tp-step-thread-cpu-*.jsonl

Writes three PNGs into docs/figures/ (or --out):

- tp_memory.png: per rank, against the tensor-parallel size t, the parameter
  bytes (left) and the activation peak of a step (right), sequence
  parallelism off and on. Dashed: the lesson's formulas, (Psi - Psi_rep)/t +
  Psi_rep parameters, and the blocks' saved activations A_TP and A_SP
  (chapters/04_tensor_parallel/README.md, sections 6 and 7); the measured
  peak adds the embedding, the head and what is in flight. A star marks the
  serial model on one rank.
- tp_step_time.png: the median step time (slowest rank) against t, SP off
  and on (left), and the speed-up over t = 1 (right), with the ideal t and
  min(t, cores), the cores the ranks (threads of one process) share.
- tp_comm_tiers.png: the alpha-beta clock's prediction of one GPT-2-XL-sized
  block's TP communication (forward + backward) against t, NVLink inside a
  node against InfiniBand across nodes, for each token count, log scale;
  the block's compute on an H100 (an estimate, 72 N C^2 / t flops at the
  stated rate) as grey reference lines. SP moves the same bytes in the same
  rounds, so its points sit on the plain TP lines (hollow markers).

When several lines measure the same configuration, the last one read wins,
so pass older files first. Lines of other benchmarks are skipped. Needs
matplotlib (Debian's python3-matplotlib, which only /usr/bin/python3 sees).
"""
import argparse
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from _bench_json import figure_folder, keep_last_setup, read_rows, run_footer  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

MIB = 1024.0 * 1024.0
SP_COLOURS = {False: "#1f77b4", True: "#d62728"}
SP_LABELS = {False: "TP", True: "TP + sequence parallelism"}
TIER_COLOURS = {"NVLink": "#2ca02c", "InfiniBand": "#9467bd"}
TOKEN_STYLES = ["-", "--", ":", "-."]


def setup_key(row):
    """What must agree for two tp_step rows to share a figure."""
    return (row.get("backend"), row.get("device"), row.get("dtype"), row.get("optimizer"), row.get("d_model"),
            row.get("layers"), row.get("heads"), row.get("vocab_size"), row.get("seq"), row.get("batch"))


def model_line(r):
    return (f"GPT d_model {r['d_model']}, {r['layers']} layers, {r['heads']} heads, vocabulary {r['vocab_size']}, "
            f"Psi = {r['parameters']:,} ({r['replicated_parameters']:,} replicated), "
            f"{r['batch']} x {r['seq']} tokens per step, {r['dtype']}, {r['optimizer']}")


def tp_series(table, sp, key, scale=1.0):
    points = sorted((t, row[key] * scale) for (model, t, s), row in table.items() if model == "tp" and s == sp)
    return [p[0] for p in points], [p[1] for p in points]


def plot_memory(table, rows, path):
    figure, (left, right) = plt.subplots(1, 2, figsize=(12.5, 5.0), dpi=120)
    tps = sorted({t for (model, t, _) in table if model == "tp"})
    serial = table.get(("serial", 1, False))
    for axes, key, formula, title in (
            (left, "params_bytes", "formula_params_bytes", "Parameters per rank"),
            (right, "activation_peak_bytes", "formula_block_activation_bytes", "Activation peak of a step, per rank")):
        for sp in (False, True):
            xs, ys = tp_series(table, sp, key, 1 / MIB)
            if not xs:
                continue
            # Parameters are the same with and without SP: draw SP's line thinner on top.
            axes.plot(xs, ys, "o-", color=SP_COLOURS[sp], label=f"{SP_LABELS[sp]}, measured",
                      linewidth=2.6 if not sp else 1.4, markersize=6 if not sp else 4)
            fx, fy = tp_series(table, sp, formula, 1 / MIB)
            axes.plot(fx, fy, "--", color=SP_COLOURS[sp], linewidth=1.0, alpha=0.8,
                      label=f"{SP_LABELS[sp]}, formula" + ("" if key == "params_bytes" else ": blocks' saved A"))
            if key != "params_bytes" or not sp:  # parameters: the same numbers twice
                for x, y in zip(xs, ys):
                    axes.annotate(f"{y:.1f}", (x, y), textcoords="offset points", fontsize=7, color=SP_COLOURS[sp],
                                  xytext=(7, -11 if sp else 4))
        if serial:
            axes.plot([1], [serial[key] / MIB], marker="*", color="black", markersize=11, linestyle="none",
                      label="serial GPT, one rank")
        axes.set_xticks(tps)
        axes.set_xlim(min(tps) - 0.3, max(tps) + 0.5)
        axes.set_xlabel("tensor-parallel size t (ranks)")
        axes.set_ylabel("MiB per rank (largest over ranks)")
        axes.set_ylim(bottom=0)
        axes.grid(True, alpha=0.3)
        axes.legend(fontsize=8)
        axes.set_title(title, fontsize=11)
    left.text(0.98, 0.55, "(Psi - Psi_rep)/t + Psi_rep:\nequal to the byte", transform=left.transAxes, ha="right",
              fontsize=8, color="0.3")
    right.text(0.98, 0.55, "SP divides the residual stream and LayerNorm\ninputs by t, not the gathered inputs "
               "the\ncolumn-parallel linears keep (section 6)", transform=right.transAxes, ha="right", fontsize=8,
               color="0.3")
    figure.suptitle("Tensor parallelism: memory per rank against t\n" + model_line(rows[-1]), fontsize=10)
    figure.text(0.5, 0.005, run_footer(rows, "dtp-bench-tp-step", "tp_step"),
                ha="center", va="bottom", fontsize=7, color="0.35")
    figure.tight_layout(rect=(0, 0.03, 1, 0.95))
    figure.savefig(path)
    plt.close(figure)


def plot_step_time(table, rows, path):
    figure, (left, right) = plt.subplots(1, 2, figsize=(12.5, 4.8), dpi=120)
    tps = sorted({t for (model, t, _) in table if model == "tp"})
    serial = table.get(("serial", 1, False))
    cores = rows[-1].get("cores") or 0
    for sp in (False, True):
        xs, ys = tp_series(table, sp, "step_s", 1e3)
        if not xs:
            continue
        lows = [table[("tp", t, sp)].get("step_s_min", 0) * 1e3 for t in xs]
        highs = [table[("tp", t, sp)].get("step_s_max", 0) * 1e3 for t in xs]
        left.errorbar(xs, ys, yerr=[[y - lo for y, lo in zip(ys, lows)], [hi - y for y, hi in zip(ys, highs)]],
                      fmt="o-", color=SP_COLOURS[sp], label=SP_LABELS[sp], linewidth=1.6, markersize=5, capsize=3)
        sx, speedup = tp_series(table, sp, "step_vs_t1")
        right.plot(sx, [1 / v if v else 0 for v in speedup], "o-", color=SP_COLOURS[sp], label=SP_LABELS[sp],
                   linewidth=1.6, markersize=5)
    if serial:
        left.plot([1], [serial["step_s"] * 1e3], marker="*", color="black", markersize=11, linestyle="none",
                  label="serial GPT, one rank")
    left.set_xticks(tps)
    left.set_xlabel("tensor-parallel size t (ranks)")
    left.set_ylabel("step time (ms, slowest rank; median, bars: min-max)")
    left.set_ylim(bottom=0)
    left.grid(True, alpha=0.3)
    left.legend(fontsize=8, loc="lower left")
    left.set_title("Step time", fontsize=11)

    right.plot(tps, tps, ":", color="0.4", label="ideal: t")
    if cores:
        right.plot(tps, [min(t, cores) for t in tps], "--", color="0.2", linewidth=1.0,
                   label=f"min(t, {cores}): the cores the t ranks share")
    right.set_xticks(tps)
    right.set_xlabel("tensor-parallel size t (ranks)")
    right.set_ylabel("speed-up over t = 1 (same SP setting)")
    right.set_ylim(0, max(tps) + 0.5)
    right.grid(True, alpha=0.3)
    right.legend(fontsize=8, loc="upper left")
    right.set_title("Speed-up", fontsize=11)
    figure.suptitle(f"Tensor parallelism: step time against t (the t ranks are threads sharing {cores or '?'} "
                    f"CPU cores)\n" + model_line(rows[-1]), fontsize=10)
    figure.text(0.5, 0.005, run_footer(rows, "dtp-bench-tp-step", "tp_step"),
                ha="center", va="bottom", fontsize=7, color="0.35")
    figure.tight_layout(rect=(0, 0.04, 1, 0.94))
    figure.savefig(path)
    plt.close(figure)


def tier_colour(name):
    for key, colour in TIER_COLOURS.items():
        if name.startswith(key):
            return colour
    return "#7f7f7f"


def plot_comm_tiers(tiers, path):
    table = {(r["tier"], r["tokens"], r["tp"], r["sequence_parallel"]): r for r in tiers}
    names = list(dict.fromkeys(r["tier"] for r in tiers))
    tokens = sorted({r["tokens"] for r in tiers})
    tps = sorted({r["tp"] for r in tiers})
    figure, axes = plt.subplots(figsize=(10.5, 6.0), dpi=120)
    handles = []
    for name in names:
        any_row = [r for r in tiers if r["tier"] == name][-1]  # the latest run's numbers
        handles.append(Line2D([], [], color=tier_colour(name), linewidth=2,
                              label=f"{name}: alpha {any_row['alpha_us']:g} us, {any_row['bandwidth_GBps']:g} GB/s"))
    for ni, n in enumerate(tokens):
        style = TOKEN_STYLES[ni % len(TOKEN_STYLES)]
        for name in names:
            xs = [t for t in tps if (name, n, t, False) in table]
            ys = [table[(name, n, t, False)]["clock_us"] for t in xs]
            axes.plot(xs, ys, "o" + style, color=tier_colour(name), linewidth=1.8, markersize=5)
            sx = [t for t in tps if (name, n, t, True) in table]
            sy = [table[(name, n, t, True)]["clock_us"] for t in sx]
            axes.plot(sx, sy, "o", markerfacecolor="none", markeredgecolor=tier_colour(name), markersize=10,
                      linestyle="none")
            for x, y in zip(xs, ys):
                axes.annotate(f"{y:.0f}", (x, y), textcoords="offset points", xytext=(9, -3), fontsize=7,
                              color=tier_colour(name))
        cx = [t for t in tps if (names[0], n, t, False) in table]
        cy = [table[(names[0], n, t, False)]["compute_us_estimate"] for t in cx]
        axes.plot(cx, cy, "s" + style, color="0.45", linewidth=1.2, markersize=4)
        handles.append(Line2D([], [], color="0.3", linestyle=style, label=f"N = {n:,} tokens ({n // 1024} x 1024)"))
    rate = tiers[-1].get("compute_TFLOPs", 400)
    handles.append(Line2D([], [], color="0.45", marker="s", markersize=4,
                          label=f"compute of the block per rank, an estimate: 72 N C^2 / t flops at {rate:g} TFLOP/s "
                                "(H100, bf16)"))
    handles.append(Line2D([], [], marker="o", markerfacecolor="none", markeredgecolor="0.3", markersize=10,
                          linestyle="none", label="with sequence parallelism (4 all-gathers + 4 reduce-scatters)"))
    axes.set_yscale("log")
    axes.set_xticks(tps)
    axes.set_xlabel("tensor-parallel size t (GPUs in the TP group)")
    axes.set_ylabel("predicted time per block, forward + backward (us)")
    any_row = tiers[-1]
    axes.set_title(f"TP communication of one transformer block (C = {any_row['d_model']}, bf16, "
                   f"4 all-reduces of N C e bytes): alpha-beta clock", fontsize=11)
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(handles=handles, fontsize=8, loc="upper left")
    low = min(min(r["clock_us"], r["compute_us_estimate"]) for r in tiers)
    high = max(max(r["clock_us"], r["compute_us_estimate"]) for r in tiers)
    axes.set_ylim(low / 1.6, high * 12)  # headroom for the legend
    foot = run_footer(tiers, "dtp-bench-tp-step", "tp_comm_tiers")
    figure.text(0.5, 0.005, foot + " · the clock of the collectives run on the thread "
                "backend; ring all-reduce 2(t-1)(alpha + beta S/t)", ha="center", va="bottom", fontsize=7,
                color="0.35")
    figure.tight_layout(rect=(0, 0.03, 1, 1))
    figure.savefig(path)
    plt.close(figure)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="+", help="JSON-lines files written by dtp-bench-tp-step --json")
    parser.add_argument("--out", default=None, help="folder for the PNGs [docs/figures of this repository]")
    args = parser.parse_args()

    out_dir = figure_folder(args.out)
    rows = read_rows(args.files)
    steps = [r for r in rows if r.get("what") == "tp_step"]
    tiers = [r for r in rows if r.get("what") == "tp_comm_tiers"]
    if not steps and not tiers:
        sys.exit("no dtp-bench-tp-step measurements in " + ", ".join(args.files))
    if steps:
        steps = keep_last_setup(steps, setup_key, "tp.py", "tp_step line(s)")
        table = {(r["model"], r["tp"], r["sequence_parallel"]): r for r in steps}
        for name, plot in (("tp_memory.png", plot_memory), ("tp_step_time.png", plot_step_time)):
            path = os.path.join(out_dir, name)
            plot(table, steps, path)
            print(path)
    if tiers:
        path = os.path.join(out_dir, "tp_comm_tiers.png")
        plot_comm_tiers(tiers, path)
        print(path)


if __name__ == "__main__":
    main()
