// dtp-bench-train-step: one GPU, a GPT-2-small-shaped model (12 layers,
// d_model 768, 12 heads, context 1024, vocab 50304); prints tokens/s and MFU
// of whole training steps (forward, backward, AdamW), then per-op timings
// (f32) against their roofline. --precision fp32 keeps f32 storage with TF32
// matmuls; bf16 and fp16 run chapter 07's mixed-precision step (a 16-bit
// model, f32 master weights and AdamW state; fp16 with the dynamic loss
// scale), the peer of PyTorch autocast.
//   dtp-bench-train-step [--batch 8] [--seq 1024] [--layers 12] [--d-model 768]
//                        [--heads 12] [--vocab 50304] [--context 1024] [--steps 10] [--warmup 2]
//                        [--attention flash|naive] [--precision fp32|bf16|fp16]
//                        [--peak-tflops 494.7 (fp32) | 989.4 (bf16, fp16)]
//                        [--bandwidth-tbs 3.35] [--json FILE]
// MFU = model flops per token x tokens/s / peak, with model flops per token
// = 6 N (N = parameters) + 12 L T C (attention scores and values, forward and
// backward, T = sequence length). Peak: 494.7 TFLOP/s, H100 SXM dense TF32
// (no sparsity), or 989.4 dense bf16/fp16 for --precision bf16|fp16 (H200:
// the same); memory roofline: 3.35 TB/s HBM3 (H100 SXM). Both can be
// overridden for other GPUs (H200: 4.8 TB/s).
// GPU time is measured on the host around many queued launches that end in
// a blocking copy (Tensor::item), so launch overhead is amortized, not hidden.
// Without a usable GPU it says so and exits 0.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "07_mixed_precision/mixed_precision.h"
#include "dtp/device.h"
#include "dtp/error.h"
#include "dtp/nn.h"
#include "dtp/nn_ops.h"
#include "dtp/optim.h"
#include "bench_common.h"
#include "dtp_cli.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Mean seconds of fn over @p reps runs, after one warm-up run; @p sync
// blocks until the GPU is done.
double time_op(int reps, const std::function<void()>& fn, const std::function<void()>& sync) {
  fn();
  sync();
  const auto start = Clock::now();
  for (int i = 0; i < reps; ++i) fn();
  sync();
  return seconds_since(start) / reps;
}

struct OpRow {
  std::string name;
  double seconds;
  double bytes;  // minimal HBM traffic
  double flops;  // useful flops
};

