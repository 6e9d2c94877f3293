#!/usr/bin/env python3
"""The PyTorch eager peer of dtp-bench-train-step: the same GPT, the same shapes.

The model is DTP's (runtime/include/dtp/nn.h): learned token and position
embeddings, pre-LN blocks with separate q, k, v Linears, causal attention,
a GELU (tanh) MLP of width 4 C, a final LayerNorm and an untied LM head
without bias; AdamW; synthetic tokens. Whole training steps (forward,
backward, optimizer) are timed after warm-up, with a synchronize around
each timed run of steps, as the DTP bench does.

  python3 bench/torch_train_step.py [--precision tf32|bf16] [--attention sdpa|math]
      [--batch 8] [--seq 1024] [--layers 12] [--d-model 768] [--heads 12]
      [--vocab 50304] [--steps 10] [--warmup 2] [--device cuda] [--threads N] [--world N] [--json FILE]

tf32: f32 weights and activations, TF32 matmuls (what DTP runs today).
bf16: torch.autocast to bf16 with f32 weights (the peer for chapter 07).
sdpa: F.scaled_dot_product_attention (flash on a GPU); math: softmax(QK^T)V.
--threads: torch.set_num_threads on the CPU (bench/vs_torch.py sets DTP's to match).
--world N (CPU): PyTorch DDP over gloo, N processes, each --batch / N sequences
  of the global batch, the model wrapped in DistributedDataParallel (default
  buckets); --threads is then per process (default 1). Rank 0 times the steps
  between two barriers.
Prints one line and appends one JSON object to --json. Exits 0 with
"skipped" where torch or the device is missing.
"""
import argparse
import json
import math
import os
import sys
import time


def build(torch, args):
    nn, F = torch.nn, torch.nn.functional
    C, H, L, V, T = args.d_model, args.heads, args.layers, args.vocab, args.seq

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
            self.q, self.k, self.v, self.proj = (nn.Linear(C, C) for _ in range(4))
            self.fc, self.out = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

        def attend(self, x):
            B = x.shape[0]
            q, k, v = (f(x).view(B, T, H, C // H).transpose(1, 2) for f in (self.q, self.k, self.v))
            if args.attention == "sdpa":
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                s = q @ k.transpose(-1, -2) / math.sqrt(C // H)
                mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
                y = s.masked_fill(mask, float("-inf")).softmax(-1) @ v
            return self.proj(y.transpose(1, 2).reshape(B, T, C))

        def forward(self, x):
            x = x + self.attend(self.ln1(x))
            return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.tokens, self.positions = nn.Embedding(V, C), nn.Embedding(T, C)
            self.blocks = nn.ModuleList(Block() for _ in range(L))
            self.ln, self.lm = nn.LayerNorm(C), nn.Linear(C, V, bias=False)

        def forward(self, ids, targets):
            x = self.tokens(ids) + self.positions.weight[:T]
            for block in self.blocks:
                x = block(x)
            logits = self.lm(self.ln(x))
            return F.cross_entropy(logits.float().view(-1, V), targets.view(-1))

    return GPT()


def train(torch, args, batch, wrap=lambda model: model, barrier=lambda: None):
    """Times args.steps whole steps after args.warmup; returns (s/step, last loss, parameters)."""
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    model = wrap(build(torch, args).to(args.device))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    params = sum(p.numel() for p in model.parameters())
    ids = torch.randint(0, args.vocab, (batch, args.seq), device=args.device)
    targets = torch.randint(0, args.vocab, (batch, args.seq), device=args.device)
    autocast = torch.autocast(device_type=args.device.split(":")[0], dtype=torch.bfloat16,
                              enabled=args.precision == "bf16")

    def step():
        with autocast:
            loss = model(ids, targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss

    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    for _ in range(args.warmup):
        step()
    sync()
    barrier()
    start = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    last = loss.item()
    sync()
    barrier()
    return (time.perf_counter() - start) / args.steps, last, params


def ddp_process(rank, args, port, results):
    import torch
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=args.world)
    torch.manual_seed(rank)  # each rank's own micro-batch; the weights are broadcast by DDP
    measured = train(torch, args, args.batch // args.world,
                     wrap=lambda model: torch.nn.parallel.DistributedDataParallel(model), barrier=dist.barrier)
    if rank == 0:
        results.put(measured)
    dist.destroy_process_group()


def run_ddp(args):
    import socket
    import torch.multiprocessing as mp
    with socket.socket() as probe:  # a free port for the rendezvous
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    context = mp.get_context("spawn")
    results = context.SimpleQueue()
    mp.start_processes(ddp_process, args=(args, port, results), nprocs=args.world, join=True, start_method="spawn")
    return results.get()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--precision", default="tf32", choices=["tf32", "bf16"])
    parser.add_argument("--attention", default="sdpa", choices=["sdpa", "math"])
    for name, default in [("batch", 8), ("seq", 1024), ("layers", 12), ("d-model", 768), ("heads", 12),
                          ("vocab", 50304), ("steps", 10), ("warmup", 2)]:
        parser.add_argument("--" + name, type=int, default=default)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (default: torch's own choice)")
    parser.add_argument("--world", type=int, default=1, help="DDP processes over gloo, on the CPU (default 1: no DDP)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    for name in ("batch", "seq", "layers", "d_model", "heads", "vocab", "steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.world < 1 or args.batch % args.world:
        parser.error(f"--world must be at least 1 and divide --batch {args.batch}, got {args.world}")
    if args.world > 1 and args.device != "cpu":
        parser.error("--world N is DDP over gloo: it needs --device cpu")
    if args.world > 1 and not args.threads:
        args.threads = 1
    if args.d_model % args.heads:
        parser.error(f"--d-model {args.d_model} must divide by --heads {args.heads}")
    try:
        import torch
    except ImportError:
        print("torch not installed: skipped")
        return 0
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(f"--device {args.device}: no usable CUDA device: skipped")
        return 0

    if args.attention == "sdpa" and not hasattr(torch.nn.functional, "scaled_dot_product_attention"):
        print(f"--attention sdpa needs PyTorch 2.0 or later (this is {torch.__version__}); use --attention math",
              file=sys.stderr)
        return 2
    if args.world > 1:
        step_s, last, params = run_ddp(args)
    else:
        step_s, last, params = train(torch, args, args.batch)
    tokens_per_s = args.batch * args.seq / step_s
    ddp = f", DDP over gloo x {args.world}" if args.world > 1 else ""
    print(f"torch {torch.__version__} eager{ddp}, {args.precision}, {args.attention} attention, {params / 1e6:.1f}M params: "
          f"{step_s * 1e3:.1f} ms/step, {tokens_per_s:,.0f} tokens/s, last loss {last:.4f}")
    if args.json:
        with open(args.json, "a") as out:
            out.write(json.dumps({"what": "torch_train_step", "torch": torch.__version__, "device": args.device,
                                  "precision": args.precision, "attention": args.attention,
                                  "threads": args.threads or torch.get_num_threads(), "world": args.world,
                                  "batch": args.batch,
                                  "seq": args.seq, "layers": args.layers, "d_model": args.d_model,
                                  "heads": args.heads, "vocab": args.vocab, "params": params, "step_s": step_s,
                                  "tokens_per_s": tokens_per_s, "loss": last}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
