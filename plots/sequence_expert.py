#!/usr/bin/python3
"""Sequence-parallel attention and mixture-of-experts capacity, from dtp-bench-sequence-expert JSON lines.

    /usr/bin/python3 plots/sequence_expert.py bench/results/sequence-expert-thread-cpu-*.jsonl
    (or: ./dtp plots sequence_expert bench/results/sequence-expert-thread-cpu-*.jsonl)

Writes five PNGs into docs/figures/ (or --out):

- sp_attention_time.png ("sp_attention" lines): forward + backward of causal
  attention on [B, T/n, H, D] shards. Left: the busiest rank's thread CPU
  time against T at the largest n, each method, and the single-device peer
  (flash attention on the whole sequence). Middle: the busiest rank's CPU
  time over the peer's at the largest T, against n; lines: the share of the
  causal scores the busiest rank computes (1/n for Ulysses and zigzag,
  (2n - 1)/n^2 for the contiguous ring). Right: the wall time of the slowest
  rank at the largest T, against n; the ranks are threads sharing the
  machine's cores, so the dotted line, the peer's time over min(n, cores),
  is the best they can do.
- sp_attention_memory.png: per rank. Left: what each method keeps from
  forward to backward against T, every n; dashed: the lesson's q, k, v,
  output and statistics, (4 B (T/n) H D + 2 B H (T/n)) e. Right: the rank's
  tracker peak (input shards included) at the largest T, against n, with the
  peer's peak / n dashed; hollow markers: the part the thread backend's
  message copies hold (MemoryCategory::comm).
- sp_ulysses_vs_ring.png ("sp_comm_tiers" lines): bytes each rank sends,
  forward + backward (left), and the alpha-beta clock, communication only
  (right), against n, NVLink and InfiniBand; markers measured, lines the
  lesson's section-6 formulas.
- moe_capacity.png ("moe_capacity" lines): top, the share of the N k choices
  dropped against the capacity factor (mean over the blocks), at init and
  after training with aux_loss_coef 0 and 0.01, next to a router choosing
  uniformly at random (exact) and the floor 1 - E c / (N k) that any router
  meets; bottom, each block's load balance max_e f_e / mean.
- sp_ep_training.png ("sp_ep_train_step" lines): whole training steps of
  `--strategy sp` (each kind) and `--strategy ep` against their one-device
  peers (the dense model; the MoE with m routing groups), against n. Left:
  the busiest rank's thread CPU time over the peer's; middle: the largest
  rank's activation peak over the peer's, both with 1/n dashed; right: the
  bytes a rank moves per step, markers measured, dotted the lesson's
  sections 6 and 7.

When several runs are given, the last line of each configuration wins, so
pass older files first. Needs matplotlib (Debian's python3-matplotlib, which
only /usr/bin/python3 sees).
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
METHODS = ["ulysses", "ring", "zigzag", "hybrid"]
COLOURS = {"flash": "black", "ulysses": "#1f77b4", "ring": "#d62728", "zigzag": "#2ca02c", "hybrid": "#9467bd"}
MARKERS = {"flash": "*", "ulysses": "o", "ring": "s", "zigzag": "^", "hybrid": "D"}
TIER_STYLES = {"NVLink": "-", "InfiniBand": "--"}


def method_label(method):
    return {"flash": "flash attention, one rank (peer)", "ulysses": "Ulysses", "ring": "ring, contiguous",
            "zigzag": "ring, zigzag", "hybrid": "hybrid (u = n/2)"}.get(method, method)


def shape_line(r):
    return f"B = {r['batch']}, H = {r['heads']}, D = {r['head_dim']}, {r['dtype']}"


def last_by(rows, key):
    """The last row of each key(row): later runs replace earlier ones."""
    table = {}
    for r in rows:
        table[key(r)] = r
    return table


# --- attention: time -----------------------------------------------------------------------

def share(method, n, u):
    if method in ("ulysses", "zigzag"):
        return 1.0 / n
    if method == "ring":
        return (2 * n - 1) / (n * n)
    if method == "hybrid":
        g = n // u
        return (2 * g - 1) / (g * g) / u
    return 1.0


def plot_attention_time(rows, path):
    table = last_by(rows, lambda r: (r["method"], r["sp"], r["seq"]))
    seqs = sorted({r["seq"] for r in rows})
    top_t = seqs[-1]
    flash = {t: table[("flash", 1, t)] for t in seqs if ("flash", 1, t) in table}
    cores = rows[-1].get("cores") or 1
    figure, (by_t, by_n, wall) = plt.subplots(1, 3, figsize=(17.5, 5.6), dpi=120)

    # Left: busiest rank's CPU time against T at the largest n.
    top_n = max(r["sp"] for r in rows if r["method"] != "flash")
    if flash:
        ts = sorted(flash)
        by_t.plot(ts, [flash[t]["cpu_s_busiest_rank"] * 1e3 for t in ts], "*-", color="black", markersize=10,
                  linewidth=1.6, label=method_label("flash"))
        # T^2 through the peer's largest point: attention's work.
        by_t.plot(ts, [flash[ts[-1]]["cpu_s_busiest_rank"] * 1e3 * (t / ts[-1]) ** 2 for t in ts], ":",
                  color="0.5", linewidth=1.0, label="T^2 through the peer's largest T")
    for method in METHODS:
        points = sorted((t, table[(method, top_n, t)]) for t in seqs if (method, top_n, t) in table)
        if not points:
            continue
        xs = [t for t, _ in points]
        by_t.plot(xs, [r["cpu_s_busiest_rank"] * 1e3 for _, r in points], MARKERS[method] + "-",
                  color=COLOURS[method], linewidth=1.6, markersize=6, label=f"{method_label(method)}, "
                  f"n = {top_n}")
        predicted = [r.get("predicted_cpu_s_busiest_rank") for _, r in points]
        if None not in predicted:  # null when the run had no peer
            by_t.plot(xs, [p * 1e3 for p in predicted], "--", color=COLOURS[method], linewidth=0.9, alpha=0.7)
    by_t.set_xscale("log", base=2)
    by_t.set_yscale("log")
    by_t.set_xticks(seqs)
    by_t.set_xticklabels([str(t) for t in seqs])
    by_t.set_xlabel("sequence length T")
    by_t.set_ylabel("busiest rank's CPU time, forward + backward (ms)")
    by_t.set_title(f"CPU time of the busiest rank, n = {top_n} (dashed: peer x its share)", fontsize=10)
    by_t.grid(True, which="both", alpha=0.3)
    by_t.legend(fontsize=7.5, loc="upper left")

    # Middle: busiest rank's CPU over the peer's, against n, at the largest T.
    peer = flash.get(top_t)
    degrees = sorted({r["sp"] for r in rows if r["seq"] == top_t})
    for method in METHODS:
        points = sorted((n, table[(method, n, top_t)]) for n in degrees if (method, n, top_t) in table)
        if not points or peer is None:
            continue
        xs = [n for n, _ in points]
        by_n.plot(xs, [r["cpu_s_busiest_rank"] / peer["cpu_s_busiest_rank"] for _, r in points], MARKERS[method],
                  color=COLOURS[method], markersize=7, label=method_label(method))
        if method != "ulysses":  # Ulysses' share is zigzag's, 1/n: one line for both
            by_n.plot(xs, [share(method, n, r["ulysses_size"]) for n, r in points], "-",
                      color=COLOURS[method] if method != "zigzag" else "0.35", linewidth=1.0, alpha=0.8)
    by_n.set_xscale("log", base=2)
    by_n.set_yscale("log")
    by_n.set_xticks(degrees)
    by_n.set_xticklabels([str(n) for n in degrees])
    by_n.set_xlabel("sequence-parallel degree n (ranks)")
    by_n.set_ylabel("busiest rank's CPU time / the peer's")
    by_n.set_title(f"T = {top_t}: busiest rank's CPU (markers) against its share of the scores (lines)",
                   fontsize=10)
    by_n.grid(True, which="both", alpha=0.3)
    by_n.legend(fontsize=8, loc="lower left")
    by_n.text(0.97, 0.97, "red: ring, contiguous, (2n - 1)/n^2\ngrey: Ulysses and zigzag, 1/n\n"
              "purple: hybrid, (2g - 1)/g^2/u, g = n/u",
              transform=by_n.transAxes, ha="right", va="top", fontsize=8, color="0.3")

    # Right: wall time of the slowest rank at the largest T.
    for method in METHODS:
        points = sorted((n, table[(method, n, top_t)]) for n in degrees if (method, n, top_t) in table)
        if not points:
            continue
        by = [r["step_s"] * 1e3 for _, r in points]
        wall.plot([n for n, _ in points], by, MARKERS[method] + "-", color=COLOURS[method], linewidth=1.4,
                  markersize=6, label=method_label(method))
    if peer is not None:
        wall.axhline(peer["step_s"] * 1e3, color="black", linewidth=1.0, label="peer, one rank")
        wall.plot(degrees, [peer["step_s"] * 1e3 / min(n, cores) for n in degrees], ":", color="0.3",
                  linewidth=1.2, label=f"peer / min(n, {cores} cores)")
    wall.set_xscale("log", base=2)
    wall.set_xticks(degrees)
    wall.set_xticklabels([str(n) for n in degrees])
    wall.set_ylim(bottom=0)
    wall.set_xlabel("sequence-parallel degree n (ranks = threads)")
    wall.set_ylabel("wall time, forward + backward (ms, slowest rank, median)")
    wall.set_title(f"T = {top_t}: wall time; the n ranks share {cores} cores", fontsize=10)
    wall.grid(True, alpha=0.3)
    wall.legend(fontsize=8, loc="upper right")

    figure.suptitle("Sequence-parallel causal attention, forward + backward, against T and n: "
                    + shape_line(rows[-1]), fontsize=11)
    figure.text(0.5, 0.005, run_footer(rows, "dtp-bench-sequence-expert", "sp_attention"),
                ha="center", va="bottom", fontsize=7, color="0.35")
    figure.tight_layout(rect=(0, 0.03, 1, 0.95))
    figure.savefig(path)
    plt.close(figure)


# --- attention: memory ---------------------------------------------------------------------

def plot_attention_memory(rows, path):
    table = last_by(rows, lambda r: (r["method"], r["sp"], r["seq"]))
    seqs = sorted({r["seq"] for r in rows})
    degrees = sorted({r["sp"] for r in rows})
    top_t = seqs[-1]
    figure, (saved, peak) = plt.subplots(1, 2, figsize=(14.5, 5.6), dpi=120)
    shades = {n: plt.cm.viridis(i / max(1, len(degrees) - 1) * 0.85) for i, n in enumerate(degrees)}

    # Left: kept from forward to backward, against T, every method and n.
    for n in degrees:
        formula = sorted({(r["seq"], r["formula_saved_bytes"]) for r in rows if r["sp"] == n})
        saved.plot([t for t, _ in formula], [b / MIB for _, b in formula], "--", color=shades[n], linewidth=1.2)
        for method in ["flash"] + METHODS:
            points = sorted((t, table[(method, n, t)]) for t in seqs if (method, n, t) in table)
            saved.plot([t for t, _ in points], [r["saved_bytes"] / MIB for _, r in points], MARKERS[method],
                       color=shades[n], markersize=6 if method != "flash" else 10, markerfacecolor="none",
                       linestyle="none")
        saved.annotate(f"n = {n}", (seqs[-1], formula[-1][1] / MIB), textcoords="offset points", xytext=(8, -3),
                       fontsize=8, color=shades[n])
    saved.set_xscale("log", base=2)
    saved.set_yscale("log")
    saved.set_xticks(seqs)
    saved.set_xticklabels([str(t) for t in seqs])
    saved.set_xlim(seqs[0] / 1.3, seqs[-1] * 1.6)
    saved.set_xlabel("sequence length T")
    saved.set_ylabel("MiB per rank (largest over ranks)")
    saved.set_title("Kept from forward to backward: every method on the formula", fontsize=10)
    saved.grid(True, which="both", alpha=0.3)
    handles = [Line2D([], [], color="0.3", linestyle="--",
                      label="formula: (4 B (T/n) H D + 2 B H (T/n)) e (q, k, v, output, statistics)")]
    handles += [Line2D([], [], color="0.3", marker=MARKERS[m], markerfacecolor="none", linestyle="none",
                       label=method_label(m)) for m in ["flash"] + METHODS]
    saved.set_ylim(bottom=min(r["formula_saved_bytes"] for r in rows) / MIB / 8)  # room for the legend
    saved.legend(handles=handles, fontsize=7.5, loc="lower right")

    # Right: the tracker's peak at the largest T, against n.
    peer = table.get(("flash", 1, top_t))
    for method in METHODS:
        points = sorted((n, table[(method, n, top_t)]) for n in degrees if (method, n, top_t) in table)
        if not points:
            continue
        xs = [n for n, _ in points]
        peak.plot(xs, [r["peak_bytes"] / MIB for _, r in points], MARKERS[method] + "-", color=COLOURS[method],
                  linewidth=1.5, markersize=6, label=method_label(method))
        comm = [(n, r["comm_peak_bytes"] / MIB) for n, r in points if r["comm_peak_bytes"] > 0]
        peak.plot([n for n, _ in comm], [c for _, c in comm], MARKERS[method], color=COLOURS[method],
                  markerfacecolor="none", markersize=6, linestyle="none")
    if peer is not None:
        peak.plot([1], [peer["peak_bytes"] / MIB], "*", color="black", markersize=12, linestyle="none",
                  label=method_label("flash"))
        peak.plot(degrees, [peer["peak_bytes"] / MIB / n for n in degrees], "--", color="black", linewidth=1.0,
                  label="the peer's peak / n")
    peak.plot([], [], "o", color="0.4", markerfacecolor="none", linestyle="none",
              label="of which message copies (comm), thread backend")
    peak.set_xscale("log", base=2)
    peak.set_yscale("log")
    peak.set_xticks(degrees)
    peak.set_xticklabels([str(n) for n in degrees])
    peak.set_xlabel("sequence-parallel degree n (ranks)")
    peak.set_ylabel("MiB per rank (largest over ranks)")
    peak.set_title(f"T = {top_t}: peak per rank, input shards q, k, v, dout included", fontsize=10)
    peak.grid(True, which="both", alpha=0.3)
    comm_peaks = [r["comm_peak_bytes"] for r in rows if r["seq"] == top_t and r["comm_peak_bytes"] > 0]
    if comm_peaks:
        peak.set_ylim(bottom=min(comm_peaks) / MIB / 4)  # room for the legend
    peak.legend(fontsize=7.5, loc="lower left")

    figure.suptitle("Sequence-parallel attention: memory per rank (MemoryTracker), " + shape_line(rows[-1]),
                    fontsize=11)
    figure.text(0.5, 0.005, run_footer(rows, "dtp-bench-sequence-expert", "sp_attention"),
                ha="center", va="bottom", fontsize=7, color="0.35")
    figure.tight_layout(rect=(0, 0.03, 1, 0.95))
    figure.savefig(path)
    plt.close(figure)


# --- Ulysses against ring on the clock -----------------------------------------------------

def plot_ulysses_vs_ring(rows, path):
    table = last_by(rows, lambda r: (r["tier"], r["method"], r["sp"]))
    tiers = list(dict.fromkeys(r["tier"] for r in rows))
    degrees = sorted({r["sp"] for r in rows})
    figure, (sent, clock) = plt.subplots(1, 2, figsize=(14.5, 5.8), dpi=120)
    for method in METHODS:
        points = sorted((n, table[(tiers[0], method, n)]) for n in degrees if (tiers[0], method, n) in table)
        if not points:
            continue
        xs = [n for n, _ in points]
        # Zigzag sends what the ring sends: draw it smaller, on top.
        size = 5 if method == "zigzag" else 8
        sent.plot(xs, [(r["sent_bytes_forward"] + r["sent_bytes_backward"]) / MIB for _, r in points],
                  MARKERS[method], color=COLOURS[method], markersize=size, linestyle="none",
                  label=method_label(method) + ", measured")
        if method != "zigzag":  # its formula is the ring's
            sent.plot(xs, [(r["formula_sent_bytes_forward"] + r["formula_sent_bytes_backward"]) / MIB
                           for _, r in points], "-", color=COLOURS[method], linewidth=1.0, alpha=0.8)
        for tier in tiers:
            tp = sorted((n, table[(tier, method, n)]) for n in degrees if (tier, method, n) in table)
            clock.plot([n for n, _ in tp], [r["clock_us"] for _, r in tp], MARKERS[method], color=COLOURS[method],
                       markersize=size, linestyle="none")
            if method != "zigzag":
                clock.plot([n for n, _ in tp], [r["formula_us"] for _, r in tp], TIER_STYLES.get(tier, ":"),
                           color=COLOURS[method], linewidth=1.0, alpha=0.8)
    r = rows[-1]
    whole = r["local_bytes"] * r["sp"]
    for axes in (sent, clock):
        axes.set_xscale("log", base=2)
        axes.set_xticks(degrees)
        axes.set_xticklabels([str(n) for n in degrees])
        axes.set_xlabel("sequence-parallel degree n (ranks)")
        axes.grid(True, which="both", alpha=0.3)
    sent.set_ylim(0, max((r["sent_bytes_forward"] + r["sent_bytes_backward"]) / MIB for r in rows) * 1.15)
    clock.set_yscale("log")
    clock.set_ylim(top=max(r["clock_us"] for r in rows) * 6)  # room for the legend
    sent.set_ylabel("MiB each rank sends, forward + backward")
    sent.set_title("Bytes per rank (CommStats): Ulysses' shrink with n, the ring's do not", fontsize=10)
    sent.legend(fontsize=8, loc="upper left")
    sent.text(0.97, 0.52, "lines: section 6, per rank, forward + backward\nUlysses 8 (n-1)/n S; ring (2(n-1) + 4n-2) S;"
              "\nhybrid 8 (u-1)/u S + (2(n/u-1) + 4n/u-2) S", transform=sent.transAxes, ha="right", va="bottom",
              fontsize=8, color="0.3")
    clock.set_ylabel("alpha-beta clock, forward + backward (us)")
    clock.set_title("The clock, communication only (nothing hidden)", fontsize=10)
    tier_rows = {row["tier"]: row for row in rows}
    handles = [Line2D([], [], color="0.3", linestyle=TIER_STYLES.get(t, ":"),
                      label=f"{t}: alpha {tier_rows[t]['alpha_us']:g} us, {tier_rows[t]['bandwidth_GBps']:g} GB/s "
                            "(formula)") for t in tiers]
    handles += [Line2D([], [], color=COLOURS[m], marker=MARKERS[m], linestyle="none", label=method_label(m)
                       + ", clock") for m in METHODS if any(k[1] == m for k in table)]
    clock.legend(handles=handles, fontsize=8, loc="upper left", ncol=2)
    figure.suptitle(f"Ulysses against ring attention: what each rank sends, and its time on the alpha-beta clock\n"
                    f"the reference on B = {r['batch']}, T = {r['seq']}, H = {r['heads']}, D = {r['head_dim']}, "
                    f"{r['dtype']}: one whole q is {whole / MIB:g} MiB, S = that / n", fontsize=11)
    spare = max(abs(r.get("clock_minus_formula_fs", 0)) for r in rows)
    foot = run_footer(rows, "dtp-bench-sequence-expert", "sp_comm_tiers")
    figure.text(0.5, 0.005, foot + f" · the clock counts fs, so attend_block's unit "
                f"charges add at most {spare:.0f} fs: clock = formula + those", ha="center", va="bottom", fontsize=7,
                color="0.35")
    figure.tight_layout(rect=(0, 0.03, 1, 0.93))
    figure.savefig(path)
    plt.close(figure)


# --- mixture of experts ---------------------------------------------------------------------

def stage_colour(stage, coef):
    """Grey at init; trained: red without the balance loss, blue with 0.01, orange with another."""
    if stage == "init":
        return "0.45"
    return {0.0: "#d62728", 0.01: "#1f77b4"}.get(coef, "#ff7f0e")


def plot_moe(rows, path):
    table = last_by(rows, lambda r: (r["experts"], r["top_k"], r["aux_loss_coef"], r["stage"], r["block"]))
    configs = sorted({(r["experts"], r["top_k"]) for r in rows})
    coefs = sorted({r["aux_loss_coef"] for r in rows})
    blocks = sorted({r["block"] for r in rows})
    figure, axes = plt.subplots(2, len(configs), figsize=(4.3 * len(configs), 8.2), dpi=120, squeeze=False)
    for col, (E, k) in enumerate(configs):
        top, bottom = axes[0][col], axes[1][col]
        any_row = next(r for r in rows if r["experts"] == E and r["top_k"] == k)
        factors = any_row["capacity_factors"]
        N = any_row["tokens"]
        floor = [max(0.0, 1 - E * c / (N * k)) for c in any_row["capacity"]]
        shown = [i for i, f in enumerate(factors) if f <= 2.0]  # E/k, where nothing can drop, goes in a note
        factors_all, factors = factors, [factors[i] for i in shown]
        floor = [floor[i] for i in shown]
        top.plot(factors, [100 * f for f in floor], ":", color="0.2", linewidth=1.2,
                 label="floor: 1 - E c / (N k), any router")
        top.plot(factors, [100 * any_row["uniform_drop_fraction"][i] for i in shown], "k--", linewidth=1.2,
                 label="uniform random router (exact)")
        worst_at_last = 0.0  # drops at the last factor, E/k, where there is room for every choice
        series = [("init", coefs[0], "init")] + [("trained", c, f"trained, aux coef {c:g}") for c in coefs]
        for stage, coef, label in series:
            rs = [table[(E, k, coef, stage, b)] for b in blocks if (E, k, coef, stage, b) in table]
            if not rs:
                continue
            mean = [sum(r["drop_fraction"][i] for r in rs) / len(rs) for i in shown]
            worst_at_last = max(worst_at_last, max(r["drop_fraction"][-1] for r in rs))

            top.plot(factors, [100 * m for m in mean], "o-", color=stage_colour(stage, coef), linewidth=1.5,
                     markersize=4, label=label + " (mean of blocks)")
        top.set_xticks(factors)
        top.set_xticklabels([f"{f:g}" for f in factors], fontsize=8)
        top.set_ylim(-2, 60)
        if factors_all[-1] > 2.0:
            top.text(0.97, 0.55, f"at cf = {factors_all[-1]:g} = E/k (capacity N):\n"
                     + ("nothing dropped" if worst_at_last == 0 else f"{100 * worst_at_last:.1f}% dropped"),
                     transform=top.transAxes, ha="right", fontsize=8, color="0.3")
        top.set_xlabel("capacity factor cf")
        top.set_ylabel("choices dropped (% of N k)")
        top.set_title(f"E = {E}, top-{k}: capacity c = cf N k / E", fontsize=10)
        top.grid(True, which="both", alpha=0.3)
        if col == 0:
            top.legend(fontsize=7.5, loc="upper right")

        # Bottom: each block's load balance.
        labels = ["uniform"] + [label for _, _, label in series]
        width = 0.8 / max(1, len(blocks))
        for bi, b in enumerate(blocks):
            values = [any_row["uniform_max_over_mean_load"]]
            colours = ["white"]
            for stage, coef, _ in series:
                r = table.get((E, k, coef, stage, b))
                values.append(r["max_over_mean_load"] if r else 0)
                colours.append(stage_colour(stage, coef))
            xs = [i + (bi - (len(blocks) - 1) / 2) * width for i in range(len(values))]
            bars = bottom.bar(xs, values, width * 0.95, color=colours, edgecolor="0.2",
                              hatch="//" if bi % 2 else None)
            for bar, v in zip(bars, values):
                bottom.annotate(f"{v:.2f}", (bar.get_x() + bar.get_width() / 2, v), textcoords="offset points",
                                xytext=(0, 2), ha="center", fontsize=6.5)
        bottom.axhline(1.0, color="0.3", linewidth=0.8)
        bottom.set_xticks(range(len(labels)))
        bottom.set_xticklabels([label.replace(", aux coef", "\ncoef").replace("uniform", "uniform\n(simulated)")
                                for label in labels], fontsize=7.5)
        bottom.set_ylim(0.9, max(2.2, bottom.get_ylim()[1]))
        bottom.set_ylabel("max_e f_e / mean (before drops)")
        names = ", ".join(f"block {b}" + (" hatched" if b % 2 else "") for b in blocks)
        bottom.set_title(f"load balance per block ({names})", fontsize=9)
        bottom.grid(True, axis="y", alpha=0.3)
    r = rows[-1]
    figure.suptitle(f"Mixture of experts: choices dropped against the capacity factor, and load balance\n"
                    f"GPT d_model {r['d_model']}, {r['layers']} layers, vocabulary {r['vocab_size']}, synthetic data; "
                    f"router probabilities of one held-out batch of N = {r['tokens']} tokens per block, at init and "
                    f"after {max(x['steps'] for x in rows)} steps (trained at capacity factor "
                    f"{r['train_capacity_factor']:g})", fontsize=10.5)
    figure.text(0.5, 0.005, run_footer(rows, "dtp-bench-sequence-expert", "moe_capacity"),
                ha="center", va="bottom", fontsize=7, color="0.35")
    figure.tight_layout(rect=(0, 0.02, 1, 0.94))
    figure.savefig(path)
    plt.close(figure)

SP_EP_STYLES = {"ulysses": ("#1f77b4", "o"), "ring": ("#d62728", "s"), "zigzag": ("#2ca02c", "^"),
                "hybrid": ("#9467bd", "D"), "ep": ("#ff7f0e", "P")}


def train_label(r):
    """The line a training-step row belongs to: the sp kind, or "ep"."""
    return r["detail"].split()[0] if r["model"] == "sp" else r["model"]


def plot_training(rows, path):
    """sp and ep training steps against their single-device peers, per rank, against n."""
    runs = [r for r in rows if r["model"] in ("sp", "ep")]
    if not runs:
        return
    figure, (cpu_axis, act_axis, bytes_axis) = plt.subplots(1, 3, figsize=(15, 4.8))
    ns = sorted({r["n"] for r in runs})
    ideal = [1] + ns
    for axis in (cpu_axis, act_axis):
        axis.plot(ideal, [1.0 / n for n in ideal], "k--", linewidth=1, label="1/n (the ideal split)")
    for label, (colour, marker) in SP_EP_STYLES.items():
        line = sorted((r for r in runs if train_label(r) == label), key=lambda r: r["n"])
        if not line:
            continue
        name = "ep (peer: one device, m routing groups)" if label == "ep" else method_label(label)
        x = [1] + [r["n"] for r in line]
        cpu_axis.plot(x, [1.0] + [r["cpu_vs_peer"] for r in line], marker=marker, color=colour, label=name)
        act_axis.plot(x, [1.0] + [r["activations_vs_peer"] for r in line], marker=marker, color=colour, label=name)
        xs = [r["n"] for r in line]
        bytes_axis.plot(xs, [r["moved_bytes"] / MIB for r in line], marker=marker, color=colour, linestyle="none",
                        label=name)
        bytes_axis.plot(xs, [r["formula_moved_bytes"] / MIB for r in line], color=colour, linestyle=":",
                        marker=marker, markersize=11, markerfacecolor="none", alpha=0.6)
    for axis in (cpu_axis, act_axis):
        axis.set_xscale("log", base=2)
        axis.set_yscale("log", base=2)
        axis.set_xticks(ideal, [str(n) for n in ideal])
        axis.set_xlabel("ranks n (sp) or m (ep)")
        axis.grid(True, which="both", alpha=0.3)
    cpu_axis.set_ylabel("busiest rank / one device")
    cpu_axis.set_title("thread CPU time of a step, busiest rank", fontsize=10)
    cpu_axis.legend(fontsize=7.5)
    act_axis.set_ylabel("largest rank / one device")
    act_axis.set_title("activation peak of a step", fontsize=10)
    bytes_axis.set_xticks(ns, [str(n) for n in ns])
    bytes_axis.set_xlabel("ranks n (sp) or m (ep)")
    bytes_axis.set_ylabel("MiB per rank per step")
    bytes_axis.set_title("bytes moved: measured (filled), sections 6 and 7 (hollow, dotted)", fontsize=10)
    bytes_axis.grid(True, alpha=0.3)
    bytes_axis.set_ylim(bottom=0)
    r = rows[-1]
    tunables = "; malloc settings from GLIBC_TUNABLES (see the JSON)" if r.get("glibc_tunables") else ""
    figure.suptitle(f"Training steps with sequence and expert parallelism, per rank, against one device\n"
                    f"GPT d_model {r['d_model']}, {r['layers']} layers, {r['heads']} heads, flash attention, batch "
                    f"{r['batch']} x {r['seq']}, {r['dtype']}, {r['optimizer']}; ep: {max(x['experts'] for x in rows)} "
                    f"experts, top {max(x['top_k'] for x in rows)}; median of {r['steps']} steps x {r['repeats']} "
                    f"rounds{tunables}", fontsize=10.5)
    figure.text(0.5, 0.005, run_footer(rows, "dtp-bench-sequence-expert", "sp_ep_train_step"),
                ha="center", va="bottom", fontsize=7, color="0.35")
    figure.tight_layout(rect=(0, 0.02, 1, 0.92))
    figure.savefig(path)
    plt.close(figure)


# What must agree for two lines to share a figure.
SETUP_KEYS = {
    "sp_attention": ("backend", "device", "dtype", "batch", "heads", "head_dim", "glibc_tunables"),
    "sp_comm_tiers": ("backend", "device", "dtype", "batch", "seq", "heads", "head_dim"),
    "moe_capacity": ("backend", "device", "d_model", "layers", "heads", "vocab_size", "tokens", "train_batch",
                     "train_capacity_factor"),
    "sp_ep_train_step": ("backend", "device", "dtype", "optimizer", "d_model", "layers", "heads", "seq", "batch",
                         "glibc_tunables"),
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="+", help="JSON-lines files written by dtp-bench-sequence-expert --json")
    parser.add_argument("--out", default=None, help="folder for the PNGs [docs/figures of this repository]")
    args = parser.parse_args()
    out_dir = figure_folder(args.out)
    rows = read_rows(args.files)
    parts = {what: [r for r in rows if r.get("what") == what]
             for what in ("sp_attention", "sp_comm_tiers", "moe_capacity", "sp_ep_train_step")}
    if not any(parts.values()):
        sys.exit("no dtp-bench-sequence-expert measurements in " + ", ".join(args.files))
    for what, keys in SETUP_KEYS.items():
        if parts[what]:
            parts[what] = keep_last_setup(parts[what], lambda r, keys=keys: tuple(r.get(k) for k in keys),
                                          "sequence_expert.py", f"{what} line(s)")
    jobs = [("sp_attention", "sp_attention_time.png", plot_attention_time),
            ("sp_attention", "sp_attention_memory.png", plot_attention_memory),
            ("sp_comm_tiers", "sp_ulysses_vs_ring.png", plot_ulysses_vs_ring),
            ("moe_capacity", "moe_capacity.png", plot_moe),
            ("sp_ep_train_step", "sp_ep_training.png", plot_training)]
    for what, name, plot in jobs:
        if parts[what]:
            path = os.path.join(out_dir, name)
            plot(parts[what], path)
            print(path)


if __name__ == "__main__":
    main()