// The step's big ops alone, in f32 at the model's shapes (@p batch x @p seq
// tokens, @p N parameters), each the mean of 20 runs, with the bytes and flops
// their roofline counts.
std::vector<OpRow> time_f32_ops(const dtp::GPTConfig& config, std::int64_t batch, std::int64_t seq, double N,
                                const std::function<void()>& sync) {
  const std::int64_t BT = batch * seq, H = config.heads, D = config.head_dim(), V = config.vocab_size;
  const double C = config.d_model, T = static_cast<double>(seq);
  const dtp::Device gpu = config.device;
  auto rnd = [&](const dtp::Shape& shape, std::uint64_t seed) {
    return dtp::Tensor::random_uniform(shape, seed, -1, 1, dtp::DType::f32, gpu);
  };
  std::vector<OpRow> rows;
  const int reps = 20;
  {
    dtp::Tensor x = rnd({BT, static_cast<std::int64_t>(C)}, 3), w = rnd({static_cast<std::int64_t>(C)}, 4),
                b = rnd({static_cast<std::int64_t>(C)}, 5), y = rnd(x.shape(), 6), mean = rnd({BT}, 7),
                rstd = rnd({BT}, 8), dx = rnd(x.shape(), 9), dw = rnd(w.shape(), 10), db = rnd(b.shape(), 11);
    const double xb = 4.0 * BT * C;
    rows.push_back({"layernorm fwd", time_op(reps, [&] { dtp::ops::layernorm_forward(x, w, b, y, mean, rstd); }, sync),
                    2 * xb, 0});
    rows.push_back({"layernorm bwd",
                    time_op(reps, [&] { dtp::ops::layernorm_backward(y, x, w, mean, rstd, dx, dw, db); }, sync),
                    3 * xb, 0});
  }
  {
    const dtp::Shape qs{batch, seq, H, D}, stat{batch, H, seq};
    dtp::Tensor q = rnd(qs, 12), k = rnd(qs, 13), v = rnd(qs, 14), out = rnd(qs, 15), m = rnd(stat, 16),
                l = rnd(stat, 17), dout = rnd(qs, 18), dq = rnd(qs, 19), dk = rnd(qs, 20), dv = rnd(qs, 21);
    const double fwd_flops = 2.0 * batch * H * T * T * D;  // QK^T and PV, causal half
    const double io = 4.0 * 4 * BT * C;
    rows.push_back({"flash attention fwd",
                    time_op(reps, [&] { dtp::ops::flash_attention_forward(q, k, v, out, m, l); }, sync), io,
                    fwd_flops});
    rows.push_back({"flash attention bwd",
                    time_op(reps, [&] { dtp::ops::flash_attention_backward(q, k, v, out, m, l, dout, dq, dk, dv); },
                            sync),
                    2 * io, 2.5 * fwd_flops});
  }
  {
    dtp::Tensor logits = rnd({BT, V}, 22), dlogits = rnd({BT, V}, 23);
    dtp::Tensor tg = dtp::Tensor::random_uniform({BT}, 24, 0, static_cast<double>(V), dtp::DType::i32, gpu), none;
    const double lb = 4.0 * BT * V;
    rows.push_back({"cross-entropy fwd", time_op(reps, [&] { dtp::ops::cross_entropy_forward(logits, tg, none); }, sync),
                    lb, 0});
    rows.push_back({"cross-entropy bwd",
                    time_op(reps, [&] { dtp::ops::cross_entropy_backward(logits, tg, 1.0 / BT, dlogits); }, sync),
                    2 * lb, 0});
  }
  {
    const auto n = static_cast<std::int64_t>(N);
    dtp::Tensor p = rnd({n}, 25), g = rnd({n}, 26), m = dtp::Tensor::zeros({n}, dtp::DType::f32, gpu),
                v = dtp::Tensor::zeros({n}, dtp::DType::f32, gpu);
    std::int64_t t = 0;
    rows.push_back({"adamw (all params)",
                    time_op(reps, [&] { dtp::ops::adamw_update(p, g, m, v, 1e-4, 0.9, 0.95, 1e-8, 0.1, ++t); }, sync),
                    7.0 * 4 * N, 0});
  }
  return rows;
}

}  // namespace

