#!/usr/bin/python3
"""Sequence parallelism's load balance and predicted communication, from the lesson's formulas alone.

    /usr/bin/python3 plots/sequence_parallel.py          (or: ./dtp plots sequence_parallel)

Reads no benchmark data: every number comes from the formulas of
chapters/06_sequence_expert/README.md (sections 4 and 6). Writes two PNGs
into docs/figures/ (or --out):

- sp_balance.png: causal ring attention, the work of each rank in full-block
  units (one full block = (T/n) queries x (T/n) keys), for n = 4 and n = 8.
  Contiguous positions: rank r computes r + 1 full blocks. Zigzag: every rank
  computes 2n + 1 half-size blocks of a quarter of the work each, (2n + 1)/4.
  The dashed line is the even share of the causal scores, about n/2.
- sp_comm_tiers.png: one attention layer's forward, per rank, on the
  alpha-beta clock, against the sequence-parallel size n = 2..64, for
  B = 1, T = 128k, H = 32, D = 128 in bf16, on an NVLink tier and an
  InfiniBand tier (the numbers of plots/tp.py and bench/tp_step.cpp:
  3 us and 450 GB/s, 8 us and 50 GB/s). Left: the whole communication
  (Ulysses: 4 all-to-alls of (n-1)/n S; ring: n - 1 transfers of 2S, S =
  B (T/n) H D e), with the attention compute per rank for scale. Middle: one
  ring step, the K,V transfer against the compute it can hide behind.
  Right: the communication left on the critical path once the ring hides
  what it can. The hybrid runs Ulysses on NVLink in groups of u = 8 (one
  node) and the ring across nodes on InfiniBand. Compute: 4 B Tq Tk H D
  flops per block at 400 TFLOP/s (an H100 in bf16, an estimate).

Needs matplotlib (Debian's python3-matplotlib, which only /usr/bin/python3
sees); started by another python3, the script hands itself to /usr/bin/python3.
"""
import argparse
import os
import sys

try:
    import matplotlib
except ImportError:
    SYSTEM_PYTHON = "/usr/bin/python3"
    if os.path.realpath(sys.executable) != os.path.realpath(SYSTEM_PYTHON) and os.access(SYSTEM_PYTHON, os.X_OK):
        os.execv(SYSTEM_PYTHON, [SYSTEM_PYTHON] + sys.argv)
    sys.exit("sequence_parallel.py needs matplotlib: apt-get install python3-matplotlib (for /usr/bin/python3)")

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _bench_json import figure_folder  # noqa: E402

# The model of the lesson's section 6.
BATCH = 1
SEQUENCE = 128 * 1024
HEADS = 32
HEAD_DIM = 128
ELEMENT_BYTES = 2  # bf16
FLOPS = 400e12  # an H100's dense bf16 rate, the estimate plots/tp.py uses
HYBRID_GROUP = 8  # Ulysses inside a node of 8 GPUs
DEGREES = [2, 4, 8, 16, 32, 64]

# The tiers of plots/tp.py (bench/tp_step.cpp): alpha in seconds, bandwidth in bytes/s.
TIERS = {"NVLink": (3e-6, 450e9), "InfiniBand": (8e-6, 50e9)}
TIER_COLOURS = {"NVLink": "#2ca02c", "InfiniBand": "#9467bd"}
LAYOUT_COLOURS = {"contiguous": "#d62728", "zigzag": "#1f77b4"}
HYBRID_COLOUR = "#ff7f0e"


# --- the formulas ---------------------------------------------------------------------------

def local_bytes(n):
    """S: one rank's q (or k, v, out) [B, T/n, H, D] in bytes."""
    return BATCH * (SEQUENCE / n) * HEADS * HEAD_DIM * ELEMENT_BYTES


def all_to_all_time(n, nbytes, tier):
    """The clock's all-to-all of a buffer of nbytes per rank: (n-1) alpha + (n-1)/n bytes beta."""
    alpha, bandwidth = tier
    return (n - 1) * alpha + (n - 1) / n * nbytes / bandwidth


def ulysses_time(n, tier):
    """Four all-to-alls (q, k, v, out) of S bytes; None when the heads do not split."""
    if HEADS % n:
        return None
    return 4 * all_to_all_time(n, local_bytes(n), tier)


def transfer_time(n, tier):
    """One ring step: k and v of one block, 2S bytes, as one message."""
    alpha, bandwidth = tier
    return alpha + 2 * local_bytes(n) / bandwidth


def ring_time(n, tier):
    """n - 1 transfers, none hidden."""
    return (n - 1) * transfer_time(n, tier)


