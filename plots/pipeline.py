#!/usr/bin/python3
"""Pipeline parallelism's bubble, memory and executed schedules, from dtp-bench-pp-step JSON lines.

    /usr/bin/python3 plots/pipeline.py bench/results/pp-step-thread-cpu-*.jsonl

Writes four PNGs into docs/figures/ (or --out):

- pp_bubble.png: the bubble fraction against the micro-batches m, one colour
  per schedule. Lines: the lesson's formula (bubble_formula). Filled markers:
  the verifier (simulate_schedule); a white dot inside: the executed run's
  simulated clock (PipelineTrainer::timing().clock_bubble), which should sit
  exactly on the verifier's. Hollow squares: the same share in wall time
  (median over the timed steps); the p rank threads share the machine's
  cores (the figure says how many), so these measure something else than a
  GPU pipeline would: see bench/README.md.
- pp_memory.png: at m = --m (default 8), per pipeline stage, the activation
  peak of a step (left; MemoryCategory::activations) and the most
  micro-batches (x chunks) holding activations at once (right; bars: the
  executed run, dots: the verifier).
- pp_gantt.png: one panel per schedule, m = --m: the executed step's actions
  ("pp_actions" lines: timing().actions of the last timed step), one row per
  rank, on the simulated clock, coloured by kind (F, B, W) and labelled with
  the micro-batch. The interleaved schedule's clock is divided by its v: each
  of its actions runs one chunk, 1/v of a stage, although StageModule charges
  it a whole action's cost, so the panels share one time scale (units of a
  whole stage's forward).
- pp_gantt_wall.png: the same actions in wall time (milliseconds from the
  step's first action).

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
from matplotlib.patches import Patch  # noqa: E402

MIB = 1024.0 * 1024.0
SCHEDULES = ["afab", "1f1b", "interleaved", "zb-h1"]
SCHEDULE_COLOURS = {"afab": "#1f77b4", "1f1b": "#ff7f0e", "interleaved": "#2ca02c", "zb-h1": "#d62728"}
SCHEDULE_LABELS = {"afab": "AFAB (GPipe)", "1f1b": "1F1B", "interleaved": "interleaved 1F1B", "zb-h1": "ZB-H1"}
KIND_COLOURS = {"F": "#4c72b0", "B": "#dd8452", "W": "#8172b3"}
KIND_LABELS = {"F": "F: forward", "B": "B: backward (input gradient only, when split)",
               "W": "W: weight gradients (split)"}


def setup_key(row):
    """What must agree for two pp rows to share a figure."""
    return (row.get("backend"), row.get("device"), row.get("dtype"), row.get("d_model"), row.get("layers"),
            row.get("seq"), row.get("pp"))


def ordered(names):
    return [s for s in SCHEDULES if s in names] + sorted(n for n in names if n not in SCHEDULES)


def label(row):
    name = SCHEDULE_LABELS.get(row["schedule"], row["schedule"])
    return name + (f", v = {row['chunks']}" if row.get("chunks", 1) > 1 else "")


def model_line(r):
    return (f"p = {r['pp']} stages, GPT d_model {r['d_model']}, {r['layers']} layers, {r['heads']} heads, "
            f"seq {r['seq']}, {r['microbatch_size']} sequences per micro-batch, {r['dtype']}, {r['optimizer']}")


def plot_bubble(table, rows, path):
    figure, axes = plt.subplots(figsize=(10.5, 6.2), dpi=120)
    names = ordered({s for s, _ in table})
    ms = sorted({m for _, m in table})
    for name in names:
        colour = SCHEDULE_COLOURS.get(name, "0.4")
        points = sorted((m, r) for (s, m), r in table.items() if s == name)
        xs = [m for m, _ in points]
        # AFAB and 1F1B share their numbers: AFAB's line and markers are drawn wider, underneath.
        wide = name == "afab"
        axes.plot(xs, [r["formula_bubble"] for _, r in points], "-", color=colour, linewidth=5 if wide else 1.6,
                  alpha=0.45 if wide else 1.0)
        axes.plot(xs, [r["verifier_bubble"] for _, r in points], "o", color=colour, markersize=14 if wide else 9)
        axes.plot(xs, [r["clock_bubble"] for _, r in points], ".", color="white", markersize=5)
        axes.plot(xs, [r["wall_bubble"] for _, r in points], "s", markerfacecolor="none", markeredgecolor=colour,
                  markersize=9, markeredgewidth=1.4, linestyle=":", color=colour, linewidth=0.8)
    handles = [Line2D([], [], color=SCHEDULE_COLOURS.get(n, "0.4"), linewidth=2.5,
                      label=label([r for (s, _), r in table.items() if s == n][0])
                      + (" (wide: under 1F1B, same clock numbers)" if n == "afab" else "")) for n in names]
    cores = rows[-1].get("cores", "?")
    handles += [
        Line2D([], [], color="0.3", linewidth=1.6, label="the lesson's formula (bubble_formula)"),
        Line2D([], [], color="0.3", marker="o", markersize=9, linestyle="none", label="verifier (simulate_schedule)"),
        Line2D([], [], color="white", marker=".", markersize=7, markeredgecolor="0.3", linestyle="none",
               label="executed run's simulated clock (the dot inside)"),
        Line2D([], [], marker="s", markerfacecolor="none", markeredgecolor="0.3", markersize=9, linestyle=":",
               color="0.3", label=f"wall time, median step ({rows[-1]['pp']} threads on {cores} cores)"),
    ]
    axes.set_xscale("log", base=2)
    axes.set_xticks(ms)
    axes.set_xticklabels([str(m) for m in ms])
    axes.set_xlabel("micro-batches per step m")
    axes.set_ylabel("bubble fraction: 1 - busy / (p x makespan)")
    top = max(max(r["wall_bubble"], r["formula_bubble"]) for r in table.values())
    axes.set_ylim(0, min(1.0, top * 1.12 + 0.02))
    axes.grid(True, alpha=0.3)
    axes.legend(handles=handles, fontsize=8, loc="upper right", ncol=2)
    axes.set_title("Pipeline bubble against m: the formula, the verifier and the executed run's clock; wall time\n"
                   + model_line(rows[-1]), fontsize=10)
    foot = run_footer(rows, "dtp-bench-pp-step")
    figure.text(0.5, 0.005, foot + " · clock costs F 1, B 2 (split: B 1, W 1), messages free",
                ha="center", va="bottom", fontsize=7, color="0.35")
    figure.tight_layout(rect=(0, 0.03, 1, 1))
    figure.savefig(path)
    plt.close(figure)


def plot_memory(table, rows, m, path):
    at_m = {s: r for (s, mm), r in table.items() if mm == m}
    if not at_m:
        print(f"pipeline.py: no measurement at m = {m}; pp_memory.png not written", file=sys.stderr)
        return False
    names = ordered(set(at_m))
    p = at_m[names[0]]["pp"]
    figure, (left, right) = plt.subplots(1, 2, figsize=(12.5, 5.0), dpi=120)
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        r = at_m[name]
        colour = SCHEDULE_COLOURS.get(name, "0.4")
        xs = [s + (i - (len(names) - 1) / 2) * width for s in range(p)]
        act = [b / MIB for b in r["activation_peak_bytes_per_stage"]]
        left.bar(xs, act, width, color=colour, label=label(r))
        for x, y in zip(xs, act):
            left.annotate(f"{y:.1f}", (x, y), textcoords="offset points", xytext=(0, 2), ha="center", fontsize=6.5)
        alive = r["peak_alive_per_stage"]
        right.bar(xs, alive, width, color=colour, label=label(r) + ": executed")
        right.plot(xs, r["verifier_peak_alive_per_stage"], "o", color="black", markersize=4,
                   label="verifier" if i == 0 else None)
    for axes in (left, right):
        axes.set_ylim(0, axes.get_ylim()[1] * 1.3)  # room for the legend
        axes.set_xticks(range(p))
        axes.set_xticklabels([f"stage {s}" for s in range(p)])
        axes.grid(True, axis="y", alpha=0.3)
        axes.legend(fontsize=8, ncol=2, loc="upper right")
    left.set_ylabel("activation peak of a step (MiB)")
    left.set_title(f"Activation peak per stage, m = {m}", fontsize=11)
    right.set_ylabel("micro-batches (x chunks) alive at once")
    right.set_title(f"Peak micro-batches holding activations, m = {m}", fontsize=11)
    right.yaxis.get_major_locator().set_params(integer=True)
    figure.suptitle("Pipeline schedules: what each stage keeps for its backward\n" + model_line(rows[-1]),
                    fontsize=10)
    foot = run_footer(rows, "dtp-bench-pp-step")
    figure.text(0.5, 0.005, foot + " · stage 3 holds the head (its logits); interleaved: rank r holds "
                "virtual stages r and r + p, and its executed count is the sum of its chunks' peaks",
                ha="center", va="bottom", fontsize=7, color="0.35")
    figure.tight_layout(rect=(0, 0.03, 1, 0.94))
    figure.savefig(path)
    plt.close(figure)
    return True


def plot_gantt(actions, rows, m, path, wall):
    names = ordered(set(actions))
    figure, panels = plt.subplots(len(names), 1, figsize=(13.5, 2.1 * len(names) + 1.2), dpi=120, sharex=not wall,
                                  squeeze=False)
    for axes, name in zip(panels[:, 0], names):
        line = actions[name]
        v = line.get("chunks", 1)
        scale = 1e3 if wall else 1.0 / v
        p = line["pp"]
        for stage, acts in enumerate(line["actions"]):
            for kind, mb, chunk, c0, c1, w0, w1 in acts:
                start, end = (w0, w1) if wall else (c0, c1)
                x, width = start * scale, (end - start) * scale
                colour = KIND_COLOURS.get(kind, "0.5")
                axes.barh(stage, width, left=x, height=0.8, color=colour, edgecolor="white", linewidth=0.6,
                          alpha=1.0 if chunk == 0 else 0.55, hatch="//" if chunk > 0 else None)
                text = str(mb) if v == 1 else f"{mb}{'abcdefgh'[chunk]}"
                axes.text(x + width / 2, stage, text, ha="center", va="center", fontsize=6.5 if v > 1 or wall else 7.5,
                          color="white" if chunk == 0 else "black", clip_on=True)
        axes.set_yticks(range(p))
        axes.set_yticklabels([f"rank {s}" for s in range(p)], fontsize=8)
        axes.set_ylim(p - 0.5, -0.5)
        if wall:
            span = line["wall_makespan_s"] * 1e3
            what = f"wall makespan {span:.0f} ms, bubble {line['wall_bubble']:.3f}"
        else:
            what = (f"makespan {line['clock_makespan'] / v:g} (clock {line['clock_makespan']:g}"
                    + (f" / v = {v}" if v > 1 else "") + f"), bubble {line['clock_bubble']:.3f}")
        axes.set_title(f"{label(line)}: {what}", fontsize=9, loc="left")
        axes.grid(True, axis="x", alpha=0.3)
    panels[-1, 0].set_xlabel("wall time from the step's first action (ms)" if wall else
                             "simulated clock, in forwards of a whole stage (interleaved: clock / v)")
    handles = [Patch(color=KIND_COLOURS[k], label=KIND_LABELS[k]) for k in ("F", "B", "W")]
    if any(a.get("chunks", 1) > 1 for a in actions.values()):
        handles.append(Patch(facecolor=KIND_COLOURS["F"], alpha=0.55, hatch="//",
                             label="interleaved: chunk b (virtual stage r + p); labels: micro-batch + chunk"))
    figure.legend(handles=handles, loc="upper left", bbox_to_anchor=(0.005, 0.975), fontsize=8, ncol=len(handles),
                  frameon=False)
    r = rows[-1]
    clock = "wall time" if wall else "the simulated clock (F 1, B 2; split B 1, W 1)"
    figure.suptitle(f"Executed pipeline schedules, m = {m}, p = {r['pp']}, on {clock}", fontsize=10, x=0.01, y=0.995,
                    ha="left")
    note = (f" · {r['pp']} rank threads on {r.get('cores', '?')} cores: waits include time-sharing" if wall else
            " · timing().actions of the last timed step (pp_actions lines)")
    figure.text(0.5, 0.005, run_footer(rows, "dtp-bench-pp-step") + note,
                ha="center", va="bottom", fontsize=7, color="0.35")
    figure.tight_layout(rect=(0, 0.025, 1, 0.945))
    figure.savefig(path)
    plt.close(figure)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="+", help="JSON-lines files written by dtp-bench-pp-step --json")
    parser.add_argument("--out", default=None, help="folder for the PNGs [docs/figures of this repository]")
    parser.add_argument("--m", type=int, default=8, help="micro-batches of the memory and Gantt figures [8]")
    args = parser.parse_args()

    out_dir = figure_folder(args.out)
    rows = read_rows(args.files)
    steps = [r for r in rows if r.get("what") == "pp_step"]
    if not steps:
        sys.exit("no dtp-bench-pp-step measurements in " + ", ".join(args.files))
    steps = keep_last_setup(steps, setup_key, "pipeline.py", "pp_step line(s)")
    table = {(r["schedule"], r["microbatches"]): r for r in steps}
    setup = setup_key(steps[-1])
    actions = {r["schedule"]: r for r in rows
               if r.get("what") == "pp_actions" and r["microbatches"] == args.m and setup_key(r) == setup}

    path = os.path.join(out_dir, "pp_bubble.png")
    plot_bubble(table, steps, path)
    print(path)
    path = os.path.join(out_dir, "pp_memory.png")
    if plot_memory(table, steps, args.m, path):
        print(path)
    if not actions:
        print(f"pipeline.py: no pp_actions lines at m = {args.m}; no Gantt charts", file=sys.stderr)
        return
    for name, wall in (("pp_gantt.png", False), ("pp_gantt_wall.png", True)):
        path = os.path.join(out_dir, name)
        plot_gantt(actions, steps, args.m, path, wall)
        print(path)


if __name__ == "__main__":
    main()
