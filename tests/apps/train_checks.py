#!/usr/bin/env python3
"""Checks of the built dtp-train programs, one subcommand per CTest test.
Each failure says what was expected and what the program did."""
import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile

from check_support import expect, report, show


def run(argv, timeout=300, env=None):
    merged = dict(os.environ)
    merged.update(env or {})
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=merged,
                            stdin=subprocess.DEVNULL)
    return result


def read_trace(path, where):
    """The trace must be one valid JSON document; returns its track names."""
    try:
        document = json.load(open(path))
    except (OSError, ValueError) as error:
        expect(False, f"{where}: the trace {path} is not valid JSON: {error}")
        return set()
    names = {e["args"]["name"] for e in document.get("traceEvents", [])
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    spans = [e for e in document["traceEvents"] if e.get("ph") == "X"]
    expect(spans, f"{where}: the trace holds no spans")
    odd = {e.get("name") for e in document["traceEvents"] if e.get("ph") == "M"} - {
        "process_name", "process_sort_index", "thread_name"}
    expect(not odd, f"{where}: metadata events must be the trace-event format's own; got {sorted(odd)}")
    return names


def trace_span_pids(path):
    """The pids of the trace's spans: under DTP, one per rank."""
    try:
        document = json.load(open(path))
    except (OSError, ValueError):
        return set()
    return {e.get("pid") for e in document.get("traceEvents", []) if e.get("ph") == "X"}


def read_log(path, where):
    """Every line of the JSON-lines log must parse on its own."""
    objects = []
    for number, line in enumerate(open(path), 1):
        try:
            objects.append(json.loads(line))
        except ValueError as error:
            expect(False, f"{where}: line {number} of {path} is not JSON ({error}): {line[:200]!r}")
    return objects


# --- --impl and unsolved puzzles ----------------------------------------------------------

DDP = ["--strategy", "ddp"]
ZERO = ["--strategy", "zero"]
TP = ["--strategy", "tp", "--tp", "2"]
PP = ["--strategy", "pp", "--pp", "2"]
SP = ["--strategy", "sp", "--sp", "2"]
EP = ["--strategy", "ep", "--moe-experts", "2"]
TP_PUZZLES = [("4.1 column_parallel_linear", "Puzzle4_1_column_parallel_linear"),
              ("4.2 row_parallel_linear", "Puzzle4_2_row_parallel_linear"),
              ("4.3 tensor_parallel_mlp", "Puzzle4_3_tensor_parallel_mlp"),
              ("4.4 tensor_parallel_attention", "Puzzle4_4_tensor_parallel_attention"),
              ("4.5 vocab_parallel_embedding", "Puzzle4_5_vocab_parallel_embedding"),
              ("4.6 vocab_parallel_cross_entropy", "Puzzle4_6_vocab_parallel_cross_entropy"),
              ("4.7 sequence_parallel_block", "Puzzle4_7_sequence_parallel_block"),
              ("4.8 tensor_parallel_gpt", "Puzzle4_8_tensor_parallel_gpt")]
# (dtp-train flags, the puzzles the run calls in the chapter's order, as (the stub's
# words, the checkers of the code it calls: a suite, or a gtest filter where the run
# calls part of a puzzle)). A run reaches its puzzles outermost first (4.8's model
# before 4.1's linear); dtp-train names the first in the chapter's order that is a stub.
PUZZLES = [
    (DDP + ["--ddp-mode", "naive"], [("2.1 naive_ddp", "Puzzle2_1_naive_ddp")]),
    (DDP + ["--ddp-mode", "flat"], [("2.2 flat_ddp", "Puzzle2_2_flat_ddp")]),
    (DDP, [("2.3 bucketed_ddp", "Puzzle2_3_bucketed_ddp")]),
    (DDP + ["--ddp-mode", "flat", "--accumulate", "2"],
     [("2.4 gradient_accumulation", "Puzzle2_4_gradient_accumulation")]),
    (ZERO + ["--stage", "1"], [("3.1 zero1", "Puzzle3_1_zero1")]),
    (ZERO + ["--stage", "2"], [("3.2 zero2", "Puzzle3_2_zero2")]),
    (ZERO + ["--stage", "3"], [("3.3 zero3", "Puzzle3_3_zero3")]),
    (ZERO + ["--stage", "3", "--prefetch"],
     [("3.3 zero3", "Puzzle3_3_zero3"), ("3.4 zero3_prefetch", "Puzzle3_4_zero3_prefetch")]),
    (ZERO + ["--offload"], [("3.5 zero1_offload", "Puzzle3_5_zero1_offload")]),
    # Every layer of the model is a puzzle; the block (4.7) is one with or without SP.
    (TP, TP_PUZZLES),
    (TP + ["--sequence-parallel"], TP_PUZZLES),
    (PP, [("5.1 partition_units", "Puzzle5_1_partition"), ("5.4 one_f_one_b_schedule", "Puzzle5_4_one_f_one_b"),
          ("5.7 execute_schedule", "Puzzle5_7_executor")]),
    (PP + ["--schedule", "zb-h1"], [("5.1 partition_units", "Puzzle5_1_partition"),
                                    ("5.6 zb_h1_schedule", "Puzzle5_6_zb_h1"),
                                    ("5.7 execute_schedule", "Puzzle5_7_executor")]),
    # --fsdp builds 5.8's shards before 5.7 executes.
    (PP + ["--fsdp"], [("5.1 partition_units", "Puzzle5_1_partition"),
                       ("5.4 one_f_one_b_schedule", "Puzzle5_4_one_f_one_b"),
                       ("5.7 execute_schedule", "Puzzle5_7_executor"),
                       ("5.8 pipeline_fsdp", "Puzzle5_8_pipeline_fsdp")]),
    (SP, [("6.1 UlyssesAttention::forward", "Puzzle6_1_ulysses")]),
    (SP + ["--sp-kind", "ring"], [("6.2 RingAttention::forward", "Puzzle6_2_ring_forward"),
                                  ("6.3 RingAttention::backward", "Puzzle6_3_ring_backward")]),
    (SP + ["--sp-kind", "zigzag"], [("6.2 RingAttention::forward", "Puzzle6_2_ring_forward"),
                                    ("6.3 RingAttention::backward", "Puzzle6_3_ring_backward"),
                                    ("6.4 zigzag", "Puzzle6_4_zigzag")]),
    # The hybrid is 6.1's two halves and the ring (6.2, 6.3) put together.
    (SP + ["--sp-kind", "hybrid"], [("6.1 sequence_to_heads", "Puzzle6_1_ulysses.SequenceToHeads*"),
                                    ("6.2 RingAttention::forward", "Puzzle6_2_ring_forward"),
                                    ("6.3 RingAttention::backward", "Puzzle6_3_ring_backward"),
                                    ("6.5 HybridAttention::forward", "Puzzle6_5_hybrid")]),
    (EP, [("6.6 route_tokens", "Puzzle6_6_moe_layer.RouteTokens*"),
          ("6.7 ExpertParallelMoe::forward", "Puzzle6_7_expert_parallel")]),
    # On 2 ranks a mixed-precision step is 7.4's, built of 7.2's casts and, for fp16, 7.3's unscale.
    (["--precision", "bf16"], [("7.2 MasterWeights::grads_to_master",
                                "Puzzle7_2_mixed_step.GradsToMaster*:Puzzle7_2_mixed_step.MasterToModel*"),
                               ("7.4 ddp_mixed_precision_step", "Puzzle7_4_mixed_ddp")]),
    (["--precision", "fp16"], [("7.2 MasterWeights::grads_to_master",
                                "Puzzle7_2_mixed_step.GradsToMaster*:Puzzle7_2_mixed_step.MasterToModel*"),
                               ("7.3 LossScaler::unscale",
                                "Puzzle7_3_loss_scaler.Unscale*:Puzzle7_3_loss_scaler.Update*"),
                               ("7.4 ddp_mixed_precision_step", "Puzzle7_4_mixed_ddp")]),
    # LoRA on 2 ranks: the adapters' arithmetic (8.1), the model (8.3), its averaging (8.4).
    (["--lora-rank", "4"], [("8.1 lora_linear", "Puzzle8_1_lora_linear"), ("8.3 lora_model", "Puzzle8_3_lora_model"),
                            ("8.4 lora_ddp", "Puzzle8_4_lora_ddp")]),
]


def checkers_pass(args, suite):
    """Whether the checkers of `suite` (Puzzle2_3_..., Puzzle3_1_..., or a gtest
    filter like Puzzle6_6_moe_layer.RouteTokens*) pass, run from the chapter's
    checker binary (chNN_puzzles_tests)."""
    chapter = "ch0" + suite[len("Puzzle")]
    binary = next((b for b in args.checkers if os.path.basename(b).startswith(chapter + "_")), None)
    if not expect(binary, f"no checker binary for {suite} among --checkers {args.checkers}"):
        return False
    gtest_filter = suite if "." in suite else f"{suite}.*:*/{suite}.*"
    return run([binary, f"--gtest_filter={gtest_filter}"], timeout=600).returncode == 0


def check_unsolved(args):
    """dtp-train runs puzzles/: an unsolved puzzle stops it with its name and
    exit status 3: the first puzzle the run calls, in the chapter's order,
    whose checkers fail (not the first stub the run reached). Once
    the student solves them, the run must train (exit 0) and those puzzles'
    checkers must pass; training while they fail would mean dtp-train did not
    run puzzles/."""
    base = ["--world", "2", "--steps", "2", "--batch", "8"]
    for flags, needed in PUZZLES:
        for impl in ([], ["--impl", "puzzles"]):
            # tp, pp and sp size their world with --tp/--pp/--sp (and --dp), not --world.
            argv = [args.train] + flags + (base[2:] if flags[:2] in (TP[:2], PP[:2], SP[:2]) else base) + impl
            where = " ".join(argv[1:])
            result = run(argv, timeout=120, env={"DTP_BACKEND": "thread"})
            if result.returncode == 0:
                for puzzle, suite in needed:
                    expect(checkers_pass(args, suite),
                           f"`dtp-train {where}` trained (exit 0), but the checkers of puzzle {puzzle} "
                           f"fail: dtp-train did not run the code in puzzles/")
                continue
            # With one puzzle needed it must be the one; with more, the first unsolved in order.
            puzzle = needed[0][0]
            if len(needed) > 1:
                puzzle = next((p for p, suite in needed if not checkers_pass(args, suite)), puzzle)
            wanted = f"puzzle {puzzle} is not solved yet; `--impl reference` runs the reference"
            expect(result.returncode == 3 and wanted in result.stderr,
                   f"`dtp-train {where}`: expected exit 3 and '{wanted}' in stderr; got {show(result)}")
            expect("trained" not in result.stdout,
                   f"`dtp-train {where}` printed a summary although it stopped: {show(result)}")
    base = DDP + base
    # --impl reference starts the sibling program, which trains.
    argv = [args.train] + base + ["--ddp-mode", "flat", "--impl", "reference"]
    result = run(argv, timeout=300, env={"DTP_BACKEND": "thread"})
    expect(result.returncode == 0 and "ddp, cpu, reference" in result.stdout
           and "trained 2 steps" in result.stdout,
           f"`dtp-train ... --impl reference` must run bin/dtp-train-reference and train; got {show(result)}")
    # ... and the reference program's --impl puzzles comes back to dtp-train.
    argv = [args.reference] + base + ["--ddp-mode", "flat", "--impl", "puzzles"]
    result = run(argv, timeout=120, env={"DTP_BACKEND": "thread"})
    expect(result.returncode in (0, 3) and "ddp, cpu, puzzles" in result.stdout,
           f"`dtp-train-reference ... --impl puzzles` must run bin/dtp-train; got {show(result)}")


# --- outputs and the progress display -----------------------------------------------------

def check_outputs(args):
    with tempfile.TemporaryDirectory() as folder:
        trace, log = os.path.join(folder, "t.json"), os.path.join(folder, "l.jsonl")
        argv = [args.reference, "--strategy", "ddp", "--world", "2", "--steps", "3", "--batch", "8",
                "--trace", trace, "--json", log]
        result = run(argv, env={"DTP_BACKEND": "thread"})
        if expect(result.returncode == 0, f"a traced ddp run must succeed; got {show(result)}"):
            names = read_trace(trace, "ddp on threads")
            for rank in ("rank 0", "rank 1"):
                expect(rank in names, f"ddp on threads: the trace lacks the track '{rank}'; has {sorted(names)}")
            pids = trace_span_pids(trace)
            expect(pids == {0, 1}, f"ddp on threads: spans must have pid = rank (0 and 1); got {sorted(pids)}")
            objects = read_log(log, "ddp on threads")
            kinds = [o.get("kind") for o in objects]
            expect(kinds == ["config", "step", "step", "step", "summary"],
                   f"ddp on threads: log kinds {kinds}, expected config, 3 steps, summary")
            config = objects[0] if objects else {}
            expect(config.get("command_line") == argv,
                   f"the log's config line must record the command line {argv}; got {config.get('command_line')}")
            model = config.get("model", {})
            expect(model.get("layers") == 2 and model.get("d_model") == 64 and model.get("parameters", 0) > 0
                   and model.get("context") == 64,
                   f"the log's config line must hold the model as built (2 layers, width 64, context 64, its "
                   f"parameter count); got {model}")
            expect(len(str(config.get("git", ""))) >= 7,
                   f"the log's config line must name the git revision; got {config.get('git')!r}")

        # A run that fails keeps what it recorded: a finished trace and a last log line.
        argv = [args.reference, "--steps", "30", "--optimizer", "sgd", "--lr", "1000", "--clip", "0", "--warmup", "0",
                "--trace", trace, "--json", log]
        result = run(argv)
        if expect(result.returncode == 1 and "the loss is" in result.stderr,
                  f"sgd with lr 1000 must diverge and fail with exit 1 naming the loss; got {show(result)}"):
            read_trace(trace, "a run that failed")
            objects = read_log(log, "a run that failed")
            expect(objects and objects[-1].get("kind") == "failed" and "loss" in objects[-1].get("error", ""),
                   f"a failed run's log must end with a 'failed' line naming the error; got {objects[-1:]}")

    check_zero_lines(args.reference, [], "zero on threads", {"DTP_BACKEND": "thread"}, "thread")
    check_slices(args.reference)
    check_slices(args.reference, ["--strategy", "ddp", "--world", "2", "--accumulate", "2"])
    check_slices(args.reference, ["--precision", "fp16", "--world", "2"])
    check_slices(args.reference, ["--strategy", "zero", "--stage", "3", "--world", "2"])
    check_slices(args.reference, ["--strategy", "tp", "--tp", "2", "--dp", "2", "--sequence-parallel"])
    check_slices(args.reference, ["--strategy", "pp", "--pp", "2", "--dp", "2", "--fsdp", "--microbatches", "2"])
    check_slices(args.reference, ["--strategy", "sp", "--sp", "2", "--sp-kind", "zigzag"])
    check_slices(args.reference, ["--strategy", "ep", "--world", "2", "--moe-experts", "4", "--top-k", "2"])
    with tempfile.TemporaryDirectory() as folder:
        base = os.path.join(folder, "base.ckpt")
        result = run([args.reference, "--steps", "3", "--batch", "4", "--seq", "16", "--save", base])
        if expect(result.returncode == 0, f"pretraining a base for LoRA must work; got {show(result)}"):
            # dtp-checkpoint shows what the file holds, and refuses a damaged one.
            inspector = os.path.join(os.path.dirname(args.reference), "dtp-checkpoint")
            result = run([inspector, base, "--tensor", "optimizer/steps"])
            expect(result.returncode == 0 and "a training checkpoint at step 3, checksum verified" in result.stdout
                   and "params/embedding.tokens" in result.stdout and "first values: 3" in result.stdout,
                   f"dtp-checkpoint {base} --tensor optimizer/steps must list the tensors and print the "
                   f"optimizer's 3 updates; got {show(result)}")
            damaged = os.path.join(folder, "damaged.ckpt")
            with open(base, "rb") as f:
                content = bytearray(f.read())
            content[-1] ^= 0x01
            with open(damaged, "wb") as f:
                f.write(content)
            result = run([inspector, damaged])
            expect(result.returncode == 1 and "the file is corrupt" in result.stderr and damaged in result.stderr,
                   f"dtp-checkpoint of a file with one bit flipped must fail naming it; got {show(result)}")
            # Full fine-tuning from it in bf16, and under tp: the header says what each starts from.
            result = run([args.reference, "--steps", "2", "--batch", "4", "--seq", "16", "--load", base,
                          "--precision", "bf16"])
            expect(result.returncode == 0 and f"checkpoint: starting from {base}'s parameters (the f32 masters take "
                   "them as they are" in result.stdout,
                   f"--load of an f32 file under --precision bf16 must train and say what it starts from; "
                   f"got {show(result)}")
            result = run([args.reference, "--steps", "2", "--batch", "4", "--seq", "16", "--load", base,
                          "--strategy", "tp", "--tp", "2"])
            expect(result.returncode == 0 and f"checkpoint: starting from {base}'s parameters (a new run" in
                   result.stdout, f"--load of a single-device file under --strategy tp must train; got {show(result)}")
            # LoRA in slices: --load gives the base again, --resume the adapters.
            check_slices(args.reference, ["--load", base, "--lora-rank", "4", "--world", "2"])

    # A trace that cannot be written fails at once (not after the run, not exit 0).
    result = run([args.reference, "--steps", "200", "--trace", "/dev/full"])
    expect(result.returncode == 1 and "/dev/full" in result.stderr and "trained" not in result.stdout
           and "step " not in result.stdout,
           f"--trace /dev/full must fail before the first step with exit 1; got {show(result)}")

    # Not a terminal: about ten kept lines, the first and the last included.
    result = run([args.reference, "--steps", "40"])
    lines = [l for l in result.stdout.splitlines() if l.startswith("step ")]
    expect(result.returncode == 0 and 5 <= len(lines) <= 12 and lines[0].startswith("step  1/40")
           and lines[-1].startswith("step 40/40"),
           f"40 steps into a pipe: expected about 10 lines from step 1 to step 40; got {len(lines)}: {lines}")
    expect("ETA" in lines[1] if len(lines) > 1 else False, f"kept lines show the time left; got {lines[:2]}")
    expect("(mean of steps 1-10 -> 31-40)" in result.stdout,
           f"the summary must say which steps it averages; got {result.stdout[-400:]}")
    result = run([args.reference, "--steps", "5"])
    expect("(mean of steps 1-2 -> 4-5)" in result.stdout,
           f"5 steps: the averaged windows must not overlap; got {result.stdout[-400:]}")

    # A mixture of experts on one device: the header says so, and it learns.
    result = run([args.reference, "--moe-experts", "4", "--top-k", "2", "--steps", "60"])
    summary = re.search(r"loss ([0-9.]+) -> ([0-9.]+)", result.stdout)
    expect(result.returncode == 0 and "4 experts top-2 capacity factor 1.25" in result.stdout and summary
           and float(summary.group(2)) < float(summary.group(1)) - 0.5,
           f"--moe-experts 4 --top-k 2: expected the model line to name the experts and the loss to fall "
           f"by more than 0.5 over 60 steps; got {show(result)}")


def check_slices(program, strategy=(), launcher=(), env=None):
    """--stop-after and --save, then --resume: the losses of the run never stopped."""
    with tempfile.TemporaryDirectory() as folder:
        whole, first, second = (os.path.join(folder, name) for name in ("whole.jsonl", "a.jsonl", "b.jsonl"))
        checkpoint = os.path.join(folder, "run.ckpt")
        common = list(launcher) + [program, "--steps", "8", "--batch", "4", "--seq", "16"] + list(strategy)
        runs = [common + ["--json", whole], common + ["--stop-after", "3", "--save", checkpoint, "--json", first],
                common + ["--resume", checkpoint, "--json", second]]
        for argv in runs:
            result = run(argv, timeout=300, env=env)
            if not expect(result.returncode == 0, f"{' '.join(argv)} must train; got {show(result)}"):
                return
        expect("(mean of steps 4-5 -> 7-8)" in result.stdout,
               f"the resumed run trained steps 4-8: its summary must average steps 4-5 and 7-8 by "
               f"their numbers, not count from 1; got {show(result)}")
        header = [line for line in result.stdout.splitlines() if line.startswith("checkpoint: ")]
        expect(len(header) == 1 and f"continuing {checkpoint} from the step it saved" in header[0],
               f"the resumed run's header must say what it continues; got {show(result)}")
        steps = lambda path: [(o["step"], o["loss"]) for o in read_log(path, path) if o.get("kind") == "step"]
        expect(steps(first) + steps(second) == steps(whole),
               f"8 steps in slices of 3 and 5 (--stop-after 3 --save, then --resume) must give the losses of 8 "
               f"steps straight, bit for bit; got {steps(first) + steps(second)} against {steps(whole)}")
        expect(not os.path.exists(checkpoint + ".tmp"), "--save must not leave its temporary file behind")


def check_zero_lines(program, launcher, where, env, backend):
    """--strategy zero: the header names the ranks, backend, stage and puzzle;
    every kept step line is followed by a table: its heading, one row per
    rank (its memory per category and the bytes it moved) and DDP's row."""
    argv = launcher + [program, "--strategy", "zero", "--stage", "3", "--prefetch", "--world", "2",
                       "--steps", "3", "--batch", "8"]
    result = run(argv, timeout=300, env=env)
    if not expect(result.returncode == 0, f"{where}: {' '.join(argv)} must train; got {show(result)}"):
        return
    header = f"zero: 2 ranks ({backend} backend), stage 3 with prefetch (zero3-prefetch, puzzle 3.4)"
    expect(result.stdout.count(header) == 1, f"{where}: expected the header '{header}' once; got:\n{result.stdout}")
    # mpiexec gives its processes a terminal: kept lines then start with "\r\033[K".
    lines = [line.split("\r")[-1].replace("\x1b[K", "") for line in result.stdout.split("\n")]
    lines = [line for line in lines if line]
    steps = [i for i, line in enumerate(lines) if line.startswith("step ")]
    expect(len(steps) == 3, f"{where}: 3 steps keep 3 lines (every step of a short run); got {len(steps)}:\n{result.stdout}")
    heading = ["rank", "params", "peak", "MiB", "grads", "peak", "MiB", "optimizer", "peak", "MiB", "moved", "MiB"]
    for i in steps:
        table = lines[i + 1:i + 5]
        if not expect(len(table) == 4 and table[0].split() == heading,
                      f"{where}: after '{lines[i]}' expected a table headed '{' '.join(heading)}'; got {table}"):
            continue
        for row, label in zip(table[1:], ["0", "1", "DDP"]):
            cells = row.split()
            numbers = [c for c in cells[1:] if re.fullmatch(r"[0-9]+\.[0-9]{3}", c)]
            expect(cells[0] == label and len(cells) == 5 and len(numbers) == (4 if label != "DDP" else 3),
                   f"{where}: after '{lines[i]}' expected the row '{label}' with 4 numbers in MiB (DDP's: 3 and "
                   f"'-' for moved); got '{row}'")
    # 2 blocks: the shards plus two whole units outweigh the model, and the log says why, once.
    notes = [line for line in lines if line.startswith("    note: the parameter peak is above DDP's")]
    expect(len(notes) == 1, f"{where}: expected one note explaining the parameter peak above DDP's; got {notes}")


# --- under mpiexec ------------------------------------------------------------------------

def mpi_env():
    return {"DTP_BACKEND": "mpi", "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
            "OMPI_MCA_rmaps_base_oversubscribe": "1", "DTP_TIMEOUT": "30"}


def mpiexec(args):
    return [args.mpiexec, "--oversubscribe", "--mca", "btl", "self,vader"]


def check_mpi_outputs(args):
    with tempfile.TemporaryDirectory() as folder:
        trace, log = os.path.join(folder, "t.json"), os.path.join(folder, "l.jsonl")
        argv = mpiexec(args) + ["-n", "4", args.reference, "--strategy", "ddp", "--steps", "3",
                                "--batch", "8", "--trace", trace, "--json", log]
        result = run(argv, timeout=300, env=mpi_env())
        if not expect(result.returncode == 0, f"4 MPI processes must train; got {show(result)}"):
            return
        expect(result.stdout.count("dtp train:") == 1,
               f"the header must print once, not {result.stdout.count('dtp train:')} times:\n{result.stdout}")
        expect(result.stdout.count("trained ") == 1 and "trained 3 steps" in result.stdout,
               f"one summary ('trained 3 steps'), got:\n{result.stdout}")
        expect("ddp: 4 ranks (mpi backend)" in result.stdout,
               f"--world defaults to the 4 processes; got:\n{result.stdout}")
        names = read_trace(trace, "mpiexec -n 4")
        for rank in range(4):
            expect(f"rank {rank}" in names,
                   f"mpiexec -n 4: the trace must hold every rank (each process writes a part that rank 0 "
                   f"merges); it lacks 'rank {rank}', has {sorted(names)}")
        pids = trace_span_pids(trace)
        expect(pids == {0, 1, 2, 3}, f"mpiexec -n 4: spans must have pid = rank for ranks 0-3; got pids {sorted(pids)}")
        left = sorted(name for name in os.listdir(folder) if ".part" in name)
        expect(not left, f"mpiexec -n 4: the merged parts must be deleted; left {left}")
        kinds = [o.get("kind") for o in read_log(log, "mpiexec -n 4")]
        expect(kinds == ["config", "step", "step", "step", "summary"],
               f"mpiexec -n 4: log kinds {kinds}, expected config, 3 steps, summary (one writer)")
    # DDP in slices across processes: every rank resumes from rank 0's file.
    check_slices(args.reference, ["--strategy", "ddp"], mpiexec(args) + ["-n", "2"], mpi_env())
    # ZeRO across processes: rank 0 gathers the shards; every rank keeps its own of them.
    check_slices(args.reference, ["--strategy", "zero", "--stage", "2"], mpiexec(args) + ["-n", "2"], mpi_env())
    check_slices(args.reference, ["--strategy", "ep", "--moe-experts", "4"], mpiexec(args) + ["-n", "2"], mpi_env())
    check_slices(args.reference, ["--strategy", "pp", "--pp", "2", "--microbatches", "2"], mpiexec(args) + ["-n", "2"],
                 mpi_env())
    check_slices(args.reference, ["--strategy", "tp", "--tp", "2"], mpiexec(args) + ["-n", "2"], mpi_env())
    # The zero driver under mpiexec: one header, one line per rank, printed once.
    check_zero_lines(args.reference, mpiexec(args) + ["-n", "2"], "zero under mpiexec -n 2", mpi_env(), "mpi")


def check_mpi_diverging(args):
    common = ["--strategy", "ddp", "--world", "4", "--steps", "2", "--batch", "8"]
    argv = (mpiexec(args) + ["-n", "3", args.reference] + common + [":", "-n", "1", args.reference]
            + common + ["--seed", "7"])
    result = run(argv, timeout=300, env=mpi_env())
    wanted = "rank 3 has --seed 7 but rank 0 has --seed 1234"
    expect(result.returncode != 0 and wanted in result.stdout + result.stderr,
           f"one process with another --seed: expected a non-zero exit and '{wanted}'; got {show(result)}")
    expect("trained" not in result.stdout, f"diverging replicas must not train; got {show(result)}")
    # A strategy whose ranks are not the processes mpiexec started is a usage error on every process.
    argv = mpiexec(args) + ["-n", "2", args.reference, "--strategy", "tp", "--tp", "4", "--steps", "1"]
    result = run(argv, timeout=300, env=mpi_env())
    wanted = "--strategy tp runs --dp 1 x --tp 4 = 4 ranks, but mpiexec started 2 processes"
    expect(result.returncode != 0 and wanted in result.stderr and "trained" not in result.stdout,
           f"--tp 4 under mpiexec -n 2: expected a non-zero exit and '{wanted}'; got {show(result)}")


# --- every strategy on the GPU -----------------------------------------------------------

GPU_RUNS = [  # dtp-train flags; each trains 3 steps on the CPU and with --device cuda
    DDP + ["--world", "2"],
    ZERO + ["--stage", "1", "--world", "2"],
    ZERO + ["--stage", "3", "--prefetch", "--world", "2"],
    ZERO + ["--offload", "--world", "2"],
    TP + ["--sequence-parallel"],
    PP + ["--microbatches", "2"],
    PP + ["--dp", "2", "--fsdp", "--microbatches", "2"],
    SP + ["--sp-kind", "ulysses"],
    SP + ["--sp-kind", "ring"],
    EP + ["--world", "2"],
    ["--precision", "bf16", "--world", "2"],
    ["--lora-rank", "4", "--world", "2"],
]
# bf16 rounds every activation to 8 bits of mantissa (2^-8 ~ 4e-3), and the
# GPU's kernels round at other places than the CPU's: 2e-2 for every step.
BF16_BOUNDS = (2e-2, 2e-2)


def check_gpu_strategies(args):
    """dtp train --device cuda under every strategy: it trains, and its losses
    follow the same run on the CPU. The GPU's f32 matrix products use TF32
    (10-bit mantissa, unit roundoff 2^-11 ~ 5e-4), so the first step's loss
    agrees to about 1e-3 relative and later steps drift a little more: 1e-2.
    Without a usable GPU the test is skipped (exit 77), or fails under
    DTP_REQUIRE_GPU=1."""
    probe = run([args.reference, "--device", "cuda", "--steps", "1", "--batch", "4", "--seq", "16"],
                timeout=120)
    if probe.returncode != 0 and "no usable CUDA device" in probe.stderr:
        if os.environ.get("DTP_REQUIRE_GPU") == "1":
            expect(False, f"DTP_REQUIRE_GPU=1 but dtp-train finds no GPU: {show(probe)}")
            return
        print("skipped: no usable CUDA device (set DTP_REQUIRE_GPU=1 to fail instead)")
        sys.exit(77)
    with tempfile.TemporaryDirectory() as folder:
        for flags in GPU_RUNS:
            losses = {}
            for device in ("cpu", "cuda"):
                log = os.path.join(folder, f"{device}.jsonl")
                argv = [args.reference] + flags + ["--steps", "3", "--batch", "8", "--seq", "16",
                                                   "--device", device, "--json", log]
                result = run(argv, timeout=300, env={"DTP_BACKEND": "thread"})
                if not expect(result.returncode == 0, f"`dtp-train {' '.join(argv[1:])}` must train; "
                                                      f"got {show(result)}"):
                    break
                losses[device] = [o["loss"] for o in read_log(log, log) if o.get("kind") == "step"]
            if len(losses) < 2:
                continue
            where = " ".join(flags)
            first, later = BF16_BOUNDS if "bf16" in flags else (1e-3, 1e-2)
            expect(len(losses["cuda"]) == len(losses["cpu"]) == 3,
                   f"{where}: expected 3 logged steps on each device; got {losses}")
            for step, (cpu, gpu) in enumerate(zip(losses["cpu"], losses["cuda"]), 1):
                relative = first if step == 1 else later
                expect(abs(gpu - cpu) <= relative * abs(cpu),
                       f"{where}, step {step}: the loss on the GPU is {gpu:.6f}, on the CPU {cpu:.6f}: "
                       f"{abs(gpu - cpu) / abs(cpu):.1e} apart, more than the GPU's rounding allows "
                       f"({relative:.0e}); the GPU run computes something else")


def check_checkpoint_strategies(args):
    """dtp train --checkpoint under every strategy: activation checkpointing
    changes what a step keeps, never what it computes, so every logged loss
    equals the run without it bit for bit, and the kept activations peak
    lower. Where it cannot apply it is refused with the reason: tensor
    parallelism (its blocks are not dtp::Block), selective recomputation
    under sequence parallelism (the probabilities live in its attention
    core) or with flash attention (there are none), offloading a mixture of
    experts (its saved tensors are not enumerated)."""
    with tempfile.TemporaryDirectory() as folder:
        for flags in [[]] + GPU_RUNS:
            logs = {}
            for choice in ("none", "full", "every:2", "selective", "offload"):
                log = os.path.join(folder, f"{choice.replace(':', '')}.jsonl")
                argv = [args.reference] + flags + ["--steps", "2", "--batch", "8", "--seq", "16",
                                                   "--layers", "2", "--checkpoint", choice,
                                                   "--json", log]
                result = run(argv, timeout=300, env={"DTP_BACKEND": "thread"})
                strategy = flags[flags.index("--strategy") + 1] if "--strategy" in flags else ""
                refusal = ""
                if choice != "none" and (strategy == "tp" or (strategy == "sp" and choice == "selective")):
                    refusal = f"does not run under --strategy {strategy}"
                if choice == "offload" and "--moe-experts" in flags:
                    refusal = "a mixture-of-experts block's are not enumerated"
                if refusal:
                    expect(result.returncode != 0 and refusal in result.stderr,
                           f"`dtp-train {' '.join(argv[1:])}` must be refused, saying '{refusal}' "
                           f"and why; got {show(result)}")
                    continue
                if not expect(result.returncode == 0, f"`dtp-train {' '.join(argv[1:])}` must train; "
                                                      f"got {show(result)}"):
                    break
                logs[choice] = [o for o in read_log(log, log) if o.get("kind") == "step"]
            if "none" not in logs or len(logs) < 2:
                continue
            where = " ".join(flags) or "single"
            plain = [o["loss"] for o in logs["none"]]
            for choice in [c for c in logs if c != "none"]:
                got = [o["loss"] for o in logs[choice]]
                expect(got == plain, f"{where} --checkpoint {choice}: the losses are {got}, without "
                                     f"checkpointing {plain}: recomputation must not change a bit")
            kept = {c: max(o["peak_activation_bytes"] for o in logs[c]) for c in logs}
            expect("full" not in kept or kept["full"] < kept["none"],
                   f"{where}: --checkpoint full keeps {kept['full']} bytes of activations at the "
                   f"peak, no fewer than without checkpointing ({kept['none']})")
    result = run([args.reference, "--steps", "1", "--attention", "flash", "--checkpoint",
                  "selective"], timeout=120)
    expect(result.returncode != 0 and "flash" in result.stderr,
           f"--checkpoint selective with --attention flash must be refused naming flash; got "
           f"{show(result)}")


def check_compress_strategies(args):
    """dtp train --strategy compress with every compressor: it trains, its
    first step's loss is the uncompressed run's (the same model and data,
    before any update), its later losses stay finite, and the runs it cannot
    make are refused with the reason. These runs are on the CPU; the
    compressors' GPU paths are checked by chapter 10's gpu and nccl
    flavours."""
    with tempfile.TemporaryDirectory() as folder:
        def losses(flags):
            log = os.path.join(folder, "run.jsonl")
            argv = [args.reference] + flags + ["--world", "2", "--steps", "4", "--batch", "8",
                                               "--seq", "16", "--device", "cpu", "--json", log]
            result = run(argv, timeout=300, env={"DTP_BACKEND": "thread"})
            if not expect(result.returncode == 0,
                          f"`dtp-train {' '.join(argv[1:])}` must train; got {show(result)}"):
                return None
            return [o["loss"] for o in read_log(log, log) if o.get("kind") == "step"]
        plain = losses(DDP)
        saved = os.path.join(folder, "zero++.ckpt")
        # zero++ with qwz computes its first forward on 8-bit weights: its
        # first loss is close to, not equal to, the uncompressed one.
        for flags, exact in ((["--compress", "sign"], True), (["--compress", "int8"], True),
                             (["--compress", "int4"], True), (["--compress", "powersgd:2"], True),
                             (["--compress", "1bit-adam", "--onebit-warmup", "2"], True),
                             (["--compress", "zero++", "--zeropp", "hpz,qgz"], True),
                             (["--compress", "zero++", "--save", saved], False)):
            got = losses(["--strategy", "compress"] + flags)
            if plain is None or got is None:
                continue
            first_ok = got[0] == plain[0] if exact else abs(got[0] - plain[0]) < 0.01 * plain[0]
            expect(len(got) == 4 and first_ok and all(math.isfinite(x) for x in got),
                   f"{' '.join(flags)}: losses {got}; the first must be the uncompressed run's "
                   f"{plain[0]} (same model and batch before any update) "
                   f"{'exactly' if exact else 'within 1% (8-bit weights)'}, all finite")
        # ZeRO++'s consolidated checkpoint loads into a single-device run.
        if os.path.exists(saved):
            result = run([args.reference, "--load", saved, "--steps", "1", "--device", "cpu"],
                         timeout=120, env={"DTP_BACKEND": "thread"})
            expect(result.returncode == 0,
                   f"--load of --compress zero++'s checkpoint must train; got {show(result)}")
        else:
            expect(False, f"--compress zero++ --save {saved} wrote no file")
    for flags, words in ((["--compress", "1bit-adam", "--clip", "1"], "does not clip"),
                         (["--resume", "/nonexistent.ckpt"], "cannot --resume"),
                         (["--compress", "sign", "--zeropp", "qwz"], "applies to --compress zero++"),
                         (["--compress", "zero++", "--zeropp", "qwz,fast"], "'fast'"),
                         (["--compress", "zero++", "--world", "4", "--node-ranks", "3"],
                          "whole nodes")):
        result = run([args.reference, "--strategy", "compress", "--steps", "1"] + flags, timeout=120)
        expect(result.returncode != 0 and words in result.stderr,
               f"--strategy compress {' '.join(flags)} must be refused saying '{words}'; got "
               f"{show(result)}")


def check_lockstep_strategies(args):
    """dtp train --strategy local-sgd and diloco (chapter 11): they train,
    their first loss is data parallelism's (the same model and batch before
    any update), the runs they cannot make are refused, and DTP_FAULT is read
    by every run: a slow rank is waited for, a crashed one ends a data-parallel
    run with a report that names it, and a plan that does not parse is a
    usage error."""
    with tempfile.TemporaryDirectory() as folder:
        def losses(flags, env=None):
            log = os.path.join(folder, "run.jsonl")
            argv = [args.reference] + flags + ["--world", "2", "--steps", "4", "--batch", "8",
                                               "--seq", "16", "--device", "cpu", "--json", log]
            result = run(argv, timeout=300, env={"DTP_BACKEND": "thread", **(env or {})})
            if not expect(result.returncode == 0,
                          f"`dtp-train {' '.join(argv[1:])}` must train; got {show(result)}"):
                return None, result
            return [o["loss"] for o in read_log(log, log) if o.get("kind") == "step"], result
        plain, _ = losses(DDP)
        for flags in (["--strategy", "local-sgd", "--every", "2"], ["--strategy", "diloco", "--every", "2"]):
            got, _ = losses(flags)
            if plain is None or got is None:
                continue
            expect(len(got) == 4 and got[0] == plain[0] and all(math.isfinite(x) for x in got),
                   f"{' '.join(flags)}: losses {got}; the first must be data parallelism's {plain[0]}")
        slow, result = losses(DDP, {"DTP_FAULT": "1:2:slow=0.2"})
        if slow is not None:
            expect(slow == plain, f"DTP_FAULT=1:2:slow=0.2 must not change the losses: {slow} vs {plain}")
            expect("faults: 1:2:slow=0.2" in result.stdout,
                   f"the header must name the planned faults; got {show(result)}")
    result = run([args.reference] + DDP + ["--world", "2", "--steps", "4", "--batch", "8", "--seq", "16"],
                 timeout=120, env={"DTP_BACKEND": "thread", "DTP_FAULT": "1:2:crash", "DTP_TIMEOUT": "3"})
    expect(result.returncode != 0 and "rank 1: left: an injected crash or hang (DTP_FAULT)" in result.stderr,
           f"a data-parallel run whose rank 1 crashes at step 2 must fail with a report naming rank 1; "
           f"got {show(result)}")
    for flags, env, words in (
            (["--strategy", "local-sgd", "--every", "0"], {}, "--every"),
            (["--strategy", "diloco", "--every", "3", "--save", "/tmp/x.ckpt"], {},
             "multiple of --every"),
            (["--strategy", "local-sgd", "--resume", "/nonexistent.ckpt"], {}, "cannot --resume"),
            ([], {"DTP_FAULT": "1:x"}, "DTP_FAULT: fault plan: '1:x'")):
        result = run([args.reference, "--steps", "1"] + flags, timeout=120, env=env)
        expect(result.returncode != 0 and words in result.stderr,
               f"dtp-train {' '.join(flags)} {env} must be refused saying '{words}'; got {show(result)}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("check", choices=["unsolved", "outputs", "mpi-outputs", "mpi-diverging",
                                          "gpu-strategies", "checkpoint-strategies",
                                          "compress-strategies", "lockstep-strategies"])
    parser.add_argument("--train", help="bin/dtp-train (the puzzles)")
    parser.add_argument("--reference", help="bin/dtp-train-reference")
    parser.add_argument("--checkers", action="append", default=[],
                        help="a chapter's checkers built against puzzles/ (ch02_puzzles_tests, ...); repeatable")
    parser.add_argument("--mpiexec")
    args = parser.parse_args()
    {"unsolved": check_unsolved, "outputs": check_outputs, "mpi-outputs": check_mpi_outputs,
     "mpi-diverging": check_mpi_diverging, "gpu-strategies": check_gpu_strategies,
     "checkpoint-strategies": check_checkpoint_strategies,
     "compress-strategies": check_compress_strategies,
     "lockstep-strategies": check_lockstep_strategies}[args.check](args)
    return report(args.check)


if __name__ == "__main__":
    sys.exit(main())