def block_compute(positions, heads):
    """Forward flops of one unmasked block, positions x positions, on `heads` heads, in seconds."""
    return 4 * BATCH * positions * positions * heads * HEAD_DIM / FLOPS


def step_compute(n):
    """Causal work per ring step with balanced (zigzag) blocks: half a full block."""
    return 0.5 * block_compute(SEQUENCE / n, HEADS)


def attention_compute(n):
    """The forward attention per rank with zigzag: (2n + 1) quarter blocks."""
    return (2 * n + 1) / 4 * block_compute(SEQUENCE / n, HEADS)


def ring_exposed(n, tier, compute_per_step):
    """What the ring leaves on the critical path: (n - 1) max(0, transfer - compute)."""
    return (n - 1) * max(0.0, transfer_time(n, tier) - compute_per_step)


def hybrid_parts(n, u=HYBRID_GROUP):
    """(Ulysses on NVLink in groups of u, ring across the n/u groups on InfiniBand,
    compute per ring step), or None when n is not a multiple of u or u does not divide H."""
    if n % u or HEADS % u:
        return None
    groups = n // u
    ulysses = 4 * all_to_all_time(u, local_bytes(n), TIERS["NVLink"])
    ring = (groups - 1) * transfer_time(n, TIERS["InfiniBand"])
    # After Ulysses a rank holds u T/n positions of H/u heads: u times the work per block.
    compute = 0.5 * block_compute(u * SEQUENCE / n, HEADS // u)
    return ulysses, ring, compute


def hybrid_time(n):
    parts = hybrid_parts(n)
    return None if parts is None else parts[0] + parts[1]


def hybrid_exposed(n):
    parts = hybrid_parts(n)
    if parts is None:
        return None
    ulysses, _, compute = parts
    groups = n // HYBRID_GROUP
    step = transfer_time(n, TIERS["InfiniBand"])
    return ulysses + (groups - 1) * max(0.0, step - compute)


def contiguous_work(n):
    """Full blocks per rank with contiguous positions: r + 1."""
    return [r + 1 for r in range(n)]


def zigzag_work(n):
    """Every rank: 2n + 1 half-size blocks, each a quarter of a full block."""
    return [(2 * n + 1) / 4 for _ in range(n)]


# --- the figures ----------------------------------------------------------------------------

def model_line():
    return (f"B = {BATCH}, T = {SEQUENCE // 1024}k, H = {HEADS}, D = {HEAD_DIM}, bf16: "
            f"B T H D e = {BATCH * SEQUENCE * HEADS * HEAD_DIM * ELEMENT_BYTES / 2**30:g} GiB per q, k, v or out")


def plot_balance(path):
    figure, panels = plt.subplots(1, 2, figsize=(12.5, 4.8), dpi=120, gridspec_kw={"width_ratios": [1, 1.8]})
    width = 0.38
    for axes, n in zip(panels, (4, 8)):
        ranks = list(range(n))
        contiguous = contiguous_work(n)
        zigzag = zigzag_work(n)
        axes.bar([r - width / 2 for r in ranks], contiguous, width, color=LAYOUT_COLOURS["contiguous"],
                 label="contiguous: r + 1 full blocks")
        axes.bar([r + width / 2 for r in ranks], zigzag, width, color=LAYOUT_COLOURS["zigzag"],
                 label=f"zigzag: 2n + 1 = {2 * n + 1} quarter blocks")
        for r in ranks:
            axes.annotate(f"{contiguous[r]}", (r - width / 2, contiguous[r]), textcoords="offset points",
                          xytext=(0, 3), ha="center", fontsize=8, color=LAYOUT_COLOURS["contiguous"])
            axes.annotate(f"{zigzag[r]:g}", (r + width / 2, zigzag[r]), textcoords="offset points",
                          xytext=(0, 3), ha="center", fontsize=8, color=LAYOUT_COLOURS["zigzag"])
        axes.axhline(n / 2, color="0.3", linestyle="--", linewidth=1.0,
                     label=f"even share of the causal scores: about n/2 = {n / 2:g}")
        axes.set_xticks(ranks)
        axes.set_xlabel("rank r")
        axes.set_ylabel("attention work, forward (full blocks)")
        axes.set_ylim(0, n * 1.25)
        axes.grid(True, axis="y", alpha=0.3)
        slowest = f"slowest rank: {max(contiguous)} against {max(zigzag):g} ({max(contiguous) / max(zigzag):.2f}x)"
        axes.set_title(f"n = {n}: {slowest}", fontsize=10)
        axes.legend(fontsize=8, loc="upper left")
    figure.suptitle("Causal ring attention: work per rank, contiguous positions against zigzag\n"
                    "(a full block is T/n queries x T/n keys; a zigzag block is T/2n x T/2n, a quarter of it; "
                    "diagonal blocks counted whole, as attend_block counts them)", fontsize=10)
    figure.text(0.5, 0.005, "plots/sequence_parallel.py · from the formulas of chapters/06_sequence_expert/README.md, "
                "section 4 (no measurement)", ha="center", va="bottom", fontsize=7, color="0.35")
    figure.tight_layout(rect=(0, 0.03, 1, 0.92))
    figure.savefig(path)
    plt.close(figure)


def series(function, *args):
    xs, ys = [], []
    for n in DEGREES:
        value = function(n, *args)
        if value is not None:
            xs.append(n)
            ys.append(value * 1e3)
    return xs, ys


def plot_comm_tiers(path):
    figure, (total, step, exposed) = plt.subplots(1, 3, figsize=(17.5, 6.0), dpi=120)
    ms = 1e3

    # Left: all the communication of one layer's forward, and the compute for scale.
    for name, tier in TIERS.items():
        colour = TIER_COLOURS[name]
        xs, ys = series(ulysses_time, tier)
        total.plot(xs, ys, "o-", color=colour, linewidth=2.0, markersize=5)
        xs, ys = series(ring_time, tier)
        total.plot(xs, ys, "s--", color=colour, linewidth=1.6, markersize=5)
    xs, ys = series(hybrid_time)
    total.plot(xs, ys, "D-.", color=HYBRID_COLOUR, linewidth=1.8, markersize=5)
    xs, ys = series(attention_compute)
    total.plot(xs, ys, "^:", color="0.45", linewidth=1.4, markersize=5)
    total.plot([64], [ulysses_time(32, TIERS["NVLink"]) * ms], "x", color="0.3", markersize=9)
    total.annotate(f"no Ulysses at n = 64:\nH = {HEADS} heads", (64, ulysses_time(32, TIERS["NVLink"]) * ms),
                   textcoords="offset points", xytext=(0, 10), ha="center", fontsize=7, color="0.3")
    total.set_title("All the communication (nothing hidden)", fontsize=10)
    total.set_ylabel("time per rank, one attention layer, forward (ms)")

    # Middle: one ring step: the transfer against the compute beside it.
    for name, tier in TIERS.items():
        xs, ys = series(lambda n, t=tier: transfer_time(n, t))
        step.plot(xs, ys, "s--", color=TIER_COLOURS[name], linewidth=1.6, markersize=5)
    xs, ys = series(step_compute)
    step.plot(xs, ys, "^:", color="0.45", linewidth=1.4, markersize=5)
    xs, ys = series(lambda n: None if hybrid_parts(n) is None else hybrid_parts(n)[2])
    step.plot(xs, ys, "v:", color=HYBRID_COLOUR, linewidth=1.4, markersize=5)
    for name, (_, bandwidth) in TIERS.items():
        tokens = ELEMENT_BYTES * FLOPS / bandwidth  # T/n at which a step's compute covers its transfer
        crossing = SEQUENCE / tokens
        step.axvline(crossing, color=TIER_COLOURS[name], linewidth=0.9, alpha=0.7)
        step.annotate(f"{name}: hidden for\nn <= {crossing:.1f}\n(T/n >= e F / W\n= {tokens:,.0f})",
                      (crossing, 0.97), xycoords=("data", "axes fraction"), textcoords="offset points",
                      xytext=(-4, 0), ha="right", va="top", fontsize=7, color=TIER_COLOURS[name])
    step.set_xlim(1.7, 90)
    step.set_title("One ring step: K,V transfer against the compute it overlaps", fontsize=10)
    step.set_ylabel("time per ring step (ms)")

    # Right: what is left on the critical path.
    for name, tier in TIERS.items():
        colour = TIER_COLOURS[name]
        xs, ys = series(ulysses_time, tier)
        exposed.plot(xs, ys, "o-", color=colour, linewidth=2.0, markersize=5)
        xs, ys = series(lambda n, t=tier: ring_exposed(n, t, step_compute(n)))
        exposed.plot(xs, ys, "s--", color=colour, linewidth=1.6, markersize=5)
    xs, ys = series(hybrid_exposed)
    exposed.plot(xs, ys, "D-.", color=HYBRID_COLOUR, linewidth=1.8, markersize=5)
    exposed.set_title("Left on the critical path once the ring overlaps", fontsize=10)
    exposed.set_ylabel("exposed communication, one layer, forward (ms)")
    exposed.set_ylim(bottom=-1)
    exposed.text(0.03, 0.95, "ring on NVLink: 0 at every n (all hidden)\nring on InfiniBand: hidden up to n = 8",
                 transform=exposed.transAxes, va="top", fontsize=8, color="0.25")

    for axes in (total, step, exposed):
        axes.set_xscale("log", base=2)
        axes.set_xticks(DEGREES)
        axes.set_xticklabels([str(n) for n in DEGREES])
        axes.set_xlabel("sequence-parallel size n (GPUs)")
        axes.grid(True, which="both", alpha=0.3)
    total.set_yscale("log")
    step.set_yscale("log")

    handles = []
    for name, (alpha, bandwidth) in TIERS.items():
        handles.append(Line2D([], [], color=TIER_COLOURS[name], linewidth=2,
                              label=f"{name}: alpha {alpha * 1e6:g} us, {bandwidth / 1e9:g} GB/s"))
    handles += [
        Line2D([], [], color="0.3", marker="o", linestyle="-", label="Ulysses: 4 all-to-alls of (n-1)/n S"),
        Line2D([], [], color="0.3", marker="s", linestyle="--", label="ring: n - 1 transfers of 2S (k and v)"),
        Line2D([], [], color=HYBRID_COLOUR, marker="D", linestyle="-.",
               label=f"hybrid: Ulysses in groups of u = {HYBRID_GROUP} on NVLink, ring across on InfiniBand"),
        Line2D([], [], color="0.45", marker="^", linestyle=":",
               label=f"attention compute (causal, zigzag) at {FLOPS / 1e12:g} TFLOP/s; middle: per ring step"),
        Line2D([], [], color=HYBRID_COLOUR, marker="v", linestyle=":",
               label="hybrid: compute per ring step (u times larger blocks)"),
    ]
    figure.legend(handles=handles, loc="lower center", ncol=4, fontsize=8, frameon=False,
                  bbox_to_anchor=(0.5, 0.035))
    figure.suptitle("Sequence-parallel attention on the alpha-beta clock, per rank and layer, forward\n" + model_line()
                    + "; S = B (T/n) H D e", fontsize=11)
    figure.text(0.5, 0.005, "plots/sequence_parallel.py · the formulas of chapters/06_sequence_expert/README.md, "
                "section 6 (no measurement); tiers as plots/tp.py; a group spanning nodes runs at the slower tier",
                ha="center", va="bottom", fontsize=7, color="0.35")
    figure.tight_layout(rect=(0, 0.11, 1, 0.93))
    figure.savefig(path)
    plt.close(figure)


def print_table():
    """The numbers behind the figure, as the lesson's table shows them."""
    print(f"{'n':>3} {'S MB':>7} {'Uly NV':>8} {'Uly IB':>8} {'ring NV':>8} {'ring IB':>8} {'step NV':>8} "
          f"{'step IB':>8} {'compute/step':>12} {'attention':>10} {'hybrid':>8} {'exposed: ring IB':>16} "
          f"{'hybrid':>8}   (ms)")
    for n in DEGREES:
        uly = [ulysses_time(n, t) for t in TIERS.values()]
        hybrid, hybrid_left = hybrid_time(n), hybrid_exposed(n)

        def fmt(value, width=8):
            return f"{'-':>{width}}" if value is None else f"{value * 1e3:>{width}.2f}"

        print(f"{n:>3} {local_bytes(n) / 1e6:>7.1f} {fmt(uly[0])} {fmt(uly[1])} "
              f"{fmt(ring_time(n, TIERS['NVLink']))} {fmt(ring_time(n, TIERS['InfiniBand']))} "
              f"{fmt(transfer_time(n, TIERS['NVLink']))} {fmt(transfer_time(n, TIERS['InfiniBand']))} "
              f"{fmt(step_compute(n), 12)} {fmt(attention_compute(n), 10)} {fmt(hybrid)} "
              f"{fmt(ring_exposed(n, TIERS['InfiniBand'], step_compute(n)), 16)} {fmt(hybrid_left)}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=None, help="folder for the PNGs [docs/figures of this repository]")
    parser.add_argument("--table", action="store_true", help="also print the numbers behind sp_comm_tiers.png")
    args = parser.parse_args()
    out_dir = figure_folder(args.out)
    for name, plot in (("sp_balance.png", plot_balance), ("sp_comm_tiers.png", plot_comm_tiers)):
        path = os.path.join(out_dir, name)
        plot(path)
        print(path)
    if args.table:
        print_table()


if __name__ == "__main__":
    main()
