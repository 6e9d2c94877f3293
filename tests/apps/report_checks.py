#!/usr/bin/env python3
"""What `dtp train` prints, number by number: the per-rank table under every
kept step, the lines under it, the header and the checkpoint lines, for every
strategy of the provided drivers.

Every expected value is computed here from the model's shape and the
lessons' formulas (chapters/NN_*/README.md), never read from the program's
output; the only numbers taken from the output are compared with other
printed numbers (the ranks' losses with the step's loss, EP's bytes with its
dropped choices). Each failure names the command, the step, the row, the
column, what was expected and what was printed, and what the wrong value
suggests."""
import argparse
import itertools
import math
import os
import re
import subprocess
import sys
import tempfile

from check_support import FAILURES, expect, report, show

MIB = 1024.0 * 1024.0
E = 4  # bytes per f32 element
ADAMW = 2 * E  # AdamW's bytes per parameter: m and v (chapter 03's K)


# --- the model, from its shape (runtime/include/dtp/gpt.h) --------------------------------

def model_units(vocab=64, context=64, d=64, layers=2, ratio=4, experts=0):
    """[(unit name, [parameter sizes in declaration order])]: the embedding
    (tokens, positions), each pre-LN block (ln1; q, k, v, proj with biases;
    ln2; fc and proj of the MLP, or a router without bias and the experts'
    MLPs), the head (final LayerNorm, LM head without bias, not tied)."""
    def linear(fan_in, fan_out, bias=True):
        return [fan_out * fan_in] + ([fan_out] if bias else [])
    layer_norm = [d, d]
    mlp = linear(d, ratio * d) + linear(ratio * d, d)
    half = mlp if experts == 0 else linear(d, experts, bias=False) + mlp * experts
    block = layer_norm + linear(d, d) * 4 + layer_norm + half
    return ([("embedding", [vocab * d, context * d])] +
            [(f"block.{i}", list(block)) for i in range(layers)] +
            [("head", layer_norm + linear(d, vocab, bias=False))])


def unit_sizes(units):
    return [sum(sizes) for _, sizes in units]


def chunk_len(n, parts, r):
    """Chapter 01's chunking rule: ceil(n/parts) each, the last non-empty
    chunk what is left, the ranks after it nothing."""
    size = -(-n // parts)
    return max(0, min(n, (r + 1) * size) - min(n, r * size))


def mib(nbytes):
    return nbytes / MIB


# --- running and reading the output -------------------------------------------------------

def run(program, flags):
    argv = [program] + flags
    merged = dict(os.environ, DTP_BACKEND="thread")
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=merged,
                            stdin=subprocess.DEVNULL)
    where = "dtp-train-reference " + " ".join(flags)
    if not expect(result.returncode == 0, f"`{where}` must train; got {show(result)}"):
        return where, None
    return where, result.stdout


STEP = re.compile(r"^step\s+(\d+)/(\d+)\s+loss\s+([0-9.]+)")


def parse_steps(stdout):
    """Every kept step: its number, loss and line, its per-rank table (the
    headings, and each row as (label, {heading: cell})) and the indented
    lines under it that are not rows."""
    steps = []
    for line in stdout.splitlines():
        match = STEP.match(line)
        if match:
            steps.append({"step": int(match.group(1)), "loss": float(match.group(3)), "line": line,
                          "headings": [], "rows": [], "lines": []})
        elif steps and line.startswith("    "):
            body = line[4:]
            if body.startswith("rank "):
                steps[-1]["headings"] = re.split(r"\s{2,}", body.strip())
            elif steps[-1]["headings"] and re.match(r"(\d|DDP\b)", body):
                # Keyed by the heading without its unit: "moved MiB" is "moved".
                columns = [re.sub(r" (MiB|ms)$", "", h) for h in steps[-1]["headings"][1:]]
                cells = body.split()
                label = " ".join(cells[:len(cells) - len(columns)])
                steps[-1]["rows"].append((label, dict(zip(columns, cells[len(cells) - len(columns):]))))
            else:
                steps[-1]["lines"].append(body)
    return steps


def kept_steps(where, stdout, wanted, headings):
    """The kept steps, each with a table headed `headings`; a failure (and
    none) unless the steps are exactly `wanted`."""
    steps = parse_steps(stdout)
    numbers = [s["step"] for s in steps]
    if not expect(numbers == list(wanted),
                  f"`{where}`: expected the kept steps {list(wanted)}, got {numbers}:\n{stdout[-1500:]}"):
        return []
    for s in steps:
        expect(not headings or s["headings"] == headings,
               f"`{where}`: after '{s['line']}' expected the table headed {headings}, got {s['headings']}")
    return steps if all(not headings or s["headings"] == headings for s in steps) else []


def cell(where, step, label, row, column):
    value = row.get(column)
    try:
        return float(value)
    except (TypeError, ValueError):
        expect(False, f"`{where}`, step {step['step']}, row '{label}': column '{column}' holds "
                      f"{value!r}, not a number")
        return math.nan


def expect_labels(where, step, labels, meaning="one per rank, in rank order, each where it sits"):
    got = [label for label, _ in step["rows"]]
    return expect(got == labels, f"`{where}`, step {step['step']}: expected the rows {labels} ({meaning}), "
                                 f"got {got}")


