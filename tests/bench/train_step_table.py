#!/usr/bin/env python3
"""dtp-bench-train-step on the CPU (--device cpu, a 2-layer model): the op
table covers every kind of op a step runs, counts its calls from the model's
shape, and adds up with the rest to the step. No speed is judged.

Usage: train_step_table.py path/to/dtp-bench-train-step
"""
import json
import os
import subprocess
import sys
import tempfile

LAYERS = 2
SHAPE = ["--device", "cpu", "--layers", str(LAYERS), "--d-model", "64", "--heads", "4", "--vocab", "96",
         "--context", "32", "--batch", "2", "--steps", "1", "--warmup", "0"]

# op name -> calls per step for a model of LAYERS blocks.
EXPECTED_CALLS = {
    "layernorm fwd": 2 * LAYERS + 1,
    "layernorm bwd": 2 * LAYERS + 1,
    "residual add (axpy)": 6 * LAYERS,
    "linear C->C (q, k, v, proj) fwd": 4 * LAYERS,
    "linear C->4C (fc) bwd dW": LAYERS,
    "linear 4C->C (fc2) bwd dx": LAYERS,
    "lm head C->V fwd": 1,
    "gelu bwd": LAYERS,
    "flash attention fwd": LAYERS,
    "flash attention bwd": LAYERS,
    "cross-entropy bwd": 1,
    "embedding bwd": 1,
    "adamw (all params, f32)": 1,
}
MIXED_ONLY = {"cast grads up to f32": 1, "cast masters down": 1}


def run(binary, precision):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "out.jsonl")
        result = subprocess.run([binary, *SHAPE, "--precision", precision, "--json", path], capture_output=True,
                                text=True, timeout=240)
        if result.returncode != 0:
            sys.exit(f"--precision {precision}: exit {result.returncode}\n{result.stdout}\n{result.stderr}")
        with open(path) as f:
            return [json.loads(line) for line in f], result.stdout


def check(binary, precision):
    lines, stdout = run(binary, precision)
    errors = []
    steps = [l for l in lines if l["what"] == "train_step"]
    ops = {l["op"]: l for l in lines if l["what"] == "train_step_op"}
    rests = [l for l in lines if l["what"] == "train_step_rest"]
    if len(steps) != 1 or len(rests) != 1:
        errors.append(f"expected one train_step and one train_step_rest line, got {len(steps)} and {len(rests)}")
        return errors
    expected = dict(EXPECTED_CALLS, **(MIXED_ONLY if precision != "fp32" else {}))
    for name, calls in expected.items():
        if name not in ops:
            errors.append(f"no row for '{name}' (rows: {sorted(ops)})")
        elif ops[name]["calls_per_step"] != calls:
            errors.append(f"'{name}': {ops[name]['calls_per_step']} calls per step, expected {calls} "
                          f"for {LAYERS} layers")
    if precision == "fp32":
        for name in MIXED_ONLY:
            if name in ops:
                errors.append(f"fp32 has no '{name}' (its model is f32), but the table has a row for it")
    for name, row in ops.items():
        if not row["seconds"] > 0:
            errors.append(f"'{name}': {row['seconds']} seconds per call")
        if abs(row["seconds_per_step"] - row["seconds"] * row["calls_per_step"]) > 1e-12 + 1e-9 * row["seconds"]:
            errors.append(f"'{name}': seconds_per_step {row['seconds_per_step']} is not seconds x calls")
        if row.get("precision") != precision:
            errors.append(f"'{name}': precision {row.get('precision')}, expected {precision}")
    total = sum(row["seconds_per_step"] for row in ops.values())
    rest, step = rests[0], steps[0]
    if abs(rest["ops_s"] - total) > 1e-9 * max(1.0, total):
        errors.append(f"ops_s {rest['ops_s']} is not the sum of the rows' seconds_per_step ({total})")
    if abs(rest["ops_s"] + rest["rest_s"] - step["step_s"]) > 1e-9:
        errors.append(f"ops_s {rest['ops_s']} + rest_s {rest['rest_s']} is not step_s {step['step_s']}")
    for word in ("sum of the ops above", "rest of the step", "on the CPU"):
        if word not in stdout:
            errors.append(f"the table does not print '{word}'")
    return [f"--precision {precision}: {e}" for e in errors]


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    errors = check(sys.argv[1], "fp32") + check(sys.argv[1], "bf16")
    for e in errors:
        print(e)
    print("ok" if not errors else f"{len(errors)} problems")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
