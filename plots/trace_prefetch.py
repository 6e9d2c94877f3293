#!/usr/bin/python3
"""A timeline picture of Chrome trace JSON written by DTP (`dtp train --trace FILE`).

    /usr/bin/python3 plots/trace_prefetch.py zero3.json zero3-prefetch.json \\
        --titles "ZeRO-3" "ZeRO-3 + prefetch" --out docs/figures/zero_prefetch_trace.png

One panel per trace file, stacked, all on the same time scale (milliseconds
from the start of each panel's window), so that their lengths compare. In a panel, one row per track: DTP writes
rank r as process (pid) r with two threads: tid 0, its own thread (compute,
and the communication it waits for), and tid 1, its communication thread
(non-blocking collectives such as Comm::iall_gather), named "rank r" and
"rank r comm" by thread_name metadata events. Every complete
event ("ph":"X", ts and dur in microseconds) is a bar; spans nested in
another span of the same row are drawn thinner, inside it. Colour by
category: compute spans by phase (forward, backward, optimizer step), comm
spans by operation (all_gather, reduce_scatter, all_reduce, ...).

The window: by default the last complete training step of the first row
shown (from the end of the previous "optimizer step" span to the end of the
last one); --step K picks step K (from 1), --from-ms/--to-ms any window, and
--all the whole trace. A trace whose run was killed lacks its closing "]}";
it is read anyway. Any Chrome trace with X events can be drawn; rows are then
named by their thread_name metadata, or "pid P tid T".

Needs matplotlib (Debian's python3-matplotlib, which only /usr/bin/python3 sees).
"""
import argparse
import json
import os
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

COMPUTE_COLOURS = {"forward": "#4c72b0", "backward": "#dd8452", "optimizer step": "#55a868",
                   "compute": "#8c8c8c"}
COMM_COLOURS = {"all_gather": "#c44e52", "reduce_scatter": "#8172b3", "all_reduce": "#937860",
                "wait": "#da8bc3", "broadcast": "#64b5cd", "send": "#ccb974", "recv": "#ccb974",
                "isend": "#ccb974", "comm": "#b0b0b0"}
OTHER_COLOURS = ["#64b5cd", "#ccb974", "#8c8c8c", "#17becf", "#bcbd22"]


def load_events(path):
    """The trace's events; tolerates a file without its closing (a killed run)."""
    with open(path) as f:
        text = f.read()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        repaired = text.rstrip().rstrip(",")
        if not repaired.endswith("]}"):
            repaired += "]}"
        try:
            data = json.loads(repaired)
        except json.JSONDecodeError as error:
            sys.exit(f"{path}: not Chrome trace JSON: {error}")
    events = data.get("traceEvents", []) if isinstance(data, dict) else data
    if not isinstance(events, list):
        sys.exit(f"{path}: no traceEvents list")
    return events


class Span:
    def __init__(self, event):
        self.name = str(event.get("name", ""))
        self.category = str(event.get("cat", ""))
        self.track = (event.get("pid", 0), event.get("tid", 0))
        self.start = float(event.get("ts", 0.0))
        self.end = self.start + float(event.get("dur", 0.0))
        self.depth = 0


def spans_and_names(events):
    names, spans = {}, []
    for event in events:
        phase = event.get("ph")
        if phase == "M" and event.get("name") == "thread_name":
            names[(event.get("pid", 0), event.get("tid", 0))] = str(event.get("args", {}).get("name", ""))
        elif phase == "X" and "ts" in event:
            spans.append(Span(event))
    return spans, names


def colour_key(span):
    """The legend entry a span belongs to."""
    if span.category == "compute":
        if span.name == "optimizer step":
            return "optimizer step"
        if span.name.endswith("backward"):
            return "backward"
        if span.name.endswith("forward"):
            return "forward"
        return "compute"
    if span.category == "comm":
        return span.name if span.name in COMM_COLOURS else "comm"
    return span.category or "other"


