#!/usr/bin/env python3
"""Cross-check DTP's GPT against PyTorch.

Runs build/bin/dtp-export-step (or reads --step FILE), which builds a tiny
seeded GPT, runs one forward/backward on fixed tokens and writes weights,
tokens, loss and gradients as JSON. This script rebuilds the same model in
PyTorch from those weights with the math of runtime/include/dtp/nn.h:

  x = tokens[ids] + positions[0:T]
  per block (pre-LN):  x = x + proj(attn(ln1(x)))   separate q, k, v Linears,
                       causal softmax(q k^T / sqrt(D)) v per head
                       x = x + mlp.proj(gelu_tanh(mlp.fc(ln2(x))))
  logits = lm(ln(x))   untied LM head, no bias
  loss = mean cross-entropy over all B*T positions

and compares the loss and every gradient (max abs and relative error per
parameter; relative = max abs error / max |torch grad|). Exits 1 above the
tolerance, 0 otherwise; prints "torch not installed: skipped" and exits 0
where torch is missing. The reference runs in float64, so the tolerance
measures DTP's own f32 (CPU) or TF32 (CUDA) error.

  python3 tools/torch_crosscheck.py [--device cpu|cuda] [--attention naive|flash]
          [--exporter build/bin/dtp-export-step] [--step FILE] [--tol 1e-4]
Defaults: tolerance 1e-4 for --device cpu, 2e-2 for cuda (TF32 matmuls).
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="DTP device for the exporter (cpu or cuda)")
    parser.add_argument("--attention", default="naive", choices=["naive", "flash"])
    parser.add_argument("--exporter", default=None, help="path to dtp-export-step")
    parser.add_argument("--step", default=None, help="read this exported JSON instead of running the exporter")
    parser.add_argument("--tol", type=float, default=None, help="max relative error allowed")
    parser.add_argument("--export-only", action="store_true", help="run the exporter and check the file, no torch")
    args = parser.parse_args()
    tol = args.tol if args.tol is not None else (2e-2 if args.device.startswith("cuda") else 1e-4)

    if not args.export_only:
        try:
            import torch  # noqa: F401
        except ImportError:
            print("torch not installed: skipped")
            return 0

    step = load_step(args)
    if args.export_only:
        print(f"exported {len(step['params'])} parameters, loss {step['loss']:.6f}")
        return 0
    return compare(step, tol)


def load_step(args):
    if args.step:
        with open(args.step) as f:
            return json.load(f)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    exporter = args.exporter or os.path.join(root, "build", "bin", "dtp-export-step")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "step.json")
        subprocess.run([exporter, "--out", path, "--device", args.device, "--attention", args.attention], check=True)
        with open(path) as f:
            return json.load(f)


def compare(step, tol):
    import torch

    torch.manual_seed(0)
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

    failures = 0
    loss_err = abs(loss.item() - step["loss"]) / max(abs(loss.item()), 1e-12)
    status = "ok" if loss_err <= tol else "FAIL"
    failures += status != "ok"
    print(f"loss: dtp {step['loss']:.8f} torch {loss.item():.8f} rel err {loss_err:.2e} {status}")
    print(f"{'parameter':32s} {'max abs err':>12s} {'max |grad|':>12s} {'rel err':>10s}")
    for p in step["params"]:
        ref = params[p["name"]].grad
        if ref is None:
            ref = torch.zeros(p["shape"], dtype=dt)
        got = torch.tensor(p["grad"], dtype=dt).reshape(p["shape"])
        abs_err = (got - ref).abs().max().item()
        scale = ref.abs().max().item()
        rel = abs_err / scale if scale > 0 else abs_err
        status = "ok" if rel <= tol else "FAIL"
        failures += status != "ok"
        print(f"{p['name']:32s} {abs_err:12.3e} {scale:12.3e} {rel:10.2e} {status}")
    print(f"{'PASS' if failures == 0 else 'FAIL'}: tolerance {tol:g} (relative to each gradient's max |value|), "
          f"device {cfg['device']}, attention {cfg['attention']}")
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
