#!/usr/bin/python3
"""DDP's overlap of the gradient all-reduce with backward, drawn from a DTP Chrome trace.

    build/bin/dtp-train-reference --strategy ddp --world 2 --steps 3 --trace ddp.json
    /usr/bin/python3 plots/trace_overlap.py ddp.json      # -> docs/figures/ddp_overlap_trace.png

Reads the trace that `dtp train --strategy ddp --trace FILE` writes (chapter
02) and draws one training step on a time axis, two lanes per rank:

- "rank r": the rank's own thread. Its top-level compute spans, coloured by
  phase (forward, backward, optimizer step), and the communication it sat
  waiting for ("wait": the exposed part, not hidden behind compute);
- "rank r comm": the rank's communication thread, where each bucket's
  all-reduce runs (started by comm.iall_reduce as soon as the bucket's
  gradients are final), numbered in the order they started.

A light band behind each rank's lanes marks its backward pass, so an
all-reduce bar inside the band ran while backward was still computing. The
title says, per rank, how much of the all-reduce time fell inside backward.

The step: by default the last complete one (from the first rank to end its
previous "optimizer step" span to the last rank to end this one); --step K
picks step K (from 1). A trace whose run was killed (no closing "]}") is read anyway.
Needs matplotlib (Debian's python3-matplotlib, which only /usr/bin/python3 sees).
"""
import argparse
import os
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch, Rectangle  # noqa: E402
from trace_prefetch import assign_depths, load_events, short_name, spans_and_names  # noqa: E402

COLOURS = {"forward": "#4c72b0", "backward": "#dd8452", "optimizer step": "#55a868",
           "wait (exposed comm)": "#da8bc3", "other comm": "#b0b0b0", "bucket all-reduce": "#937860"}
BACKWARD_BAND = "#fbe3cf"


def kind_of(span, comm_lane):
    """The legend entry of a span, or None for spans not drawn."""
    if comm_lane:
        return "bucket all-reduce" if span.name in ("all_reduce", "iall_reduce") else "other comm"
    if span.category == "compute":
        if span.name == "optimizer step":
            return "optimizer step"
        return "backward" if span.name.endswith("backward") else "forward"
    if span.name == "wait":
        return "wait (exposed comm)"
    if span.name == "iall_reduce":
        return None  # starting a bucket: microseconds, drawn as a tick instead
    return "other comm"


def rank_lanes(names):
    """{rank: (own thread track, comm thread track)} from DTP's thread names
    ("rank r" and "rank r comm"; tracks are (pid, tid): (r, 0) and (r, 1) since
    every rank is a trace process, (0, 2 r) and (0, 2 r + 1) in older traces)."""
    lanes = {}
    for track, name in names.items():
        match = re.fullmatch(r"rank (\d+)( comm)?", name)
        if match:
            lane = lanes.setdefault(int(match.group(1)), [None, None])
            lane[1 if match.group(2) else 0] = track
    for lane in lanes.values():  # an unnamed lane: the comm thread's tid is the own thread's + 1
        lane[0] = lane[0] or (lane[1][0], lane[1][1] - 1)
        lane[1] = lane[1] or (lane[0][0], lane[0][1] + 1)
    return {rank: tuple(lane) for rank, lane in sorted(lanes.items())}


def step_window(spans, tracks, step):
    """(start, end, k, steps) of step k (from 1; None: the last): from the
    first rank's end of step k - 1 to the last rank's end of step k."""
    ends = [sorted(s.end for s in spans if s.track == t and s.name == "optimizer step") for t in tracks]
    steps = min(len(e) for e in ends)
    if steps == 0:
        sys.exit("a rank has no 'optimizer step' span: is it a dtp train trace?")
    k = steps if step is None else step
    if not 1 <= k <= steps:
        sys.exit(f"--step {k}: the trace has {steps} step(s)")
    if k == 1:
        start = min(s.start for s in spans if s.track in tracks)
    else:
        start = min(e[k - 2] for e in ends)
    return start, max(e[k - 1] for e in ends), k, steps


