// dtp-bench-train-step: one GPU, a GPT-2-small-shaped model (12 layers,
// d_model 768, 12 heads, context 1024, vocab 50304); prints tokens/s and MFU
// of whole training steps (forward, backward, AdamW), then every kind of op
// the step runs, alone and in the step's dtype: its time, how often a step
// calls it, its share of the step and its roofline, and what is left of the
// step once they are added up. --precision fp32 keeps f32 storage with TF32
// matmuls; bf16 and fp16 run chapter 07's mixed-precision step (a 16-bit
// model, f32 master weights and AdamW state; fp16 with the dynamic loss
// scale), the peer of PyTorch autocast.
//   dtp-bench-train-step [--batch 8] [--seq 1024] [--layers 12] [--d-model 768]
//                        [--heads 12] [--vocab 50304] [--context 1024] [--steps 10] [--warmup 2]
//                        [--attention flash|naive] [--precision fp32|bf16|fp16]
//                        [--peak-tflops 494.7 (fp32) | 989.4 (bf16, fp16)]
//                        [--bandwidth-tbs 3.35] [--device cuda|cpu] [--json FILE]
// MFU = model flops per token x tokens/s / peak, with model flops per token
// = 6 N (N = parameters) + 12 L T C (attention scores and values, forward and
// backward, T = sequence length). Peak: 494.7 TFLOP/s, H100 SXM dense TF32
// (no sparsity), or 989.4 dense bf16/fp16 for --precision bf16|fp16 (H200:
// the same); memory roofline: 3.35 TB/s HBM3 (H100 SXM). Both can be
// overridden for other GPUs (H200: 4.8 TB/s).
// GPU time is measured on the host around many queued launches that end in
// a blocking copy (Tensor::item), so launch overhead is amortized, not hidden.
// Without a usable GPU it says so and exits 0. --device cpu runs the same
// program on the CPU (for small shapes: it checks the program, not a speed).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "07_mixed_precision/mixed_precision.h"
#include "bench_common.h"
#include "bench_flags.h"
#include "dtp/device.h"
#include "dtp/error.h"
#include "dtp/nn.h"
#include "dtp/nn_ops.h"
#include "dtp/optim.h"
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
  double calls;    // per training step
  double seconds;  // per call
  double bytes;    // minimal memory traffic per call
  double flops;    // useful flops per call
};