def expect_mib(where, step, label, row, column, nbytes, meaning, slack=0):
    """The cell in MiB against `nbytes`, to the printed 3 decimals (give
    `slack` bytes for a term the lesson calls tiny)."""
    got = cell(where, step, label, row, column)
    wanted = mib(nbytes)
    ok = abs(got - wanted) <= 0.0005 + mib(slack) + 1e-9
    return expect(ok, f"`{where}`, step {step['step']}, rank '{label}', column '{column}': expected "
                      f"{wanted:.3f} MiB ({nbytes} bytes), printed {row.get(column)}; {meaning}")


def expect_activations(where, step, label, row, tokens, d=64):
    """A step keeps at least one [tokens, C] activation alive (the input of
    the rank's first unit): a peak below it is not this step's peak."""
    least = tokens * d * E
    got = cell(where, step, label, row, "activation peak")
    return expect(got >= mib(least) - 0.0005,
                  f"`{where}`, step {step['step']}, rank '{label}', column 'activation peak': printed "
                  f"{row.get('activation peak')} MiB, below one [{tokens}, {d}] activation ({mib(least):.3f} MiB) "
                  f"that the step holds; the column shows what is live after the step, not its peak")


def expect_count(where, step, label, row, column, wanted, meaning):
    got = cell(where, step, label, row, column)
    return expect(got == wanted, f"`{where}`, step {step['step']}, rank '{label}', column '{column}': "
                                 f"expected {wanted}, printed {row.get(column)}; {meaning}")


def step_ms(step):
    """The step's time in ms, as its line prints it."""
    times = re.findall(r"([0-9.]+) ms", step["line"])
    return float(times[-1]) if times else math.nan


def expect_losses_average(where, step):
    """Equal slices: the ranks' losses (4 decimals each) average to the step's."""
    losses = [cell(where, step, label, row, "loss") for label, row in step["rows"]]
    mean = sum(losses) / len(losses)
    expect(abs(mean - step["loss"]) <= 1.2e-4,
           f"`{where}`, step {step['step']}: the ranks' losses {losses} average to {mean:.5f}, but the step's "
           f"loss is {step['loss']:.4f}; a rank's row shows another rank's loss, or the step's loss is not "
           f"the mean over the ranks")


# --- chapter 02: DDP ----------------------------------------------------------------------