def overlap(a, b):
    """Length of the intersection of intervals a and b."""
    return max(0.0, min(a[1], b[1]) - max(a[0], b[0]))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("trace", help="Chrome trace JSON of a DDP run (dtp train --strategy ddp --trace FILE)")
    parser.add_argument("--out", default=None,
                        help="the PNG to write [docs/figures/ddp_overlap_trace.png of this repository]")
    parser.add_argument("--step", type=int, default=None, help="draw training step K (from 1) [the last]")
    parser.add_argument("--ranks", type=lambda t: [int(r) for r in t.split(",") if r != ""], default=None,
                        help="comma list of ranks to draw [all]")
    parser.add_argument("--caption", default=None, help="the line under the plot [the trace file and step]")
    parser.add_argument("--width", type=float, default=10.0, help="figure width in inches [10]")
    parser.add_argument("--dpi", type=int, default=100, help="resolution of the PNG [100]")
    args = parser.parse_args()

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = args.out or os.path.join(root, "docs", "figures", "ddp_overlap_trace.png")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)

    spans, names = spans_and_names(load_events(args.trace))
    lanes = rank_lanes(names)
    if not lanes:
        sys.exit(f"{args.trace}: no 'rank r' threads: not a trace written by dtp train")
    if args.ranks is not None:
        lanes = {r: t for r, t in lanes.items() if r in args.ranks}
        if not lanes:
            sys.exit(f"--ranks {args.ranks}: none of them is in the trace")
    assign_depths(spans)
    lo, hi, k, steps = step_window(spans, [own for own, _ in lanes.values()], args.step)
    ms = 1e-3  # trace times are microseconds
    inside = [s for s in spans if s.end > lo and s.start < hi]

    rows = [track for pair in lanes.values() for track in pair]
    row_of = {track: i for i, track in enumerate(rows)}
    figure, axes = plt.subplots(figsize=(args.width, 1.6 + 0.45 * len(rows)), dpi=args.dpi)
    used, summary = set(), []
    for rank, (own, comm) in lanes.items():
        backward = [s for s in inside if s.track == own and s.depth == 0 and s.category == "compute"
                    and s.name.endswith("backward")]
        band = (min(s.start for s in backward), max(s.end for s in backward)) if backward else None
        if band:  # behind both lanes of the rank
            axes.add_patch(Rectangle(((band[0] - lo) * ms, row_of[own] - 0.5), (band[1] - band[0]) * ms, 2,
                                     color=BACKWARD_BAND, zorder=0, linewidth=0))
        buckets = sorted((s for s in inside if s.track == comm and s.depth == 0), key=lambda s: s.start)
        total = sum(min(s.end, hi) - max(s.start, lo) for s in buckets)
        hidden = sum(overlap((s.start, s.end), band) for s in buckets) if band else 0.0
        if buckets:
            summary.append(f"rank {rank}: {hidden * ms:.1f} of {total * ms:.1f} ms during backward")
        for number, s in enumerate(buckets, 1):
            s.label = f"AR{number}"
        for s in inside:
            if s.track not in (own, comm):
                continue
            y = row_of[s.track]
            if s.track == own and s.name == "iall_reduce":  # the moment a bucket is started
                axes.plot([(s.start - lo) * ms] * 2, [y + 0.42, y + 0.5], color="black", linewidth=1, zorder=3)
                continue
            if s.depth != 0:
                continue
            kind = kind_of(s, s.track == comm)
            if kind is None:
                continue
            used.add(kind)
            start, end = max(s.start, lo), min(s.end, hi)
            axes.barh(y, (end - start) * ms, left=(start - lo) * ms, height=0.7, color=COLOURS[kind],
                      edgecolor="black", linewidth=0.3, zorder=2)
            label = getattr(s, "label", None) or short_name(s)
            if (end - start) / (hi - lo) > 0.011 * len(label):
                axes.text(((start + end) / 2 - lo) * ms, y, label, ha="center", va="center", fontsize=7,
                          color="white", zorder=4, clip_on=True)

    axes.set_yticks(range(len(rows)))
    axes.set_yticklabels([names.get(t, f"tid {t[1]}") for t in rows], fontsize=9)
    axes.set_ylim(len(rows) - 0.5, -0.5)
    axes.set_xlim(0, (hi - lo) * ms)
    axes.set_xlabel("time (ms from the start of the step)")
    axes.grid(True, axis="x", alpha=0.3)
    title = f"DDP, {len(lanes)} ranks: bucket all-reduces (comm lanes) during backward (shaded)"
    axes.set_title(title + "\n" + "; ".join(summary), fontsize=10, loc="left")
    handles = [Patch(color=COLOURS[key], label=key) for key in COLOURS if key in used]
    handles.append(Patch(color=BACKWARD_BAND, label="backward pass"))
    height = figure.get_figheight()
    figure.legend(handles=handles, fontsize=8, loc="lower center", bbox_to_anchor=(0.5, 0.18 / height),
                  ncol=len(handles), frameon=False)
    caption = args.caption or f"trace: {os.path.basename(args.trace)}, step {k} of {steps}"
    figure.text(0.5, 0.04 / height, caption + "; black ticks: a bucket's iall_reduce is started", ha="center",
                va="bottom", fontsize=7, color="0.35")
    figure.tight_layout(rect=(0, 0.5 / height, 1, 1))
    figure.savefig(out)
    plt.close(figure)
    print(f"{out} ({os.path.getsize(out) // 1024} KiB)")


if __name__ == "__main__":
    main()
