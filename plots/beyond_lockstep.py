#!/usr/bin/python3
"""Loss against bytes, and recovery from a failed replica, from dtp-bench-lockstep JSON lines.

    /usr/bin/python3 plots/beyond_lockstep.py bench/results/lockstep-cpu-*.jsonl

Writes docs/figures/lockstep.png (or into --out):

- left, the loss of every step (the mean over the workers) against the
  bytes one worker has moved so far (log scale), per method: DDP every
  step, local SGD and DiLoCo every H steps, the parameter server twice
  DDP's per step; a method that has moved nothing yet (the first H - 1
  steps of local SGD and DiLoCo) starts at its first average. The SGD
  methods are solid, the AdamW ones (ddp-adamw, DiLoCo) dashed; the
  baselines wide, under the others. Labels give each method's
  communication time on the run's WAN clock;
- right, per fault kind and recovery (continue with the quorum, restart
  from a checkpoint): the wall time the fault added to the fault-free run
  of the same recovery (the bar), with the coordinator's detection time
  (the dark part at its foot); restart's bars say how many steps were
  redone, continue's which replicas were left.

When several lines measure the same method or run, the last one read wins,
so pass older files first. Lines of other benchmarks are skipped.
Needs matplotlib (Debian's python3-matplotlib, which only /usr/bin/python3 sees).
"""
import argparse
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from _bench_json import figure_folder, keep_last_setup, read_rows, run_footer  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

ORDER = ["ddp", "local-sgd:4", "local-sgd:16", "ps:0", "ps:2", "ddp-adamw", "diloco:4", "diloco:16"]
COLOURS = {"ddp": "black", "local-sgd:4": "#1f77b4", "local-sgd:16": "#17becf", "ps:0": "#d62728",
           "ps:2": "#ff7f0e", "ddp-adamw": "#7f7f7f", "diloco:4": "#2ca02c", "diloco:16": "#9467bd"}
BASELINES = {"ddp", "ddp-adamw"}
FAULTS = ["crash", "hang", "drop-message", "slow"]
RECOVERIES = {"continue": "#1f77b4", "restart": "#d62728"}


def setup_key(row):
    """What must agree for two method rows to share a figure."""
    return (row.get("backend"), row.get("device"), row.get("dtype"), row.get("d_model"), row.get("layers"),
            row.get("heads"), row.get("vocab"), row.get("seq"), row.get("batch"), row.get("world"),
            row.get("tier"), row.get("steps"))


def recovery_key(row):
    """What must agree for two recovery rows to share a figure."""
    return (row.get("backend"), row.get("device"), row.get("replicas"), row.get("steps"), row.get("fault_step"),
            row.get("fault_replica"), row.get("detect_seconds"), row.get("replica_timeout_seconds"),
            row.get("d_model"), row.get("layers"))


def method_order(methods):
    """The benchmark's order, then anything else by name."""
    return sorted(methods, key=lambda m: (ORDER.index(m) if m in ORDER else len(ORDER), m))


def plot_loss_bytes(axes, table, methods):
    for method in methods:
        row = table[method]
        points = [(b, loss) for b, loss in zip(row["cumulative_bytes"], row["losses"]) if b > 0]
        if not points:
            continue
        x, y = zip(*points)
        label = f"{method}: {row['comm_s']:.1f} s, {row['total_bytes_per_worker'][0] / 1e6:.0f} MB"
        if row.get("kind") == "ps":
            label += f", {row['mean_staleness']:.2f} stale"
        axes.plot([b / 1e6 for b in x], y, color=COLOURS.get(method, "0.5"),
                  linestyle="--" if row["optimizer"] == "adamw" else "-",
                  linewidth=3.5 if method in BASELINES else 1.2, alpha=0.9,
                  zorder=1 if method in BASELINES else 2, label=label)
    r = table[methods[0]]
    axes.set_xscale("log")
    axes.set_xlabel("MB one worker has moved so far (collective buffers + messages sent and received), log scale")
    axes.set_ylabel("loss (mean over the workers)")
    axes.grid(True, which="both", alpha=0.3)
    # Room above the curves for the legend.
    bottom, top = axes.get_ylim()
    axes.set_ylim(bottom, top + 0.45 * (top - bottom))
    axes.legend(fontsize=7.5, loc="upper center", ncol=2, title_fontsize=8,
                title=f"s: on the clock of {r['tier']} ({r['alpha_us'] / 1e3:g} ms, {r['bandwidth_GBps']:g} GB/s); "
                      f"MB: per worker; stale: rounds behind (mean); dashed: AdamW")
    axes.set_title(f"Loss against bytes moved, {r['steps']} steps of each method", fontsize=11)


