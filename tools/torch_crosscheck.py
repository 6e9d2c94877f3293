#!/usr/bin/env python3
"""Cross-check DTP's GPT against PyTorch.

Runs build/bin/dtp-export-step (or reads --step FILE), which builds a tiny
seeded GPT, runs one forward/backward on fixed tokens and writes weights,
tokens, loss, logits and gradients as JSON. This script rebuilds the same
model in PyTorch from those weights with the math of runtime/include/dtp/nn.h:

  x = tokens[ids] + positions[0:T]
  per block (pre-LN):  x = x + proj(attn(ln1(x)))   separate q, k, v Linears,
                       causal softmax(q k^T / sqrt(D)) v per head
                       x = x + mlp.proj(gelu_tanh(mlp.fc(ln2(x))))
  logits = lm(ln(x))   untied LM head, no bias
  loss = mean cross-entropy over all B*T positions

and compares the loss, the logits [B, T, V] and every gradient. The reference
always runs in float64, so the error measures DTP's own rounding: f64 DTP
agrees to about 1e-15, f32 to about 1e-6, TF32 (CUDA f32 matmuls) to about 1e-3.

Error measure. For the logits and for each parameter's gradient:
  rel err = max |dtp - torch| / max(max |torch|, floor)
where, for a gradient, floor = FLOOR_FRACTION (1e-4) x the largest |torch
gradient| among all parameters of the same unit (embedding, block.N, head);
for the logits and the loss the floor is 0 (they are never near zero). The
floor exists because one gradient is zero in exact arithmetic: attn.k.bias.
Softmax is invariant to a constant added to all scores of one query, and the
key bias adds q . b_k to every score of query q, the same for every key, so
d(loss)/d(b_k) = 0. Both DTP and PyTorch return rounding noise for it
(about 1e-20 in f64), and dividing DTP's noise by PyTorch's noise would give a
meaningless huge ratio. Measured against the floor, that noise must still be
as small as the rounding error of the unit's other gradients, so the tolerance
is not loosened: every real gradient is above the floor (the smallest, attn.q.bias,
is about 6e-4 x its unit's largest) and is compared relative to its own size. Such a parameter is printed as "zero in
exact arithmetic" (with the measured |torch grad| as evidence) rather than as
a ratio; a parameter whose torch gradient is below the floor for no known
reason is printed as "below floor".

Exit status: 0 when every error is within the tolerance, 1 otherwise (the
failing loss, logits or parameter is named on a FAIL line), 2 on bad usage,
77 with "torch not installed: skipped" where torch cannot be imported (CTest
counts 77 as skipped, never as a pass).

  python3 tools/torch_crosscheck.py [--device cpu|cuda] [--attention naive|flash]
          [--dtype f32|f64] [--exporter build/bin/dtp-export-step] [--step FILE] [--tol T]
Default tolerances: f64 1e-12 (any device); f32 1e-5 on cpu, 2e-2 on cuda
(TF32 matmuls). --step FILE takes its dtype and device from the file.
"""
import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile

# A gradient is compared relative to max(its own max |torch grad|, floor),
# floor = FLOOR_FRACTION x the largest |torch grad| in its unit.
FLOOR_FRACTION = 1e-4
# Gradients that are zero in exact arithmetic (see the docstring), by parameter
# name inside the unit.
EXACT_ZERO_GRADS = {"attn.k.bias": "softmax ignores a per-query constant added to every key's score"}
SKIP_EXIT = 77


