#!/usr/bin/python3
"""Full fine-tuning against LoRA at several ranks, from dtp-bench-lora-finetune
JSON lines (chapter 08).

    /usr/bin/python3 plots/lora.py bench/results/lora-finetune-cpu-*.jsonl

Writes docs/figures/lora_finetune.png (or into --out): for each task in the
input (subset: the first phrases of the pretraining bank; new: another bank),
the fine-tuning loss against the step, smoothed over 10 steps (left); and for
each method the trainable share of the parameters, the peak gradient +
optimizer memory and the bytes one data-parallel step all-reduces, all
relative to full fine-tuning on a log axis (right).

Only the last run of each task is used. Needs matplotlib (Debian's
python3-matplotlib, which only /usr/bin/python3 sees).
"""
import argparse
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from _bench_json import figure_folder, read_rows, run_footer  # noqa: E402

SMOOTH = 10
COLOURS = ["#333333", "#4c72b0", "#55a868", "#dd8452", "#c44e52", "#8172b2"]


def smoothed(values, width=SMOOTH):
    return [sum(values[max(0, i - width + 1):i + 1]) / len(values[max(0, i - width + 1):i + 1])
            for i in range(len(values))]


def label(row):
    return "full" if row["method"] == "full" else f"LoRA r={row['rank']}"


def last_run(rows, task):
    """The rows of the last run of @p task (one run's rows share its date)."""
    mine = [r for r in rows if r.get("task") == task]
    return [r for r in mine if r.get("date") == mine[-1].get("date")] if mine else []


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+")
    parser.add_argument("--out", help="folder for the PNG (default docs/figures)")
    args = parser.parse_args()
    rows = [r for r in read_rows(args.files) if r.get("bench") == "lora_finetune"]
    if not rows:
        sys.exit("lora.py: no dtp-bench-lora-finetune rows (bench 'lora_finetune') in the input")
    tasks = [t for t in ("subset", "new") if any(r.get("task") == t for r in rows)]
    fig, axes = plt.subplots(1, len(tasks) + 1, figsize=(5.2 * (len(tasks) + 1), 4.3))
    titles = {"subset": "task 2 = 8 of the 32 pretraining phrases", "new": "task 2 = another phrase bank"}
    for axis, task in zip(axes, tasks):
        for i, row in enumerate(last_run(rows, task)):
            full = next(r for r in last_run(rows, task) if r["method"] == "full")
            axis.plot(range(1, len(row["losses"]) + 1), smoothed(row["losses"]), color=COLOURS[i % len(COLOURS)],
                      label=f"{label(row)}: {100 * row['trainable_fraction']:.1f}% trainable, last "
                            f"{row['last_loss']:.3f} ({row['last_loss'] / full['last_loss']:.2f}x)")
        axis.set_title(titles.get(task, task), fontsize=10)
        axis.set_xlabel("fine-tuning step")
        axis.set_ylabel(f"loss (mean of the last {SMOOTH} steps)")
        axis.set_yscale("log")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7.5)
    bars = axes[-1]
    run = last_run(rows, tasks[0])
    full = next(r for r in run if r["method"] == "full")
    measures = [("trainable\nparameters", lambda r: r["trainable"]),
                ("peak grads +\noptimizer bytes", lambda r: r["peak_grads_bytes"] + r["peak_optimizer_bytes"]),
                (f"all-reduced bytes per\nDDP step ({full['ddp_world']} ranks)", lambda r: r["ddp_bytes_per_step"])]
    width = 0.8 / len(run)
    for i, row in enumerate(run):
        values = [measure(row) / measure(full) for _, measure in measures]
        xs = [k + (i - (len(run) - 1) / 2) * width for k in range(len(measures))]
        bars.bar(xs, values, width=width, color=COLOURS[i % len(COLOURS)], label=label(row))
    bars.set_xticks(range(len(measures)))
    bars.set_xticklabels([name for name, _ in measures], fontsize=8)
    bars.set_yscale("log")
    bars.set_ylabel("relative to full fine-tuning")
    bars.set_title("what training holds and sends", fontsize=10)
    bars.grid(alpha=0.3, axis="y")
    bars.legend(fontsize=8)
    fig.suptitle(f"Fine-tuning a pretrained GPT ({full['layers']} blocks, d_model {full['d_model']}, "
                 f"{full['parameters']:,} parameters) from a checkpoint: full against LoRA on "
                 f"{', '.join(full['targets'])}", fontsize=11)
    fig.text(0.01, 0.005, run_footer(run, "dtp-bench-lora-finetune"), fontsize=7, color="#555555")
    fig.tight_layout(rect=(0, 0.03, 1, 0.95))
    path = os.path.join(figure_folder(args.out), "lora_finetune.png")
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
