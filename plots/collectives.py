#!/usr/bin/python3
"""Bus bandwidth against message size, from dtp-bench-collectives JSON lines.

    /usr/bin/python3 plots/collectives.py bench/results/collectives-*.jsonl

One PNG per (operation, backend, device, world) found in the files, written to
docs/figures/collectives-<op>-<backend>-<device>-w<world>.png:

- a solid line per implementation: the measured busbw (nccl-tests' definition);
- a dashed line of the same colour: the alpha-beta model's prediction for it;
- grey dots: the memory roofline at each size (the busbw the operation would
  reach moving its fewest bytes as fast as every rank copying at once), and a
  grey horizontal line at the roofline of the largest size.

When several lines measure the same (implementation, size), the last one read
wins, so pass older files first. Needs matplotlib (Debian's python3-matplotlib,
which only /usr/bin/python3 sees).
"""
import argparse
import os
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from _bench_json import figure_folder, provenance, read_rows  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

# Table order of bench/collectives/collective_table.cpp, so colours stay the same across figures.
IMPL_ORDER = ["library", "native", "ring", "tree", "halving_doubling", "direct", "parameter_server", "pairwise"]
COLOURS = dict(zip(IMPL_ORDER, ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#17becf"]))


def size_label(nbytes, _pos=None):
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= scale:
            value = nbytes / scale
            return f"{value:.0f}{unit}" if value == int(value) else f"{value:.1f}{unit}"
    return f"{nbytes:.0f}"


def plot_group(key, rows, out_dir):
    op, backend, device, world = key
    measured = defaultdict(dict)  # impl -> bytes -> row
    roofline = {}  # bytes -> row
    for row in rows:
        if row.get("what") == "roofline":
            roofline[row["bytes"]] = row
        else:
            measured[row["impl"]][row["bytes"]] = row
    if not measured:
        return None

    figure, axes = plt.subplots(figsize=(11.5, 5.4), dpi=120)
    impls = sorted(measured, key=lambda i: IMPL_ORDER.index(i) if i in IMPL_ORDER else len(IMPL_ORDER))
    for impl in impls:
        points = [measured[impl][b] for b in sorted(measured[impl])]
        sizes = [p["bytes"] for p in points]
        colour = COLOURS.get(impl)
        largest = points[-1]
        label = f"{impl}: {largest['busbw_GBps']:.2f} GB/s"
        if largest.get("fraction_of_roofline") is not None:
            label += f", {100 * largest['fraction_of_roofline']:.0f}% of roofline"
        label += f" at {size_label(largest['bytes'])}"
        if any((p.get("wrong") or 0) > 0 for p in points):
            label += " (WRONG RESULTS)"
        axes.plot(sizes, [p["busbw_GBps"] for p in points], "o-", color=colour, label=label,
                  linewidth=1.8, markersize=4)
        predicted = [(p["bytes"], p.get("predicted_busbw_GBps")) for p in points]
        predicted = [(b, v) for b, v in predicted if v]
        if predicted:
            axes.plot([b for b, _ in predicted], [v for _, v in predicted], "--", color=colour,
                      linewidth=1.2, alpha=0.8)

    if roofline:
        sizes = sorted(roofline)
        what = "memcpy" if device == "cpu" else "device-to-device copy"
        axes.plot(sizes, [roofline[b]["busbw_GBps"] for b in sizes], ":", color="0.45", linewidth=1.5,
                  marker=".", label=f"{what} roofline at each size")
        top = roofline[sizes[-1]]
        axes.axhline(top["busbw_GBps"], color="0.3", linewidth=1.2,
                     label=f"{what} roofline at {size_label(top['bytes'])}: {top['busbw_GBps']:.2f} GB/s "
                           f"(copy {top['copy_GBps']:.1f} GB/s, all ranks)")
    # A proxy entry explains the dashed lines once.
    axes.plot([], [], "--", color="0.2", linewidth=1.2, label="dashed: alpha-beta prediction")

    any_row = next(iter(next(iter(measured.values())).values()))
    axes.set_xscale("log", base=2)
    axes.set_yscale("log")
    axes.xaxis.set_major_formatter(FuncFormatter(size_label))
    axes.set_xlabel("size S (bytes; nccl-tests' convention for the operation)")
    axes.set_ylabel("bus bandwidth (GB/s)")
    axes.set_title(f"{op}: {backend}/{device}, {world} ranks, {any_row.get('dtype', '')}", fontsize=12)
    subtitle = (f"{any_row.get('cpu', '')} · host {any_row.get('hostname', '')} · "
                f"{provenance(rows)} · "
                f"model alpha {any_row.get('alpha_us', 0):g} us")
    figure.text(0.5, 0.005, subtitle, ha="center", va="bottom", fontsize=7, color="0.35")
    axes.grid(True, which="major", alpha=0.3)
    axes.grid(True, which="minor", axis="y", alpha=0.1)
    axes.legend(fontsize=7.5, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    figure.tight_layout(rect=(0, 0.025, 1, 1))

    name = f"collectives-{op}-{backend}-{device.replace(':', '')}-w{world}.png"
    path = os.path.join(out_dir, name)
    figure.savefig(path)
    plt.close(figure)
    return path


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="+", help="JSON-lines files written by dtp-bench-collectives --json")
    parser.add_argument("--out", default=None, help="folder for the PNGs [docs/figures of this repository]")
    parser.add_argument("--op", action="append", help="only this operation (repeatable)")
    parser.add_argument("--redop", default="sum", choices=["sum", "avg", "max", "min"],
                        help="the reduction whose rows to draw for all_reduce, reduce_scatter and reduce [sum]")
    args = parser.parse_args()

    out_dir = figure_folder(args.out)

    groups = defaultdict(list)
    for row in read_rows(args.files):
        if row.get("what") not in ("collective", "roofline"):
            continue
        if args.op and row["op"] not in args.op:
            continue
        # One reduction per figure (files written before -o existed summed).
        if row.get("what") == "collective" and row.get("redop", "sum") not in (args.redop, "none"):
            continue
        groups[(row["op"], row["backend"], row["device"], row["world"])].append(row)
    if not groups:
        sys.exit("no dtp-bench-collectives measurements in " + ", ".join(args.files))
    for key in sorted(groups):
        path = plot_group(key, groups[key], out_dir)
        if path:
            print(path)


if __name__ == "__main__":
    main()