def ddp_all_reduces(units, mode, accumulate, bucket_bytes=None):
    """All-reduces per step and rank: naive one per parameter, flat one per
    unit (also any mode with --accumulate > 1, which averages once after the
    last micro-batch), bucketed one per bucket of the plan walking the
    parameters as backward finishes them (units last to first, parameters
    last to first), closing a bucket once it holds at least bucket_bytes
    (auto: a quarter of the gradient bytes)."""
    if mode == "naive":
        return sum(1 for _, sizes in units for s in sizes if s > 0)
    if mode == "flat" or accumulate > 1:
        return len(units)
    if bucket_bytes is None:
        bucket_bytes = max(1, sum(unit_sizes(units)) * E // 4)
    buckets, held = 0, 0
    for _, sizes in reversed(units):
        for size in reversed(sizes):
            held += size * E
            if held >= bucket_bytes:
                buckets, held = buckets + 1, 0
    return buckets + (1 if held else 0)


def check_ddp(program):
    units = model_units()
    psi = sum(unit_sizes(units))
    runs = [(["--ddp-mode", "naive"], 2, "naive", 1, None),
            (["--ddp-mode", "flat"], 4, "flat", 1, None),
            ([], 2, "bucketed", 1, None),
            (["--bucket-mb", "0.05"], 2, "bucketed", 1, round(0.05 * MIB)),
            (["--accumulate", "2"], 2, "bucketed", 2, None)]
    for flags, world, mode, accumulate, bucket in runs:
        where, out = run(program, ["--strategy", "ddp", "--world", str(world), "--steps", "3", "--batch", "8",
                                   "--seq", "16"] + flags)
        if out is None:
            continue
        wanted = ddp_all_reduces(units, mode, accumulate, bucket)
        why = {"naive": "one all-reduce per parameter tensor (37 in the default model)",
               "flat": "one all-reduce per unit (embedding, each block, head)",
               "bucketed": "one per bucket of the plan (a quarter of the gradients each by default)"}[mode]
        if accumulate > 1:
            why = "--accumulate runs flat averaging once after the last micro-batch: one all-reduce per unit"
        header = (f"ddp: {world} ranks (thread backend), {mode}")
        expect(header in out and f"accumulate {accumulate}: {8 // (world * accumulate)} sequences per rank per "
                                 f"micro-step" in out,
               f"`{where}`: the header must say '{header}' and accumulate {accumulate} with "
               f"{8 // (world * accumulate)} sequences per rank per micro-step; got:\n{out[:600]}")
        for step in kept_steps(where, out, [1, 2, 3], ["rank", "loss", "all-reduces", "all-reduced MiB",
                                                       "exposed ms"]):
            if not expect_labels(where, step, [str(r) for r in range(world)]):
                continue
            expect_losses_average(where, step)
            for label, row in step["rows"]:
                expect_count(where, step, label, row, "all-reduces", wanted,
                             f"{why}; another count means the mode's averaging ran another way, or the "
                             f"column counts the wrong collectives")
                expect_mib(where, step, label, row, "all-reduced", psi * E,
                           "every gradient is averaged once per step, 4 bytes x the 112384 parameters; "
                           "twice that would be a second averaging, a fraction would be a part skipped")
                # Time waited inside the step: at most the step's time (its slowest rank's).
                exposed, took = cell(where, step, label, row, "exposed"), step_ms(step)
                expect(0 <= exposed <= took + 0.06,
                       f"`{where}`, step {step['step']}, rank '{label}': exposed {exposed} ms, expected between 0 "
                       f"and the step's {took} ms (the wait is part of the step); more means it adds up the "
                       f"waits of earlier steps too")


# --- chapter 03: ZeRO ---------------------------------------------------------------------

ZERO_NOTE_PARAMS = "note: the parameter peak is above DDP's"
ZERO_NOTE_GRADS = "note: ZeRO-1 holds more gradient bytes than DDP"


def zero_peaks(units, world, r, variant):
    """Chapter 03's peaks of rank r during a step (section 2, "What this
    implementation holds, exactly"), and its bytes counted per step (section
    3): (params, grads, optimizer, moved)."""
    sizes = unit_sizes(units)
    psi = sum(sizes)
    shard = sum(chunk_len(n, world, r) for n in sizes)
    largest = max(sizes)
    pair = max(a + b for a, b in zip(sizes, sizes[1:]))
    moved = (3 if variant.startswith("zero3") else 2) * E * psi + 8
    return {"zero1": (E * psi, E * (psi + shard), ADAMW * shard, moved),
            "zero2": (E * psi, E * (shard + largest), ADAMW * shard, moved),
            "zero3": (E * (shard + largest), E * (shard + largest), ADAMW * shard, moved),
            "zero3-prefetch": (E * (shard + pair), E * (shard + largest), ADAMW * shard, moved),
            # On the CPU the host is the device: the gradient shard the host
            # optimizer reads is one more shard, its master copy E per element.
            "zero1-offload": (E * psi, E * (psi + 2 * shard), (ADAMW + E) * shard, moved)}[variant]


def check_zero(program, folder):
    units = model_units()
    psi = sum(unit_sizes(units))
    saved = os.path.join(folder, "zero.ckpt")
    runs = [(["--stage", "1"], 2, "zero1", "1", []),
            (["--stage", "2"], 4, "zero2", "2", ["--save", saved]),
            (["--stage", "3"], 2, "zero3", "3", []),
            (["--stage", "3", "--prefetch"], 2, "zero3-prefetch", "3 with prefetch", []),
            (["--offload"], 2, "zero1-offload", "1 with offload", [])]
    headings = ["rank", "params peak MiB", "grads peak MiB", "optimizer peak MiB", "moved MiB"]
    meanings = {"params peak": "parameters: the full model (e x Psi) below stage 3, the shards plus one "
                               "whole unit (two neighbours with prefetch) at stage 3",
                "grads peak": "gradients: the full gradient plus its shard (ZeRO-1), the shards plus the "
                              "largest unit's full gradient (ZeRO-2, 3)",
                "optimizer peak": "AdamW's m and v of this rank's shard only (8 bytes per element; offload "
                                  "adds the f32 master shard)",
                "moved": "one reduce-scatter and one all-gather per unit (two all-gathers at stage 3) of "
                         "the whole buffer, plus the 8-byte norm all-reduce"}
    for flags, world, variant, stage_text, extra in runs:
        where, out = run(program, ["--strategy", "zero", "--world", str(world), "--steps", "2", "--batch", "8",
                                   "--seq", "16"] + flags + extra)
        if out is None:
            continue
        header = f"zero: {world} ranks (thread backend), stage {stage_text} ({variant}, puzzle"
        expect(header in out and f"; {8 // world} sequences per rank" in out,
               f"`{where}`: expected the header '{header} ...; {8 // world} sequences per rank'; got:\n{out[:700]}")
        steps = kept_steps(where, out, [1, 2], headings)
        for step in steps:
            if not expect_labels(where, step, [str(r) for r in range(world)] + ["DDP"]):
                continue
            for r, (label, row) in enumerate(step["rows"][:-1]):
                for column, nbytes in zip(["params peak", "grads peak", "optimizer peak", "moved"],
                                          zero_peaks(units, world, r, variant)):
                    expect_mib(where, step, label, row, column, nbytes,
                               f"{variant} on {world} ranks holds {meanings[column]}")
            label, row = step["rows"][-1]
            for column, nbytes in [("params peak", E * psi), ("grads peak", E * psi),
                                   ("optimizer peak", ADAMW * psi)]:
                expect_mib(where, step, label, row, column, nbytes,
                           "a DDP rank holds the whole model, its whole gradient and AdamW's m and v of "
                           "every parameter")
            expect(row.get("moved") == "-", f"`{where}`, step {step['step']}: the DDP row's 'moved' must be "
                                            f"'-' (it is a memory comparison), got {row.get('moved')!r}")
        # The note under the first table says why a stage holds more than DDP.
        params0, grads0 = zero_peaks(units, world, 0, variant)[:2]
        note = (ZERO_NOTE_PARAMS if params0 > E * psi else ZERO_NOTE_GRADS if grads0 > E * psi else None)
        notes = [line for step in steps for line in step["lines"] if line.startswith("note:")]
        expect([n for n in notes if note and n.startswith(note)] == notes and len(notes) == (1 if note else 0),
               f"`{where}`: rank 0's peaks (params {params0} bytes, grads {grads0}) against DDP's "
               f"{E * psi} call for {('the note ' + repr(note)) if note else 'no note'} once; got {notes}")
        if extra:
            check_saved(program, where, out, saved, "zero", 2, psi,
                        "rank 0 gathers every rank's shards into one file")


# --- chapter 04: tensor parallelism -------------------------------------------------------

def tp_bytes(tp, dp, sp, batch, seq, d=64, layers=2, context=64, psi=112384):
    """(parameter bytes per rank, bytes counted per step) of chapter 04: a
    rank holds (Psi - Psi_rep)/t + Psi_rep, Psi_rep = 6CL + T_max C + 2C
    (section 7). Per step, with S = N C e for the N tokens of a TP group:
    per block 4S (SP: 8S + 6Ce), the embedding and the head S each (SP: 2S
    each), the vocabulary-parallel loss its row maxima and its sums (3N
    elements), SP the final LayerNorm's 2C, the 8-byte norm; over DP every
    gradient once and the 8-byte loss."""
    replicated = 6 * d * layers + context * d + 2 * d
    per_rank = (psi - replicated) // tp + replicated
    n = batch // dp * seq
    s = n * d * E
    moved = layers * (8 * s + 6 * d * E if sp else 4 * s) + (4 * s if sp else 2 * s) + 3 * n * E + 8
    if sp:
        moved += 2 * d * E
    if dp > 1:
        moved += per_rank * E + 8
    return per_rank * E, moved


def check_tp(program, folder):
    saved = os.path.join(folder, "tp.ckpt")
    for tp, dp, sp, extra in [(2, 3, False, ["--save", saved]), (2, 1, True, [])]:
        batch = 6 if dp == 3 else 4
        flags = ["--strategy", "tp", "--tp", str(tp), "--dp", str(dp), "--steps", "1", "--batch", str(batch),
                 "--seq", "16"] + (["--sequence-parallel"] if sp else []) + extra
        where, out = run(program, flags)
        if out is None:
            continue
        expect(f"tp: {dp} x {tp} = {dp * tp} ranks (thread backend): tensor-parallel groups of {tp} consecutive "
               f"ranks, {dp} data-parallel group(s)" in out,
               f"`{where}`: the header must say '{dp} x {tp} = {dp * tp} ranks' with groups of {tp}; got:\n{out[:500]}")
        params, moved = tp_bytes(tp, dp, sp, batch, 16)
        labels = [f"{w} (tp {w % tp}, dp {w // tp})" for w in range(tp * dp)]
        for step in kept_steps(where, out, [1], ["rank", "params MiB", "activation peak MiB", "moved MiB"]):
            if not expect_labels(where, step, labels,
                                 f"world rank w is TP rank w % {tp} of TP group (= DP rank) w // {tp}, chapter 04 "
                                 f"section 8; a label with them swapped mixes up the mesh's axes"):
                continue
            for label, row in step["rows"]:
                expect_activations(where, step, label, row, batch // dp * 16 // (tp if sp else 1))
                expect_mib(where, step, label, row, "params", params,
                           f"a rank holds (Psi - Psi_rep)/{tp} + Psi_rep parameters; the whole model (0.429) "
                           f"means nothing was sliced, a bare Psi/{tp} leaves out the replicated ones")
                expect_mib(where, step, label, row, "moved", moved,
                           "the TP group's activations (4S per block, 8S + 6Ce under SP) plus, over DP, "
                           "every gradient once; a row off by the DP term counts only the TP group's "
                           "communicator, or the bytes of another step", slack=64)
        if extra:
            check_saved(program, where, out, saved, "tp", 1, sum(unit_sizes(model_units())),
                        "rank 0 gathers every rank's shards into one file")


# --- chapter 05: pipeline -----------------------------------------------------------------

def best_partition(costs, stages):
    """The min-max contiguous partitions of `costs` into `stages` (section
    1): every cut with the least most-expensive stage, as [(first, count)]."""
    n, found, best = len(costs), [], None
    for cuts in itertools.combinations(range(1, n), stages - 1):
        bounds = (0,) + cuts + (n,)
        worst = max(sum(costs[a:b]) for a, b in zip(bounds, bounds[1:]))
        parts = [(a, b - a) for a, b in zip(bounds, bounds[1:])]
        if best is None or worst < best:
            best, found = worst, [parts]
        elif worst == best:
            found.append(parts)
    return found


def pp_expected(schedule, p, m, v):
    """(peak alive per stage, makespan, clock bubble) of chapter 05: F = 1,
    B = 2 (B = W = 1 with split backward); AFAB holds all m, 1F1B min(p-r, m),
    interleaved min(2(p-r-1) + (v-1)p + 1, vm), ZB-H1 min(p, m)."""
    if schedule == "zb-h1":
        idle = (p - 1) + max(0, p - m)
        return [min(p, m)] * p, 3 * m + idle, idle / (3 * m + idle)
    if schedule == "interleaved":
        alive = [min(2 * (p - r - 1) + (v - 1) * p + 1, v * m) for r in range(p)]
        return alive, 3 * (v * m + p - 1), (p - 1) / (v * m + p - 1)
    alive = [m] * p if schedule == "afab" else [min(p - r, m) for r in range(p)]
    return alive, 3 * (m + p - 1), (p - 1) / (m + p - 1)


def check_pp(program, folder):
    saved = os.path.join(folder, "pp.ckpt")
    runs = [(2, 1, "1f1b", 4, 1, 2, False, ["--save", saved]),
            (2, 2, "afab", 2, 1, 2, True, []),
            (2, 1, "interleaved", 4, 2, 4, False, []),
            (3, 1, "zb-h1", 2, 1, 2, False, [])]
    for p, d, schedule, m, v, layers, fsdp, extra in runs:
        flags = ["--strategy", "pp", "--pp", str(p), "--dp", str(d), "--schedule", schedule, "--microbatches",
                 str(m), "--layers", str(layers), "--steps", "1", "--batch", "4", "--seq", "16"]
        where, out = run(program, flags + (["--fsdp"] if fsdp else []) + extra)
        if out is None:
            continue
        units = model_units(layers=layers)
        names, sizes = [name for name, _ in units], unit_sizes(units)
        partitions = best_partition(sizes, p * v)
        alive, makespan, bubble = pp_expected(schedule, p, m, v)
        expect(f"pp: {p} stages x {d} replica(s) = {p * d} ranks (thread backend)" in out and
               f"pp: the lesson's bubble for these settings: {100 * bubble:.1f}%" in out,
               f"`{where}`: the header must say {p} stages x {d} replica(s) and the lesson's bubble "
               f"{100 * bubble:.1f}%; got:\n{out[:500]}")
        steps = kept_steps(where, out, [1], ["rank", "params MiB", "activation peak MiB", "alive", "busy ms"])
        if not steps:
            continue
        step = steps[0]
        expected_rows = []
        for partition in partitions:
            rows = []
            for w in range(p * d):
                stage, replica = w // d, w % d
                chunks = [partition[c * p + stage] for c in range(v)]
                text = "; ".join(names[a] + (f" .. {names[a + n - 1]}" if n > 1 else "") for a, n in chunks)
                held = sum(chunk_len(sizes[u], d, replica) if fsdp else sizes[u]
                           for a, n in chunks for u in range(a, a + n))
                rows.append((f"{w} (stage {stage}, dp {replica}: {text})", held * E, alive[stage]))
            expected_rows.append(rows)
        got = [label for label, _ in step["rows"]]
        rows = next((r for r in expected_rows if [label for label, _, _ in r] == got), None)
        if not expect(rows, f"`{where}`: expected the rows {[label for label, _, _ in expected_rows[0]]} (world "
                            f"rank = stage x {d} + replica; chunk c of a rank is virtual stage c x {p} + stage of "
                            f"the min-max split of the units' parameters), got {got}"):
            continue
        for (label, row), (_, held, peak) in zip(step["rows"], rows):
            expect_activations(where, step, label, row, 4 // m * 16)
            expect_mib(where, step, label, row, "params", held,
                       "the parameters of the rank's stage" + (f", its 1/{d} shard of every unit (FSDP)" if fsdp
                                                               else "") + "; another stage's would be a label "
                       "or a partition mixed up")
            expect_count(where, step, label, row, "alive", peak,
                         f"{schedule} with p = {p}, m = {m}" + (f", v = {v}" if v > 1 else "") +
                         f" holds at most {peak} micro-batches on this stage (chapter 05)")
        line = f"bubble: clock {100 * bubble:.1f}% (makespan {makespan})"
        expect(any(l.startswith(line) for l in step["lines"]),
               f"`{where}`: expected the line '{line}, wall ...' under the table (the executor's clock "
               f"bubble is the schedule's, F = 1, B = 2); got {step['lines']}")
        chart = f"peak micro-batches alive per rank: {' '.join(str(a) for a in alive)}"
        expect(chart in out and f"makespan {makespan}, bubble {100 * bubble:.1f}%" in out,
               f"`{where}`: the chart of pipeline 0 must end with 'makespan {makespan}, bubble "
               f"{100 * bubble:.1f}%' and '{chart}'; got:\n{out[-900:]}")
        for stage in range(p):
            bar = re.search(rf"^rank {stage} \|(.*)\|$", out, re.M)
            forwards = len(re.findall(r"[Ff]\d", bar.group(1))) if bar else -1
            expect(forwards == m * v, f"`{where}`: rank {stage}'s bar in the chart must hold {m * v} forwards "
                                      f"(m x v); got {forwards}: {bar.group(0) if bar else 'no bar'}")
        if extra:
            check_saved(program, where, out, saved, "pp", 1, sum(sizes),
                        "rank 0 gathers every rank's shards into one file")


# --- chapter 06: sequence and expert parallelism ------------------------------------------

def check_sp(program):
    units = model_units()
    psi, layers, d, batch, seq = sum(unit_sizes(units)), 2, 64, 4, 16
    for kind, n, u in [("ulysses", 4, 0), ("ring", 2, 0), ("zigzag", 4, 0), ("hybrid", 4, 2)]:
        flags = ["--strategy", "sp", "--sp", str(n), "--sp-kind", kind, "--steps", "1", "--batch", str(batch),
                 "--seq", str(seq)] + (["--sp-ulysses", str(u)] if u else [])
        where, out = run(program, flags)
        if out is None:
            continue
        expect(f"sp: {n} ranks (thread backend), {kind} attention" in out and
               f"each holds {seq // n} of every sequence's {seq} positions" in out,
               f"`{where}`: the header must name {n} ranks, {kind} and {seq // n} of {seq} positions; "
               f"got:\n{out[:400]}")
        # Section 6: S bytes of one local q; Ulysses 4 all-to-alls of S each
        # way, the ring (over g ranks) 2(g-1)S forward and (4g-2)S back.
        s = batch * (seq // n) * d * E
        ring = lambda g: 2 * (g - 1) * s + (4 * g - 2) * s if g > 1 else 0
        attention = {"ulysses": 8 * s, "ring": ring(n), "zigzag": ring(n), "hybrid": 8 * s + ring(n // max(u, 1))}
        moved = psi * E + 8 + layers * attention[kind]
        columns = ["rank", "activation peak MiB", "moved MiB"] + ([] if kind == "ulysses" else ["attention blocks"])
        labels, blocks = [], []
        for r in range(n):
            if kind == "zigzag":
                c = seq // (2 * n)
                labels.append(f"{r} [{r * c}, {(r + 1) * c}) [{(2 * n - 1 - r) * c}, {(2 * n - r) * c})")
                blocks.append(layers * 2 * (2 * n + 1))
            else:
                labels.append(f"{r} [{r * seq // n}, {(r + 1) * seq // n})")
                blocks.append(layers * 2 * ((r // u if kind == "hybrid" else r) + 1))
        for step in kept_steps(where, out, [1], columns):
            if not expect_labels(where, step, labels):
                continue
            for r, (label, row) in enumerate(step["rows"]):
                expect_activations(where, step, label, row, batch * seq // n)
                expect_mib(where, step, label, row, "moved", moved,
                           f"every gradient averaged once (e x Psi) plus {kind}'s attention traffic per layer "
                           f"(chapter 06, section 6)")
                if kind != "ulysses":
                    expect_count(where, step, label, row, "attention blocks", blocks[r],
                                 "forward and backward, per layer: rank r + 1 blocks with contiguous positions "
                                 "(its ring's rank for hybrid), 2n + 1 quarter blocks with zigzag (section 4)")


def check_ep(program, folder):
    saved = os.path.join(folder, "ep.ckpt")
    layers, d, batch, seq = 2, 64, 8, 16
    for world, experts, top_k, factor, extra in [(2, 4, 2, None, ["--save", saved]), (4, 4, 1, 4, [])]:
        flags = ["--strategy", "ep", "--world", str(world), "--moe-experts", str(experts), "--top-k", str(top_k),
                 "--steps", "2", "--batch", str(batch), "--seq", str(seq)]
        flags += (["--capacity-factor", str(factor)] if factor else []) + extra
        where, out = run(program, flags)
        if out is None:
            continue
        units = model_units(experts=experts)
        psi = sum(unit_sizes(units))
        expert_params = layers * experts * sum(model_units()[1][1][-4:])
        replicated = psi - expert_params
        tokens = batch * seq // world
        expect(f"({psi} parameters)" in out and f"ep: {world} ranks (thread backend), each holds "
               f"{experts // world} of every block's {experts} experts and {batch // world} sequences" in out,
               f"`{where}`: the model line must count {psi} parameters and the header {experts // world} of "
               f"{experts} experts per rank; got:\n{out[:600]}")
        labels = [f"{r} (experts {r * experts // world}-{(r + 1) * experts // world - 1})" for r in range(world)]
        for step in kept_steps(where, out, [1, 2], ["rank", "tokens", "dropped", "moved MiB"]):
            if not expect_labels(where, step, labels):
                continue
            dropped = [cell(where, step, label, row, "dropped") for label, row in step["rows"]]
            moved = [cell(where, step, label, row, "moved") for label, row in step["rows"]]
            for r, (label, row) in enumerate(step["rows"]):
                expect_count(where, step, label, row, "tokens", tokens,
                             f"each rank routes its own {batch // world} sequences x {seq} positions; a multiple "
                             f"of it counts choices (x top-k) or the whole batch")
                most = 0 if factor else layers * tokens * top_k
                expect(0 <= dropped[r] <= most,
                       f"`{where}`, step {step['step']}, rank '{label}': dropped {dropped[r]:g}, expected "
                       + ("0: capacity factor E/k gives every expert room for all the rank's tokens"
                          if factor else f"between 0 and {most} (its {tokens} tokens x top-{top_k} x {layers} "
                          f"layers)"))
                low = replicated * E + 2 * d * E * (layers * tokens * top_k - dropped[r])
                expect(moved[r] >= mib(low) - 0.0005,
                       f"`{where}`, step {step['step']}, rank '{label}': moved {moved[r]} MiB is below "
                       f"{mib(low):.3f}: the replicated gradients ({replicated} parameters) averaged once plus "
                       f"this rank's kept choices dispatched forward and backward")
            # All ranks' kept rows go out and come back, forward and backward:
            # the bytes add up to the replicated gradients of every rank plus
            # 4 exchanges of every kept choice (chapter 06, section 7).
            kept = world * layers * tokens * top_k - sum(dropped)
            total = world * replicated * E + 4 * d * E * kept
            expect(abs(sum(moved) - mib(total)) <= world * (0.0005 + mib(512)),
                   f"`{where}`, step {step['step']}: the ranks' moved MiB {moved} add up to {sum(moved):.3f}, "
                   f"expected {mib(total):.3f} (each rank's {replicated} replicated gradients once, and 4 x "
                   f"{kept:g} kept rows of {d} floats); a column shows another rank's bytes or the dropped "
                   f"choices do not match the rows that travelled")
        if extra:
            check_saved(program, where, out, saved, "ep", 2, psi, "rank 0 gathers every rank's shards into one file")


# --- chapters 07 and 08: mixed precision, LoRA --------------------------------------------

def check_mixed(program, base):
    psi = sum(unit_sizes(model_units()))
    where, out = run(program, ["--precision", "fp16", "--world", "2", "--steps", "2", "--batch", "4", "--seq", "16",
                               "--load", base])
    if out is None:
        return
    expect("mixed: the model in f16 with f32 master weights (2 + 2 + 12 bytes per parameter), loss scale dynamic"
           in out and "; 2 ranks (thread backend), gradients averaged in f32" in out,
           f"`{where}`: the header must say f16 with f32 masters, 2 + 2 + 12 bytes per parameter, 2 ranks; "
           f"got:\n{out[:600]}")
    expect(f"checkpoint: starting from {base}'s parameters (the f32 masters take them as they are, the model "
           f"their rounding)" in out, f"`{where}`: the checkpoint line must name {base} and what the masters "
           f"take; got:\n{out[:900]}")
    peak = re.search(r"peak memory .*: params ([0-9.]+) MiB, grads ([0-9.]+) MiB, optimizer ([0-9.]+) MiB", out)
    wanted = (f"{mib(2 * psi):.2f}", f"{mib(2 * psi):.2f}", f"{mib(12 * psi):.2f}")
    expect(peak and peak.groups() == wanted,
           f"`{where}`: the peak memory line must show params {wanted[0]} MiB and grads {wanted[1]} MiB (2 "
           f"bytes x Psi in f16) and optimizer {wanted[2]} MiB (12 bytes: the f32 master, m and v); got "
           f"{peak.group(0) if peak else 'no such line'}")


def check_lora(program, base, folder):
    adapters, merged = os.path.join(folder, "adapters.ckpt"), os.path.join(folder, "merged.ckpt")
    d, hidden, layers, psi = 64, 256, 2, sum(unit_sizes(model_units()))
    shapes = {"attn.q": (d, d), "attn.k": (d, d), "attn.v": (d, d), "attn.proj": (d, d),
              "mlp.fc": (d, hidden), "mlp.proj": (hidden, d)}
    runs = [(4, "attn.q,attn.v", 2, ["--load", base, "--save", adapters, "--save-merged", merged]),
            (2, "all", 1, [])]
    for rank, targets, world, extra in runs:
        flags = ["--lora-rank", str(rank), "--world", str(world), "--steps", "2", "--batch", "4", "--seq", "16"]
        flags += ([] if targets == "attn.q,attn.v" else ["--lora-targets", targets]) + extra
        where, out = run(program, flags)
        if out is None:
            continue
        names = list(shapes) if targets == "all" else targets.split(",")
        trainable = layers * sum(rank * (shapes[t][0] + shapes[t][1]) for t in names)
        header = (f"lora: rank {rank}, alpha {2 * rank} (scale 2) on {','.join(names)} of every block: {trainable} "
                  f"trainable parameters ({100 * trainable / psi:.2f}% of {psi})")
        expect(header in out, f"`{where}`: expected the header '{header}' (R x (in + out) per adapted Linear, "
                              f"{layers} blocks; alpha 2R by default); got:\n{out[:500]}")
        line = f"all-reduced {trainable * E} bytes: the {trainable} adapter gradients x {E} bytes"
        for step in kept_steps(where, out, [1, 2], []):
            wanted = [line] if world > 1 else []
            expect(step["lines"] == wanted,
                   f"`{where}`, step {step['step']}: expected {wanted} under the step (on {world} rank(s) only the "
                   f"adapters' gradients are averaged: more bytes would be the frozen base's too); got "
                   f"{step['lines']}")
        if extra:
            wanted = (f"checkpoint: starting from {base}'s parameters (the frozen base); saving to {adapters} at "
                      f"the end (the adapters and their optimizer state)")
            expect(wanted in out, f"`{where}`: expected '{wanted}'; got:\n{out[:900]}")
            info = inspect(program, adapters)
            expect(info.get("kind") == "training" and info.get("step") == 2 and info.get("strategy") == "lora" and
                   info.get("bytes", {}).get("extra") == trainable * E and "params" not in info.get("bytes", {}),
                   f"`{where}`: --save {adapters} must hold the run's adapters ({trainable} x {E} bytes under "
                   f"extra/) at step 2 and no base parameters; dtp-checkpoint says {info}")
            info = inspect(program, merged)
            expect(info.get("kind") == "model" and info.get("bytes", {}).get("params") == psi * E,
                   f"`{where}`: --save-merged {merged} must hold a whole model ({psi} x {E} bytes of params/); "
                   f"dtp-checkpoint says {info}")


# --- checkpoints --------------------------------------------------------------------------

def inspect(program, path):
    """What dtp-checkpoint says of @p path: its kind, step, strategy and
    bytes per top-level name (params, optimizer, extra)."""
    inspector = os.path.join(os.path.dirname(program), "dtp-checkpoint")
    if not expect(os.path.exists(path), f"the checkpoint {path} the run named was not written"):
        return {}
    result = subprocess.run([inspector, path], capture_output=True, text=True, timeout=60)
    head = re.search(r": a (\w+) checkpoint at step (\d+), checksum verified", result.stdout)
    strategy = re.search(r"^strategy: (\S+)", result.stdout, re.M)
    if not expect(result.returncode == 0 and head, f"dtp-checkpoint {path} must read it; got {show(result)}"):
        return {}
    sizes = {}
    for name, nbytes in re.findall(r"^(\w+)/\S+\s+\w+\s+\[[^\]]*\]\s+(\d+)$", result.stdout, re.M):
        sizes[name] = sizes.get(name, 0) + int(nbytes)
    return {"kind": head.group(1), "step": int(head.group(2)), "strategy": strategy.group(1) if strategy else None,
            "bytes": sizes}


def check_saved(program, where, out, path, strategy, steps, psi, note):
    wanted = f"checkpoint: saving to {path} at the end ({note})"
    expect(wanted in out, f"`{where}`: expected the line '{wanted}'; got:\n{out[:900]}")
    info = inspect(program, path)
    sizes = info.get("bytes", {})
    expect(info.get("step") == steps and info.get("strategy") == strategy and sizes.get("params") == psi * E
           and sizes.get("optimizer") == 2 * psi * E + 8,
           f"`{where}`: {path} must be one {strategy} checkpoint at step {steps} holding all {psi} parameters "
           f"({psi * E} bytes) and AdamW's m and v of each plus its step count ({2 * psi * E + 8} bytes), as "
           f"one device would; a part missing means rank 0 did not gather every rank's shards; "
           f"dtp-checkpoint says {info}")


def check_slices(program, folder):
    """--stop-after and --save, then --resume: the lines name the files, the
    resumed run's steps continue the numbering, and its tables go on."""
    first, second = os.path.join(folder, "a.ckpt"), os.path.join(folder, "b.ckpt")
    common = ["--strategy", "ddp", "--world", "2", "--steps", "3", "--batch", "4", "--seq", "16"]
    where, out = run(program, common + ["--stop-after", "1", "--save", first])
    if out is None:
        return
    wanted = f"checkpoint: stopping after step 1 of 3; saving to {first} at the end"
    expect(wanted in out, f"`{where}`: expected the line '{wanted}'; got:\n{out[:900]}")
    kept_steps(where, out, [1], ["rank", "loss", "all-reduces", "all-reduced MiB", "exposed ms"])
    info = inspect(program, first)
    expect(info.get("step") == 1 and info.get("strategy") == "ddp",
           f"`{where}`: {first} must be ddp's checkpoint at step 1 (where it stopped); dtp-checkpoint says {info}")
    where, out = run(program, common + ["--resume", first, "--save", second])
    if out is None:
        return
    wanted = (f"checkpoint: continuing {first} from the step it saved (its settings checked); saving to {second} "
              f"at the end")
    expect(wanted in out, f"`{where}`: expected the line '{wanted}'; got:\n{out[:900]}")
    for step in kept_steps(where, out, [2, 3], ["rank", "loss", "all-reduces", "all-reduced MiB", "exposed ms"]):
        expect_losses_average(where, step)
    info = inspect(program, second)
    expect(info.get("step") == 3, f"`{where}`: {second} must hold step 3; dtp-checkpoint says {info}")
    return second


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--reference", required=True, help="bin/dtp-train-reference")
    parser.add_argument("--train", help="bin/dtp-train (not run: the drivers' reports are the same)")
    args = parser.parse_args()
    program = args.reference
    # The formula's own check: the default model's parameter count (chapter 05 gives the units).
    sizes = unit_sizes(model_units())
    if not expect(sum(sizes) == 112384 and sizes == [8192, 49984, 49984, 4224] and
                  sum(unit_sizes(model_units(experts=4))) == 311424,
                  f"the test's own parameter count is wrong: units {sizes}, sum {sum(sizes)}; expected 8192, "
                  f"49984 x 2, 4224 = 112384 (and 311424 with 4 experts)"):
        print("FAILED:", FAILURES[0])
        return 1
    with tempfile.TemporaryDirectory() as folder:
        base = check_slices(program, folder)
        check_ddp(program)
        check_zero(program, folder)
        check_tp(program, folder)
        check_pp(program, folder)
        check_sp(program)
        check_ep(program, folder)
        if base:
            check_mixed(program, base)
            check_lora(program, base, folder)
    return report("reports")


if __name__ == "__main__":
    sys.exit(main())