def colour_of(key, others):
    if key in COMPUTE_COLOURS:
        return COMPUTE_COLOURS[key]
    if key in COMM_COLOURS:
        return COMM_COLOURS[key]
    if key not in others:
        others[key] = OTHER_COLOURS[len(others) % len(OTHER_COLOURS)]
    return others[key]


def assign_depths(spans):
    """Nesting depth of each span among the spans of its own track."""
    by_track = {}
    for s in spans:
        by_track.setdefault(s.track, []).append(s)
    for track_spans in by_track.values():
        track_spans.sort(key=lambda s: (s.start, -s.end))
        open_ends = []
        for s in track_spans:
            while open_ends and open_ends[-1] <= s.start:
                open_ends.pop()
            s.depth = len(open_ends)
            open_ends.append(s.end)


def rank_of(name):
    match = re.fullmatch(r"rank (\d+)( comm)?", name or "")
    return int(match.group(1)) if match else None


def rows_to_draw(spans, names, ranks):
    """The tracks to draw, in order. DTP traces (rows named "rank r" and
    "rank r comm") get both lanes of every rank shown, an empty
    communication lane included: that it is empty is worth seeing."""
    tracks = {s.track for s in spans}
    dtp_ranks = {}
    for track in tracks | set(names):
        rank = rank_of(names.get(track))
        if rank is not None:
            dtp_ranks.setdefault(rank, track[0])  # rank -> pid
    if dtp_ranks:
        for rank, pid in dtp_ranks.items():
            for lane in (0, 1):
                track = (pid, lane)  # DTP: pid = rank, tid = lane
                names.setdefault(track, f"rank {rank}" + (" comm" if lane else ""))
                tracks.add(track)
    if ranks is not None:
        tracks = {t for t in tracks if rank_of(names.get(t)) is None or rank_of(names.get(t)) in set(ranks)}
    return sorted(tracks)


def choose_window(spans, rows, args):
    """(start, end) in microseconds."""
    first, last = min(s.start for s in spans), max(s.end for s in spans)
    if args.from_ms is not None or args.to_ms is not None:
        # DTP's times are on the wall clock: the window counts from the first span.
        lo = first if args.from_ms is None else first + args.from_ms * 1e3
        hi = last if args.to_ms is None else first + args.to_ms * 1e3
        return lo, hi
    if args.all:
        return first, last
    steps = sorted((s for s in spans if s.track == rows[0] and s.name == "optimizer step"), key=lambda s: s.end)
    if not steps:
        return first, last
    k = len(steps) if args.step is None else args.step
    if not 1 <= k <= len(steps):
        sys.exit(f"--step {k}: the trace has {len(steps)} step(s) on its first row")
    start = first if k == 1 else steps[k - 2].end
    return start, steps[k - 1].end


def draw_panel(axes, path, title, args, others, used):
    spans, names = spans_and_names(load_events(path))
    if not spans:
        sys.exit(f"{path}: no complete ('X') events to draw")
    tracks = rows_to_draw(spans, names, args.ranks)
    if not tracks:
        sys.exit(f"{path}: no rows left to draw (--ranks {args.ranks})")
    spans = [s for s in spans if s.track in tracks]
    assign_depths(spans)
    lo, hi = choose_window(spans, tracks, args)
    row_of = {t: i for i, t in enumerate(tracks)}
    scale = 1e-3  # microseconds -> milliseconds
    span_ms = max((hi - lo) * scale, 1e-9)
    for s in sorted(spans, key=lambda s: s.depth):
        if s.end <= lo or s.start >= hi:
            continue
        start, end = max(s.start, lo), min(s.end, hi)
        key = colour_key(s)
        used.setdefault(key, colour_of(key, others))
        height = 0.8 * (0.62 ** s.depth)
        y = row_of[s.track]
        axes.barh(y, (end - start) * scale, left=(start - lo) * scale, height=height, color=used[key],
                  edgecolor="black" if s.depth == 0 else "white", linewidth=0.3 if s.depth == 0 else 0.6)
        # A label where the bar is wide enough to hold it (outer spans only).
        if s.depth == 0 and args.labels:
            label = short_name(s)
            if (end - start) * scale / span_ms > 0.0095 * len(label):
                axes.text((start + end) / 2 * scale - lo * scale, y, label, ha="center", va="center", fontsize=6,
                          color="white", clip_on=True)
    axes.set_yticks(range(len(tracks)))
    axes.set_yticklabels([names.get(t) or f"pid {t[0]} tid {t[1]}" for t in tracks], fontsize=8)
    axes.set_ylim(len(tracks) - 0.5, -0.5)
    axes.set_xlim(0, span_ms)
    axes.grid(True, axis="x", alpha=0.3)
    axes.set_title(title, fontsize=10, loc="left")
    return span_ms