def plot_recovery(axes, runs):
    recoveries = [r for r in RECOVERIES if any(x["recovery"] == r for x in runs.values())]
    faults = [f for f in FAULTS if any(k[0] == f for k in runs)]
    width = 0.8 / max(1, len(recoveries))
    top = 0
    for i, fault in enumerate(faults):
        for j, recovery in enumerate(recoveries):
            row = runs.get((fault, recovery))
            if row is None:
                continue
            x = i + (j - (len(recoveries) - 1) / 2) * width
            colour = RECOVERIES[recovery]
            axes.bar([x], [row["extra_wall_s"]], width * 0.9, color=colour, alpha=0.35, edgecolor=colour)
            axes.bar([x], [row["detection_s"]], width * 0.9, color=colour, alpha=0.95)
            note = (f"{row['steps_redone']} redone" if recovery == "restart"
                    else "left: " + ",".join(str(w) for w in row["survivors"]))
            axes.annotate(f"+{row['extra_wall_s']:.2f} s\n{note}", (x, row["extra_wall_s"]), xytext=(0, 3),
                          textcoords="offset points", ha="center", va="bottom", fontsize=7.5, color=colour)
            top = max(top, row["extra_wall_s"])
    axes.set_xticks(range(len(faults)))
    any_row = next(iter(runs.values()))
    axes.set_xticklabels([f if f != "slow" else f"slow ({any_row['slow_seconds']:g} s)" for f in faults])
    axes.set_ylim(0, top * 1.3)
    axes.set_ylabel("seconds")
    axes.grid(True, axis="y", alpha=0.3)
    clean = {r: runs[("none", r)]["wall_s"] for r in recoveries if ("none", r) in runs}
    handles = []
    for recovery in recoveries:
        colour = RECOVERIES[recovery]
        base = f" (fault-free {clean[recovery]:.2f} s)" if recovery in clean else ""
        handles.append(Patch(color=colour, alpha=0.35, label=f"{recovery}: wall time added{base}"))
        handles.append(Patch(color=colour, alpha=0.95, label=f"{recovery}: detection"))
    axes.legend(handles=handles, fontsize=7.5, loc="upper left")
    every = next((r["checkpoint_every"] for r in runs.values() if r["recovery"] == "restart"), None)
    checkpoint = f", restart's checkpoint every {every} steps" if every else ""
    axes.set_title(f"Recovery: 1 coordinator + {any_row['replicas']} replicas, {any_row['steps']} steps, replica "
                   f"{any_row['fault_replica']} fails at step {any_row['fault_step']};\ndetect "
                   f"{any_row['detect_seconds']:g} s, replica timeout {any_row['replica_timeout_seconds']:g} s"
                   f"{checkpoint}", fontsize=10)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="+", help="JSON-lines files written by dtp-bench-lockstep --json")
    parser.add_argument("--out", default=None, help="folder for the PNG [docs/figures of this repository]")
    args = parser.parse_args()

    out_dir = figure_folder(args.out)
    rows = [r for r in read_rows(args.files) if r.get("what") == "lockstep"]
    methods_rows = [r for r in rows if r.get("part") == "methods"]
    recovery_rows = [r for r in rows if r.get("part") == "recovery"]
    if not methods_rows or not recovery_rows:
        sys.exit("need both parts of dtp-bench-lockstep (methods and recovery) in " + ", ".join(args.files))
    methods_rows = keep_last_setup(methods_rows, setup_key, "beyond_lockstep.py")
    recovery_rows = keep_last_setup(recovery_rows, recovery_key, "beyond_lockstep.py")
    table = {r["method"]: r for r in methods_rows}
    runs = {(r["fault"], r["recovery"]): r for r in recovery_rows}

    figure, axes = plt.subplots(1, 2, figsize=(14.0, 5.6), dpi=120, gridspec_kw={"width_ratios": [1.25, 1]})
    plot_loss_bytes(axes[0], table, method_order(table))
    plot_recovery(axes[1], runs)
    r = methods_rows[-1]
    figure.suptitle(f"Beyond lockstep: GPT d_model {r['d_model']}, {r['layers']} layers, {r['parameters']:,} "
                    f"parameters, {r['world']} workers, batch {r['batch']} x seq {r['seq']}, {r['dtype']}; SGD lr "
                    f"{table.get('ddp', r)['lr']:g}, AdamW lr {table.get('ddp-adamw', r)['lr']:g}, DiLoCo outer lr "
                    f"{r['outer_lr']:g} momentum {r['outer_momentum']:g}", fontsize=11)
    figure.text(0.5, 0.005, run_footer(methods_rows + recovery_rows, "dtp-bench-lockstep"), ha="center",
                va="bottom", fontsize=7, color="0.35")
    figure.tight_layout(rect=(0, 0.03, 1, 0.96))
    path = os.path.join(out_dir, "lockstep.png")
    figure.savefig(path)
    plt.close(figure)
    print(path)


if __name__ == "__main__":
    main()