def default_tolerance(dtype, device):
    if dtype == "f64":
        return 1e-12
    return 2e-2 if device.startswith("cuda") else 1e-5


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="DTP device for the exporter (cpu or cuda)")
    parser.add_argument("--attention", default="naive", choices=["naive", "flash"])
    parser.add_argument("--dtype", default=None, choices=["f32", "f64"],
                        help="DTP dtype for the exporter (default f32; with --step, the file's)")
    parser.add_argument("--exporter", default=None, help="path to dtp-export-step")
    parser.add_argument("--step", default=None, help="read this exported JSON instead of running the exporter")
    parser.add_argument("--tol", type=float, default=None, help="max relative error allowed")
    parser.add_argument("--export-only", action="store_true", help="run the exporter and check the file, no torch")
    args = parser.parse_args()

    if not args.export_only:
        try:
            import torch  # noqa: F401
        except ImportError:
            print("torch not installed: skipped")
            return SKIP_EXIT

    step = load_step(args)
    cfg = step["config"]
    dtype = cfg.get("dtype", "f32")  # exports from before --dtype were f32
    if args.dtype is not None and args.dtype != dtype:
        print(f"error: --dtype {args.dtype} but {args.step} holds a {dtype} step", file=sys.stderr)
        return 2
    if args.export_only:
        print(f"exported {len(step['params'])} parameters, loss {step['loss']:.6f}")
        return 0
    tol = args.tol if args.tol is not None else default_tolerance(dtype, cfg.get("device", args.device))
    return compare(step, tol)


def load_step(args):
    if args.step:
        with open(args.step) as f:
            return json.load(f)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    exporter = args.exporter or os.path.join(root, "build", "bin", "dtp-export-step")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "step.json")
        subprocess.run([exporter, "--out", path, "--device", args.device, "--attention", args.attention,
                        "--dtype", args.dtype or "f32"], check=True, stdout=subprocess.DEVNULL)
        with open(path) as f:
            return json.load(f)


def unit_of(name):
    """("block.0", "attn.k.bias") from "block.0.attn.k.bias"; units are embedding, block.N, head."""
    m = re.match(r"(block\.\d+|[^.]+)\.(.+)$", name)
    return (m.group(1), m.group(2)) if m else (name, name)


def reference(step):
    """The loss, logits and gradients of the exported step, in float64 PyTorch."""
    import torch

    dt = torch.float64
    cfg = step["config"]
    C, H, L, eps = cfg["d_model"], cfg["heads"], cfg["layers"], cfg["layernorm_eps"]
    D = C // H
    params = {}
    for p in step["params"]:
        t = torch.tensor(p["value"], dtype=dt).reshape(p["shape"])
        params[p["name"]] = t.requires_grad_(True)
    ids = torch.tensor(step["tokens"], dtype=torch.long)
    targets = torch.tensor(step["targets"], dtype=torch.long)
    B, T = ids.shape

    def linear(x, prefix):
        y = x @ params[prefix + ".weight"].T
        bias = params.get(prefix + ".bias")
        return y + bias if bias is not None else y

    def layernorm(x, prefix):
        return torch.nn.functional.layer_norm(x, (C,), params[prefix + ".weight"], params[prefix + ".bias"], eps)

    def gelu(x):  # tanh approximation, as ops::gelu_forward
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))

    x = params["embedding.tokens"][ids] + params["embedding.positions"][:T]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for layer in range(L):
        p = f"block.{layer}."
        h = layernorm(x, p + "ln1")
        q = linear(h, p + "attn.q").view(B, T, H, D).transpose(1, 2)
        k = linear(h, p + "attn.k").view(B, T, H, D).transpose(1, 2)
        v = linear(h, p + "attn.v").view(B, T, H, D).transpose(1, 2)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(D)
        scores = scores.masked_fill(~mask, float("-inf"))
        a = torch.softmax(scores, dim=-1) @ v
        a = a.transpose(1, 2).reshape(B, T, C)
        x = x + linear(a, p + "attn.proj")
        h = layernorm(x, p + "ln2")
        x = x + linear(gelu(linear(h, p + "mlp.fc")), p + "mlp.proj")
    logits = linear(layernorm(x, "head.ln"), "head.lm")
    loss = torch.nn.functional.cross_entropy(logits.reshape(B * T, -1), targets.reshape(-1))
    loss.backward()
    grads = {}
    for p in step["params"]:
        g = params[p["name"]].grad
        grads[p["name"]] = g if g is not None else torch.zeros(p["shape"], dtype=dt)
    return loss.item(), logits.detach(), grads