def short_name(span):
    """'block.2 forward' -> 'b2 F', 'embedding backward' -> 'emb B', ..."""
    name = span.name
    name = re.sub(r"^block\.(\d+)", r"b\1", name)
    name = name.replace("embedding", "emb").replace("optimizer step", "opt")
    name = re.sub(r" forward$", " F", name)
    name = re.sub(r" backward$", " B", name)
    name = name.replace("all_gather", "AG").replace("reduce_scatter", "RS").replace("all_reduce", "AR")
    return name


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="+", help="Chrome trace JSON files (dtp train --trace FILE)")
    parser.add_argument("--titles", nargs="+", help="one title per file [the file names]")
    parser.add_argument("--out", default=None,
                        help="the PNG to write [docs/figures/zero_prefetch_trace.png of this repository]")
    parser.add_argument("--ranks", type=lambda t: [int(r) for r in t.split(",") if r != ""], default=None,
                        help="comma list of ranks to show [all]")
    parser.add_argument("--step", type=int, default=None, help="show training step K (from 1) [the last]")
    parser.add_argument("--all", action="store_true", help="show the whole trace")
    parser.add_argument("--from-ms", type=float, default=None, help="window start, ms after the first span")
    parser.add_argument("--to-ms", type=float, default=None, help="window end, ms after the first span")
    parser.add_argument("--no-labels", dest="labels", action="store_false", help="no span names on the bars")
    parser.add_argument("--caption", default="", help="a line of text under the panels (e.g. the revision)")
    args = parser.parse_args()
    if args.titles and len(args.titles) != len(args.files):
        sys.exit(f"--titles: {len(args.titles)} title(s) for {len(args.files)} file(s)")

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = args.out or os.path.join(root, "docs", "figures", "zero_prefetch_trace.png")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)

    rows = []
    for path in args.files:
        spans, names = spans_and_names(load_events(path))
        rows.append(max(len(rows_to_draw(spans, names, args.ranks)), 1))
    figure, axes_list = plt.subplots(len(args.files), 1, figsize=(12.5, 1.2 + 0.55 * sum(rows) + 0.5 * len(rows)),
                                     dpi=120, squeeze=False, gridspec_kw={"height_ratios": rows})
    others, used = {}, {}
    widths = []
    for i, path in enumerate(args.files):
        title = args.titles[i] if args.titles else os.path.basename(path)
        widths.append(draw_panel(axes_list[i][0], path, title, args, others, used))
    # One time scale for every panel, so that the panels' lengths compare.
    for row in axes_list:
        row[0].set_xlim(0, max(widths))
    axes_list[-1][0].set_xlabel("time (ms from the start of the window shown)")
    order = list(COMPUTE_COLOURS) + list(COMM_COLOURS) + list(others)
    handles = [Patch(color=used[k], label=k) for k in order if k in used]
    figure.legend(handles=handles, fontsize=8, loc="upper right", ncol=min(len(handles), 8), frameon=False)
    caption = args.caption or ("trace: " + ", ".join(os.path.basename(p) for p in args.files))
    figure.text(0.5, 0.005, caption, ha="center", va="bottom", fontsize=7, color="0.35")
    figure.tight_layout(rect=(0, 0.03, 1, 0.95))
    figure.savefig(out)
    plt.close(figure)
    print(out)


if __name__ == "__main__":
    main()