// Every kind of op a training step runs, alone, at the model's shapes
// (@p batch x @p seq tokens, @p N parameters) and in its dtype, each the mean
// of @p reps runs, with how often one step calls it and the bytes and flops
// its roofline counts. The mixed-precision rows (casts, AdamW) are f32 where
// chapter 07's step keeps them in f32.
std::vector<OpRow> time_step_ops(const dtp::GPTConfig& config, std::int64_t batch, std::int64_t seq,
                                 double N, bool mixed, int reps,
                                 const std::function<void()>& sync) {
  const std::int64_t BT = batch * seq, H = config.heads, D = config.head_dim(),
                     V = config.vocab_size;
  const std::int64_t C = config.d_model, L = config.layers;
  const double T = static_cast<double>(seq), e = static_cast<double>(dtp::dtype_size(config.dtype));
  const dtp::Device dev = config.device;
  auto rnd = [&](const dtp::Shape& shape, std::uint64_t seed, dtp::DType dtype) {
    return dtp::Tensor::random_uniform(shape, seed, -1, 1, dtype, dev);
  };
  auto act = [&](const dtp::Shape& shape, std::uint64_t seed) {
    return rnd(shape, seed, config.dtype);
  };
  std::vector<OpRow> rows;
  auto time = [&](const std::string& name, double calls, double bytes, double flops,
                  const std::function<void()>& fn) {
    rows.push_back({name, calls, time_op(reps, fn, sync), bytes, flops});
  };
  const double x_bytes = e * static_cast<double>(BT * C);
  {
    dtp::Tensor x = act({BT, C}, 3), w = act({C}, 4), b = act({C}, 5), y = act({BT, C}, 6),
                dx = act({BT, C}, 9), dw = act({C}, 10), db = act({C}, 11);
    dtp::Tensor mean = act({BT}, 7), rstd = act({BT}, 8);
    const double ln_calls = 2.0 * static_cast<double>(L) + 1;  // two per block and the final one
    time("layernorm fwd", ln_calls, 2 * x_bytes, 0,
         [&] { dtp::ops::layernorm_forward(x, w, b, y, mean, rstd); });
    time("layernorm bwd", ln_calls, 3 * x_bytes, 0,
         [&] { dtp::ops::layernorm_backward(y, x, w, mean, rstd, dx, dw, db); });
    // Residuals: two per block forward; backward two residual paths and the
    // q/k/v input gradients summed into one.
    time("residual add (axpy)", 6.0 * static_cast<double>(L), 3 * x_bytes, 0,
         [&] { dtp::ops::axpy(y, 1.0, x); });
  }
  // A Linear layer [in -> out] over the BT rows: forward x W^T + b, backward
  // dx = dy W, dW += dy^T x and db += the column sums of dy.
  auto linear = [&](const std::string& name, std::int64_t in, std::int64_t out, double calls,
                    bool bias) {
    dtp::Tensor x = act({BT, in}, 30), w = act({out, in}, 31), y = act({BT, out}, 32),
                dy = act({BT, out}, 33), dx = act({BT, in}, 34), dw = act({out, in}, 35),
                b = act({out}, 36), db = act({out}, 37);
    const double M = static_cast<double>(BT), K = static_cast<double>(in),
                 Nn = static_cast<double>(out);
    const double flops = 2 * M * K * Nn;
    time(name + " fwd", calls, e * (M * K + K * Nn + M * Nn * (bias ? 3 : 1)), flops, [&] {
      dtp::ops::matmul(x, w, y, false, true);
      if (bias) dtp::ops::add_bias(y, b);
    });
    time(name + " bwd dx", calls, e * (M * Nn + K * Nn + M * K), flops,
         [&] { dtp::ops::matmul(dy, w, dx); });
    time(name + " bwd dW", calls, e * (M * Nn + M * K + 2 * K * Nn + (bias ? M * Nn : 0)), flops,
         [&] {
           dtp::ops::matmul(dy, x, dw, true, false, 1.0, 1.0);
           if (bias) dtp::ops::bias_backward(dy, db);
         });
  };
  linear("linear C->C (q, k, v, proj)", C, C, 4.0 * static_cast<double>(L), true);
  linear("linear C->4C (fc)", C, 4 * C, static_cast<double>(L), true);
  linear("linear 4C->C (fc2)", 4 * C, C, static_cast<double>(L), true);
  linear("lm head C->V", C, V, 1, false);
  {
    dtp::Tensor x = act({BT, 4 * C}, 40), y = act({BT, 4 * C}, 41), dy = act({BT, 4 * C}, 42);
    time("gelu fwd", static_cast<double>(L), 8 * x_bytes, 0, [&] { dtp::ops::gelu_forward(x, y); });
    time("gelu bwd", static_cast<double>(L), 12 * x_bytes, 0,
         [&] { dtp::ops::gelu_backward(x, dy, y); });
  }
  {
    const dtp::Shape qs{batch, seq, H, D}, stat{batch, H, seq};
    dtp::Tensor q = act(qs, 12), k = act(qs, 13), v = act(qs, 14), out = act(qs, 15),
                m = act(stat, 16), l = act(stat, 17), dout = act(qs, 18), dq = act(qs, 19),
                dk = act(qs, 20), dv = act(qs, 21);
    const double fwd_flops =
        2.0 * static_cast<double>(batch * H) * T * T * static_cast<double>(D);  // causal half
    dtp::ops::flash_attention_forward(q, k, v, out, m, l);  // real statistics for the backward
    time("flash attention fwd", static_cast<double>(L), 4 * x_bytes, fwd_flops,
         [&] { dtp::ops::flash_attention_forward(q, k, v, out, m, l); });
    time("flash attention bwd", static_cast<double>(L), 8 * x_bytes, 2.5 * fwd_flops,
         [&] { dtp::ops::flash_attention_backward(q, k, v, out, m, l, dout, dq, dk, dv); });
    if (config.dtype != dtp::DType::f32 && dev.is_cuda()) {
      // The 16-bit WMMA kernels, the step's alternative (DTP_FLASH_KERNEL=wmma):
      // timed for comparison, not counted in the step (0 calls).
      const char* chosen = std::getenv("DTP_FLASH_KERNEL");
      const std::string before = chosen == nullptr ? "" : chosen;
      setenv("DTP_FLASH_KERNEL", "wmma", 1);
      time("flash attention fwd (WMMA)", 0, 4 * x_bytes, fwd_flops,
           [&] { dtp::ops::flash_attention_forward(q, k, v, out, m, l); });
      time("flash attention bwd (WMMA)", 0, 8 * x_bytes, 2.5 * fwd_flops,
           [&] { dtp::ops::flash_attention_backward(q, k, v, out, m, l, dout, dq, dk, dv); });
      if (before.empty())
        unsetenv("DTP_FLASH_KERNEL");
      else
        setenv("DTP_FLASH_KERNEL", before.c_str(), 1);
    }
  }
  {
    dtp::Tensor logits = act({BT, V}, 22), dlogits = act({BT, V}, 23), none;
    dtp::Tensor tg =
        dtp::Tensor::random_uniform({BT}, 24, 0, static_cast<double>(V), dtp::DType::i32, dev);
    const double lb = e * static_cast<double>(BT * V);
    time("cross-entropy fwd", 1, lb, 0, [&] { dtp::ops::cross_entropy_forward(logits, tg, none); });
    time("cross-entropy bwd", 1, 2 * lb, 0,
         [&] { dtp::ops::cross_entropy_backward(logits, tg, 1.0 / BT, dlogits); });
    dtp::Tensor table = act({V, C}, 25), x = act({BT, C}, 26), dtable = act({V, C}, 27);
    time("embedding fwd", 1, 2 * x_bytes, 0, [&] { dtp::ops::embedding_forward(tg, table, x); });
    time("embedding bwd", 1, 2 * x_bytes + e * static_cast<double>(V * C), 0,
         [&] { dtp::ops::embedding_backward(tg, x, dtable); });
  }
  {
    const auto n = static_cast<std::int64_t>(N);
    dtp::Tensor p = rnd({n}, 25, dtp::DType::f32), g = rnd({n}, 26, dtp::DType::f32),
                m = dtp::Tensor::zeros({n}, dtp::DType::f32, dev),
                v = dtp::Tensor::zeros({n}, dtp::DType::f32, dev);
    std::int64_t t = 0;
    time("adamw (all params, f32)", 1, 7.0 * 4 * N, 0,
         [&] { dtp::ops::adamw_update(p, g, m, v, 1e-4, 0.9, 0.95, 1e-8, 0.1, ++t); });
    dtp::Tensor grads = rnd({n}, 27, config.dtype);
    time("zero the gradients", 1, e * N, 0, [&] { grads.fill(0); });
    if (mixed) {
      // Chapter 07's step: gradients up to f32 for the update, masters down after it.
      time("cast grads up to f32", 1, (e + 4) * N, 0, [&] { dtp::ops::cast(grads, g); });
      time("cast masters down", 1, (e + 4) * N, 0, [&] { dtp::ops::cast(p, grads); });
    }
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
  std::string json_path, attention = "flash", precision = "fp32", device = "cuda";
  CLI::App app{
      "Whole training steps (forward, backward, AdamW) of a GPT-2-small-shaped model on one GPU, "
      "in f32 "
      "with TF32 matmuls or in bf16/fp16 with f32 master weights (--precision): tokens/s and MFU, "
      "then "
      "every kind of op the step runs, against its roofline and as a share of the step. Without a "
      "usable GPU "
      "it says so and exits 0.",
      "dtp-bench-train-step"};
  app.add_option("--batch", batch, "sequences per step")
      ->check(dtp::cli::Range(std::int64_t{1}, std::int64_t{1} << 16))
      ->capture_default_str();
  app.add_option("--seq", seq, "tokens per sequence (default: --context)")
      ->check(dtp::cli::Range(std::int64_t{1}, std::int64_t{1} << 20));
  dtp::bench::add_shape_options(app, config);
  app.add_option("--vocab", config.vocab_size, "vocabulary size")
      ->check(dtp::cli::Range(2, 1 << 24))
      ->capture_default_str();
  app.add_option("--context", config.context, "learned positions (raised to --seq if smaller)")
      ->check(dtp::cli::Range(1, 1 << 20))
      ->capture_default_str();
  dtp::bench::add_step_options(app, steps, warmup);
  app.add_option("--attention", attention, "the attention kernel")
      ->check(CLI::IsMember({"flash", "naive"}))
      ->capture_default_str();
  app.add_option(
         "--precision", precision,
         "fp32: f32 storage, TF32 matmuls; bf16 or fp16: a 16-bit model with f32 master weights "
         "(chapter 07's step; fp16 with the dynamic loss scale)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}))
      ->capture_default_str();
  CLI::Option* peak_option = app.add_option("--peak-tflops", peak_tflops,
                                            "the GPU's dense peak in TFLOP/s at --precision "
                                            "(default: H100 SXM, 494.7 TF32, 989.4 bf16/fp16)")
                                 ->check(dtp::cli::Range(1e-3, 1e6));
  app.add_option("--bandwidth-tbs", bandwidth_tbs,
                 "the GPU's memory bandwidth in TB/s (H100 SXM 3.35, H200 4.8)")
      ->check(dtp::cli::Range(1e-3, 1e3))
      ->capture_default_str();
  app.add_option("--device", device,
                 "cuda, or cpu to check the program on a machine without a GPU (small shapes; the "
                 "MFU is then "
                 "against --peak-tflops, a GPU's)")
      ->check(CLI::IsMember({"cuda", "cpu"}))
      ->capture_default_str();
  app.add_option("--json", json_path, "append one JSON object per measurement to FILE")
      ->type_name("FILE");
  app.footer(
      "MFU = model flops per token x tokens/s / peak, model flops per token = 6 N (N = parameters) "
      "+ "
      "12 L T C (attention scores and values, forward and backward). GPU time is measured on the "
      "host "
      "around many queued launches that end in a blocking copy, so launch overhead is amortized, "
      "not "
      "hidden.");
  if (auto status = dtp::cli::parse(app, argc, argv)) return *status;
  try {
    config.attention = dtp::parse_attention_kind(attention);
    const bool mixed = precision != "fp32";
    if (mixed && peak_option->count() == 0) peak_tflops = 989.4;  // H100 SXM dense bf16/fp16
    const bool on_gpu = device == "cuda";
    if (on_gpu && dtp::cuda_device_count() == 0) {
      std::printf("no usable CUDA device: this benchmark needs a GPU\n");
      return 0;
    }
    if (seq < 0) seq = config.context;
    config.context = std::max<int>(config.context, static_cast<int>(seq));
    config.device = on_gpu ? dtp::Device::cuda(0) : dtp::Device::cpu();
    if (mixed) config.dtype = precision == "bf16" ? dtp::DType::bf16 : dtp::DType::f16;
    config.validate();
    // The output and the environment are checked before minutes of measuring.
    std::optional<dtp::bench::RunContext> found =
        dtp::bench::context_from_env("dtp-bench-train-step");
    if (!found) return 2;
    dtp::bench::RunContext context = *found;
    context.device = device;  // this benchmark's device, whatever DTP_DEVICE says
    FILE* json = nullptr;
    if (!dtp::bench::open_json("dtp-bench-train-step", json_path, json)) return 2;

    dtp::GPT model(config);
    // fp32: AdamW over the model's own buffers. bf16/fp16: over the f32 masters.
    std::unique_ptr<dtp::ch07::MasterWeights> masters;
    if (mixed) masters = std::make_unique<dtp::ch07::MasterWeights>(model);
    dtp::AdamW optimizer(mixed ? masters->buffers() : dtp::param_buffers(model));
    std::unique_ptr<dtp::ch07::LossScaler> scaler;
    if (precision == "fp16") scaler = std::make_unique<dtp::ch07::LossScaler>();
    const dtp::Tensor tokens = dtp::Tensor::random_uniform({batch, seq}, 1, 0, config.vocab_size,
                                                           dtp::DType::i32, config.device);
    const dtp::Tensor targets = dtp::Tensor::random_uniform({batch, seq}, 2, 0, config.vocab_size,
                                                            dtp::DType::i32, config.device);
    dtp::Tensor probe = model.embedding().params();
    auto sync = [&] { (void)probe.item(0); };  // a blocking copy: the stream is drained

    std::vector<double> step_seconds;
    double loss = 0;
    for (std::int64_t s = 0; s < warmup + steps; ++s) {
      const auto start = Clock::now();
      if (mixed) {
        loss = dtp::ch07::mixed_precision_step(*masters, optimizer, scaler.get(), {tokens, targets},
                                               3e-4, 0)
                   .loss;
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

    // Every kind of op alone, in the step's dtype, and how much of the step they add up to.
    const dtp::Device gpu = config.device;
    const std::vector<OpRow> rows =
        time_step_ops(config, batch, seq, N, mixed, on_gpu ? 20 : 1, sync);

    std::printf(
        "# train step on %s: %s, batch %lld x seq %lld, %s\n", gpu.str().c_str(),
        config.describe().c_str(), static_cast<long long>(batch), static_cast<long long>(seq),
        mixed ? (precision + " model and matmuls (f32 accumulation), f32 master weights and AdamW")
                    .c_str()
              : "f32 storage, TF32 matmuls");
    std::printf(
        "# peak %.1f TFLOP/s (dense %s), %.2f TB/s HBM; model flops/token %.4g (6N + 12 L T C, N = "
        "%.0f)\n",
        peak_tflops, mixed ? "bf16/fp16" : "TF32", bandwidth_tbs, flops_per_token, N);
    if (!on_gpu)
      std::printf(
          "# on the CPU (--device cpu): this checks the program; its speeds are not a GPU's\n");
    std::printf("step %.2f ms (median of %lld), loss %.4f, %.0f tokens/s, MFU %.1f%%\n\n",
                step_s * 1e3, static_cast<long long>(steps), loss, tokens_per_s, 100 * mfu);
    if (!rows.empty())
      std::printf("%-36s %9s %7s %10s %8s %12s %8s %8s\n", "op", "ms/call", "calls", "ms/step",
                  "of step", "roofline ms", "bound", "of roof");
    dtp::bench::JsonLine step_line;
    step_line.add("what", "train_step")
        .add("gpu", gpu.str())
        .add("layers", config.layers)
        .add("d_model", config.d_model)
        .add("heads", config.heads)
        .add("vocab", config.vocab_size)
        .add("batch", batch)
        .add("seq", seq)
        .add("attention", dtp::attention_kind_name(config.attention))
        .add("precision", precision)
        .add("params", N)
        .add("step_s", step_s)
        .add("loss", loss)
        .add("tokens_per_s", tokens_per_s)
        .add("flops_per_token", flops_per_token)
        .add("peak_tflops", peak_tflops)
        .add("mfu", mfu);
    dtp::bench::write_line(json, dtp::bench::add_context(step_line, context));
    double ops_per_step = 0;
    for (const OpRow& r : rows) {
      const double mem_s = r.bytes / (bandwidth_tbs * 1e12),
                   flop_s = r.flops / (peak_tflops * 1e12);
      const double roof = std::max(mem_s, flop_s);
      const char* bound = flop_s > mem_s ? "compute" : "memory";
      const double per_step = r.calls * r.seconds;
      ops_per_step += per_step;
      std::printf("%-36s %9.3f %7.0f %10.3f %7.1f%% %12.3f %8s %7.0f%%\n", r.name.c_str(),
                  r.seconds * 1e3, r.calls, per_step * 1e3, 100 * per_step / step_s, roof * 1e3,
                  bound, 100 * roof / r.seconds);
      dtp::bench::JsonLine op_line;
      op_line.add("what", "train_step_op")
          .add("op", r.name)
          .add("gpu", gpu.str())
          .add("precision", precision)
          .add("batch", batch)
          .add("seq", seq)
          .add("seconds", r.seconds)
          .add("calls_per_step", r.calls)
          .add("seconds_per_step", per_step)
          .add("fraction_of_step", per_step / step_s)
          .add("bytes", r.bytes)
          .add("flops", r.flops)
          .add("roofline_s", roof)
          .add("bound", bound)
          .add("fraction_of_roofline", roof / r.seconds);
      dtp::bench::write_line(json, dtp::bench::add_context(op_line, context));
    }
    if (!rows.empty()) {
      // What the table does not explain: launch gaps, allocation, and small ops it does not time.
      std::printf("%-36s %9s %7s %10.3f %7.1f%%\n", "sum of the ops above", "", "",
                  ops_per_step * 1e3, 100 * ops_per_step / step_s);
      std::printf("%-36s %9s %7s %10.3f %7.1f%%\n", "rest of the step", "", "",
                  (step_s - ops_per_step) * 1e3, 100 * (step_s - ops_per_step) / step_s);
      dtp::bench::JsonLine rest;
      rest.add("what", "train_step_rest")
          .add("gpu", gpu.str())
          .add("precision", precision)
          .add("step_s", step_s)
          .add("ops_s", ops_per_step)
          .add("rest_s", step_s - ops_per_step);
      dtp::bench::write_line(json, dtp::bench::add_context(rest, context));
    }
    return dtp::bench::close_json(json, "dtp-bench-train-step", 0);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dtp-bench-train-step: error: %s\n", e.what());
    return 1;
  }
}