def compare(step, tol):
    import torch

    dt = torch.float64
    cfg = step["config"]
    loss, logits, grads = reference(step)
    failures = []

    loss_err = abs(loss - step["loss"]) / max(abs(loss), 1e-300)
    status = "ok" if loss_err <= tol else "FAIL"
    if status != "ok":
        failures.append("loss")
    print(f"loss: dtp {step['loss']:.17g} torch {loss:.17g} rel err {loss_err:.2e} {status}")

    logits_rel = math.inf
    if "logits" not in step:
        failures.append("logits")
        print("logits: FAIL (not in the export; rebuild dtp-export-step)")
    else:
        got = torch.tensor(step["logits"]["value"], dtype=dt).reshape(step["logits"]["shape"])
        if tuple(got.shape) != tuple(logits.shape):
            failures.append("logits")
            print(f"logits: FAIL (shape {list(got.shape)}, torch {list(logits.shape)})")
        else:
            diff = (got - logits).abs()
            abs_err = diff.max().item()
            scale = logits.abs().max().item()
            logits_rel = abs_err / scale if scale > 0 else abs_err
            status = "ok" if logits_rel <= tol else "FAIL"
            where = ""
            if status != "ok":
                failures.append("logits")
                b, t, v = (int(i) for i in divmod_all(diff.argmax().item(), logits.shape))
                where = f" (worst at batch {b}, position {t}, token {v})"
            print(f"logits {list(logits.shape)}: max abs err {abs_err:.3e}, max |logit| {scale:.3e}, "
                  f"rel err {logits_rel:.2e} {status}{where}")

    # The floor of each unit: FLOOR_FRACTION x its largest |torch gradient|.
    unit_max = {}
    for name, g in grads.items():
        unit = unit_of(name)[0]
        unit_max[unit] = max(unit_max.get(unit, 0.0), g.abs().max().item())

    print(f"{'parameter':32s} {'max abs err':>12s} {'max |grad|':>12s} {'rel err':>10s}")
    worst_grad = 0.0  # over gradients compared relative to their own size
    worst_floor = 0.0  # over those below the floor (compared relative to it)
    for p in step["params"]:
        name = p["name"]
        unit, local = unit_of(name)
        ref = grads[name]
        got = torch.tensor(p["grad"], dtype=dt).reshape(p["shape"])
        abs_err = (got - ref).abs().max().item()
        scale = ref.abs().max().item()
        floor = FLOOR_FRACTION * unit_max[unit]
        denom = max(scale, floor)
        rel = abs_err / denom if denom > 0 else abs_err
        if scale < floor:
            worst_floor = max(worst_floor, rel)
        else:
            worst_grad = max(worst_grad, rel)
        status = "ok" if rel <= tol else "FAIL"
        if status != "ok":
            failures.append(name)
        note = ""
        if scale < floor:
            reason = EXACT_ZERO_GRADS.get(local)
            if reason:
                note = f"  zero in exact arithmetic ({reason}); rel to floor {floor:.1e}"
            else:
                note = f"  below floor: rel to floor {floor:.1e} ({FLOOR_FRACTION:g} x {unit} max |grad|)"
        print(f"{name:32s} {abs_err:12.3e} {scale:12.3e} {rel:10.2e} {status}{note}")

    summary = (f"tolerance {tol:g}, dtype {cfg.get('dtype', 'f32')}, device {cfg['device']}, "
               f"attention {cfg['attention']}: worst rel err gradients {worst_grad:.2e} "
               f"(zero gradients vs floor {worst_floor:.2e}), logits {logits_rel:.2e}, loss {loss_err:.2e}")
    if failures:
        print(f"FAIL: {summary}; failed: {', '.join(failures)}")
        return 1
    print(f"PASS: {summary}")
    return 0


def divmod_all(index, shape):
    """The multi-index of a flat index into shape."""
    out = []
    for size in reversed(shape):
        index, r = divmod(index, size)
        out.append(r)
    return reversed(out)


if __name__ == "__main__":
    sys.exit(main())