int main(int argc, char** argv) {
  dtp::GPTConfig config;
  config.layers = 12;
  config.d_model = 768;
  config.heads = 12;
  config.context = 1024;
  config.vocab_size = 50304;
  std::int64_t batch = 8, seq = -1, steps = 10, warmup = 2;
  double peak_tflops = 494.7, bandwidth_tbs = 3.35;
  std::string json_path, attention = "flash", precision = "fp32";
  CLI::App app{
      "Whole training steps (forward, backward, AdamW) of a GPT-2-small-shaped model on one GPU, in f32 "
      "with TF32 matmuls or in bf16/fp16 with f32 master weights (--precision): tokens/s and MFU, then "
      "(fp32) per-op timings against their roofline. Without a usable GPU it says so and exits 0.",
      "dtp-bench-train-step"};
  app.add_option("--batch", batch, "sequences per step")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 16))
      ->capture_default_str();
  app.add_option("--seq", seq, "tokens per sequence (default: --context)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20));
  dtp::bench::add_shape_options(app, config);
  app.add_option("--vocab", config.vocab_size, "vocabulary size")->check(CLI::Range(2, 1 << 24))->capture_default_str();
  app.add_option("--context", config.context, "learned positions (raised to --seq if smaller)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  dtp::bench::add_step_options(app, steps, warmup);
  app.add_option("--attention", attention, "the attention kernel")
      ->check(CLI::IsMember({"flash", "naive"}))
      ->capture_default_str();
  app.add_option("--precision", precision,
                 "fp32: f32 storage, TF32 matmuls; bf16 or fp16: a 16-bit model with f32 master weights "
                 "(chapter 07's step; fp16 with the dynamic loss scale)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}))
      ->capture_default_str();
  CLI::Option* peak_option =
      app.add_option("--peak-tflops", peak_tflops,
                     "the GPU's dense peak in TFLOP/s at --precision (default: H100 SXM, 494.7 TF32, 989.4 bf16/fp16)")
          ->check(CLI::Range(1e-3, 1e6));
  app.add_option("--bandwidth-tbs", bandwidth_tbs, "the GPU's memory bandwidth in TB/s (H100 SXM 3.35, H200 4.8)")
      ->check(CLI::Range(1e-3, 1e3))
      ->capture_default_str();
  app.add_option("--json", json_path, "append one JSON object per measurement to FILE")->type_name("FILE");
  app.footer(
      "MFU = model flops per token x tokens/s / peak, model flops per token = 6 N (N = parameters) + "
      "12 L T C (attention scores and values, forward and backward). GPU time is measured on the host "
      "around many queued launches that end in a blocking copy, so launch overhead is amortized, not "
      "hidden.");
  if (auto status = dtp::cli::parse(app, argc, argv)) return *status;
  try {
    config.attention = dtp::parse_attention_kind(attention);
    const bool mixed = precision != "fp32";
    if (mixed && peak_option->count() == 0) peak_tflops = 989.4;  // H100 SXM dense bf16/fp16
    if (dtp::cuda_device_count() == 0) {
      std::printf("no usable CUDA device: this benchmark needs a GPU\n");
      return 0;
    }
    if (seq < 0) seq = config.context;
    config.context = std::max<int>(config.context, static_cast<int>(seq));
    config.device = dtp::Device::cuda(0);
    if (mixed) config.dtype = precision == "bf16" ? dtp::DType::bf16 : dtp::DType::f16;
    config.validate();

    dtp::GPT model(config);
    // fp32: AdamW over the model's own buffers. bf16/fp16: over the f32 masters.
    std::unique_ptr<dtp::ch07::MasterWeights> masters;
    if (mixed) masters = std::make_unique<dtp::ch07::MasterWeights>(model);
    dtp::AdamW optimizer(mixed ? masters->buffers() : dtp::param_buffers(model));
    std::unique_ptr<dtp::ch07::LossScaler> scaler;
    if (precision == "fp16") scaler = std::make_unique<dtp::ch07::LossScaler>();
    const dtp::Tensor tokens = dtp::Tensor::random_uniform({batch, seq}, 1, 0, config.vocab_size, dtp::DType::i32,
                                                           config.device);
    const dtp::Tensor targets = dtp::Tensor::random_uniform({batch, seq}, 2, 0, config.vocab_size, dtp::DType::i32,
                                                            config.device);
    dtp::Tensor probe = model.embedding().params();
    auto sync = [&] { (void)probe.item(0); };  // a blocking copy: the stream is drained

    std::vector<double> step_seconds;
    double loss = 0;
    for (std::int64_t s = 0; s < warmup + steps; ++s) {
      const auto start = Clock::now();
      if (mixed) {
        loss = dtp::ch07::mixed_precision_step(*masters, optimizer, scaler.get(), {tokens, targets}, 3e-4, 0).loss;
      } else {
        model.zero_grad();
        loss = model.forward(tokens, targets);
        model.backward();
        optimizer.step(3e-4);
      }
      sync();
      if (s >= warmup) step_seconds.push_back(seconds_since(start));
    }
    std::sort(step_seconds.begin(), step_seconds.end());
    const double step_s = step_seconds[step_seconds.size() / 2];
    const double N = static_cast<double>(model.parameter_count());
    const double L = config.layers, C = config.d_model, T = static_cast<double>(seq);
    const double tokens_per_step = static_cast<double>(batch) * T;
    const double flops_per_token = 6 * N + 12 * L * T * C;
    const double tokens_per_s = tokens_per_step / step_s;
    const double mfu = flops_per_token * tokens_per_s / (peak_tflops * 1e12);

    // The big ops alone, timed by the fp32 run only (the bf16/fp16 runs time whole steps).
    const dtp::Device gpu = config.device;
    const std::vector<OpRow> rows = mixed ? std::vector<OpRow>{} : time_f32_ops(config, batch, seq, N, sync);

    std::printf("# train step on %s: %s, batch %lld x seq %lld, %s\n", gpu.str().c_str(), config.describe().c_str(),
                static_cast<long long>(batch), static_cast<long long>(seq),
                mixed ? (precision + " model and matmuls (f32 accumulation), f32 master weights and AdamW").c_str()
                      : "f32 storage, TF32 matmuls");
    std::printf("# peak %.1f TFLOP/s (dense %s), %.2f TB/s HBM; model flops/token %.4g (6N + 12 L T C, N = %.0f)\n",
                peak_tflops, mixed ? "bf16/fp16" : "TF32", bandwidth_tbs, flops_per_token, N);
    std::printf("step %.2f ms (median of %lld), loss %.4f, %.0f tokens/s, MFU %.1f%%\n\n", step_s * 1e3,
                static_cast<long long>(steps), loss, tokens_per_s, 100 * mfu);
    if (!rows.empty()) std::printf("%-22s %10s %12s %12s %10s\n", "op", "ms", "roofline ms", "bound", "of roof");
    FILE* json = json_path.empty() ? nullptr : std::fopen(json_path.c_str(), "a");
    DTP_CHECK(json_path.empty() || json != nullptr, "dtp-bench-train-step: cannot append to --json ", json_path);
    dtp::bench::RunContext context = dtp::bench::make_context();
    context.device = "cuda";  // this benchmark's device, whatever DTP_DEVICE says
    dtp::bench::JsonLine step_line;
    step_line.add("what", "train_step").add("gpu", gpu.str()).add("layers", config.layers)
        .add("d_model", config.d_model).add("heads", config.heads).add("vocab", config.vocab_size)
        .add("batch", batch).add("seq", seq).add("attention", dtp::attention_kind_name(config.attention))
        .add("precision", precision).add("params", N).add("step_s", step_s).add("loss", loss).add("tokens_per_s", tokens_per_s)
        .add("flops_per_token", flops_per_token).add("peak_tflops", peak_tflops).add("mfu", mfu);
    dtp::bench::write_line(json, dtp::bench::add_context(step_line, context));
    for (const OpRow& r : rows) {
      const double mem_s = r.bytes / (bandwidth_tbs * 1e12), flop_s = r.flops / (peak_tflops * 1e12);
      const double roof = std::max(mem_s, flop_s);
      const char* bound = flop_s > mem_s ? "compute" : "memory";
      std::printf("%-22s %10.3f %12.3f %12s %9.0f%%\n", r.name.c_str(), r.seconds * 1e3, roof * 1e3, bound,
                  100 * roof / r.seconds);
      dtp::bench::JsonLine op_line;
      op_line.add("what", "train_step_op").add("op", r.name).add("gpu", gpu.str()).add("batch", batch)
          .add("seq", seq).add("seconds", r.seconds).add("bytes", r.bytes).add("flops", r.flops)
          .add("roofline_s", roof).add("bound", bound).add("fraction_of_roofline", roof / r.seconds);
      dtp::bench::write_line(json, dtp::bench::add_context(op_line, context));
    }
    if (json) std::fclose(json);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
