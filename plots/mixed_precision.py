#!/usr/bin/python3
"""Loss curves of fp32, bf16 and fp16 training and the gradients' exponents,
from dtp-bench-mixed-precision JSON lines.

    /usr/bin/python3 plots/mixed_precision.py bench/results/mixed-precision-*.jsonl

Writes two PNGs into docs/figures/ (or --out):

- mp_loss_curves.png: the loss of each precision against the step, smoothed
  over 10 steps (left); bf16's and fp16's smoothed loss minus fp32's
  (middle); fp16's loss scale against the step on a log2 axis, with skipped
  steps marked (right).
- mp_grad_exponents.png: for each recorded step of the fp32 run, how many
  gradient elements have each binary exponent floor(log2 |g|), with the band
  where f16 flushes to zero (below 2^-24) and its subnormal band (2^-24 to
  2^-14), and where the default loss scale 2^16 moves the bars.

Only the last run's rows are used (one setup per figure). Needs matplotlib
(Debian's python3-matplotlib, which only /usr/bin/python3 sees).
"""
import argparse
import math
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from _bench_json import figure_folder, keep_last_setup, read_rows, run_footer  # noqa: E402

COLOURS = {"fp32": "#4c72b0", "bf16": "#55a868", "fp16": "#dd8452"}
SMOOTH = 10


def setup_key(row):
    return (row.get("date"), row.get("git"), row.get("d_model"), row.get("layers"), row.get("batch"), row.get("seq"))


def smoothed(values, width=SMOOTH):
    out = []
    for i in range(len(values)):
        window = values[max(0, i - width + 1):i + 1]
        out.append(sum(window) / len(window))
    return out


def loss_curves(rows, out):
    steps = [r for r in rows if r.get("kind") == "step"]
    if not steps:
        sys.exit("mixed_precision.py: no step rows (kind 'step') in the input")
    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(15, 4.2))
    reference = smoothed([r["loss"] for r in sorted((r for r in steps if r["precision"] == "fp32"),
                                                     key=lambda r: r["step"])])
    for precision in ("fp32", "bf16", "fp16"):
        mine = sorted((r for r in steps if r["precision"] == precision), key=lambda r: r["step"])
        if not mine:
            continue
        if precision != "fp32" and len(mine) == len(reference):
            middle.plot([r["step"] for r in mine],
                        [a - b for a, b in zip(smoothed([r["loss"] for r in mine]), reference)],
                        label=f"{precision} - fp32", color=COLOURS[precision], linewidth=1.1)
        left.plot([r["step"] for r in mine], smoothed([r["loss"] for r in mine]), label=precision,
                  color=COLOURS[precision], linewidth=1.6 if precision == "fp32" else 1.1,
                  linestyle="-" if precision == "fp32" else "--")
        if precision == "fp16":
            scaled = [r for r in mine if r.get("loss_scale", 0) > 0]
            right.step([r["step"] for r in scaled], [math.log2(r["loss_scale"]) for r in scaled], where="post",
                       color=COLOURS["fp16"], label="fp16 loss scale")
            skipped = [r for r in scaled if r.get("skipped")]
            if skipped:
                right.scatter([r["step"] for r in skipped], [math.log2(r["loss_scale"]) for r in skipped],
                              marker="x", color="#c44e52", label=f"skipped step ({len(skipped)})", zorder=3)
    left.set_xlabel("step")
    left.set_ylabel(f"training loss (mean of the last {SMOOTH} steps)")
    left.set_title("same seed and batches; bf16/fp16 with f32 masters", fontsize=10)
    left.legend()
    left.grid(alpha=0.3)
    middle.axhline(0, color="#4c72b0", linewidth=0.8)
    middle.set_xlabel("step")
    middle.set_ylabel("smoothed loss minus fp32's")
    middle.set_title("difference from fp32")
    middle.legend()
    middle.grid(alpha=0.3)
    scales = [math.log2(r["loss_scale"]) for r in steps if r.get("loss_scale", 0) > 0]
    if scales:
        right.set_ylim(min(scales) - 4, max(scales) + 4)
    right.set_xlabel("step")
    right.set_ylabel("log2 of the loss scale")
    right.set_title("fp16's dynamic loss scale: from 2^16, halved on an overflow", fontsize=10)
    right.legend()
    right.grid(alpha=0.3)
    fig.text(0.01, 0.005, run_footer(rows, "dtp-bench-mixed-precision"), fontsize=7, color="#555555")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    path = os.path.join(out, "mp_loss_curves.png")
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def grad_exponents(rows, out):
    hist = sorted((r for r in rows if r.get("kind") == "grad_exponents"), key=lambda r: r["step"])
    if not hist:
        sys.exit("mixed_precision.py: no gradient-exponent rows (kind 'grad_exponents') in the input")
    fig, ax = plt.subplots(figsize=(10, 4.4))
    low = min(min(r["exponents"]) for r in hist) - 1
    high = max(max(r["exponents"]) for r in hist) + 1
    ax.axvspan(low - 0.5, -24.5, color="#c44e52", alpha=0.15, label="f16: 0 (below 2^-24)")
    ax.axvspan(-24.5, -14.5, color="#dd8452", alpha=0.15, label="f16: subnormal, < 11 bits")
    width = 0.8 / len(hist)
    shades = ["#1f3f77", "#4c72b0", "#9db8e0", "#c7d7ef"]
    for i, r in enumerate(hist):
        total = sum(r["counts"]) + r.get("zeros", 0)
        xs = [e - 0.4 + (i + 0.5) * width for e in r["exponents"]]
        ax.bar(xs, [100.0 * c / total for c in r["counts"]], width=width, color=shades[i % len(shades)],
               label=f"step {r['step']}")
    ax.annotate("", xy=(-14, ax.get_ylim()[1] * 0.9), xytext=(-30, ax.get_ylim()[1] * 0.9),
                arrowprops=dict(arrowstyle="->", color="#333333"))
    ax.text(-22, ax.get_ylim()[1] * 0.93, "x 2^16 loss scale", ha="center", fontsize=8)
    ax.set_xlim(low - 0.5, high + 0.5)
    ax.set_xlabel("binary exponent e of a gradient element (2^e <= |g| < 2^(e+1))")
    ax.set_ylabel("% of gradient elements")
    ax.set_title("gradients of the default model, f32 run: where f16 would lose them")
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(alpha=0.3, axis="y")
    fig.text(0.01, 0.005, run_footer(rows, "dtp-bench-mixed-precision", "f32 run"), fontsize=7, color="#555555")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    path = os.path.join(out, "mp_grad_exponents.png")
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", help="dtp-bench-mixed-precision JSON-lines files")
    parser.add_argument("--out", help="folder for the PNGs (default docs/figures)")
    args = parser.parse_args()
    rows = [r for r in read_rows(args.files) if r.get("bench") == "mixed_precision"]
    if not rows:
        sys.exit("mixed_precision.py: no dtp-bench-mixed-precision rows in " + ", ".join(args.files))
    rows = keep_last_setup(rows, setup_key, "mixed_precision.py", "row(s)")
    out = figure_folder(args.out)
    loss_curves(rows, out)
    grad_exponents(rows, out)


if __name__ == "__main__":
    main()
