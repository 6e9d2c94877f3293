// Helpers for the 7.2 and 7.4 checkers: a small GPT, seeded batches, a
// bitwise comparison that names the first differing element, and the
// checker's own mixed-precision step (written out with the runtime's ops).
// Models live on the checker's device (the GPU in the gpu flavour), where
// the runtime's kernels are deterministic: the same ops in the same order
// give the same bits there too.
#pragma once

#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "dtp/dtp.h"
#include "dtp/optim.h"
#include "support/harness.h"

namespace dtp::ch07::testing {

/// A small GPT on @p device: vocabulary 32, context 8, C = 16 with 2 heads, 2 blocks.
inline GPTConfig small_config(DType dtype, Device device = dtp::testing::checker_device()) {
  GPTConfig c;
  c.vocab_size = 32;
  c.context = 8;
  c.d_model = 16;
  c.heads = 2;
  c.layers = 2;
  c.mlp_ratio = 2;
  c.init_std = 0.1;
  c.dtype = dtype;
  c.device = device;
  return c;
}

/// @p rows sequences of the full context, token ids drawn from @p seed, on the model's device.
inline Batch batch_of(const GPTConfig& config, std::int64_t rows, std::uint64_t seed) {
  Rng rng(seed);
  Batch b{Tensor::empty({rows, config.context}, DType::i32),
          Tensor::empty({rows, config.context}, DType::i32)};
  for (std::int64_t i = 0; i < b.inputs.numel(); ++i) {
    b.inputs.data<std::int32_t>()[i] = static_cast<std::int32_t>(rng.below(config.vocab_size));
    b.targets.data<std::int32_t>()[i] = static_cast<std::int32_t>(rng.below(config.vocab_size));
  }
  return {b.inputs.to(config.device), b.targets.to(config.device)};
}

/// "" when @p got equals @p expected element for element (any dtypes),
/// else the first differing element, both values and how many differ.
inline std::string first_difference(const Tensor& expected, const Tensor& got) {
  if (expected.numel() != got.numel())
    return "expected " + expected.describe() + ", got " + got.describe();
  const std::vector<double> e = expected.to_vector(), g = got.to_vector();
  std::int64_t first = -1, count = 0;
  for (std::size_t i = 0; i < e.size(); ++i)
    if (!(e[i] == g[i]) && !(e[i] != e[i] && g[i] != g[i])) {
      if (first < 0) first = static_cast<std::int64_t>(i);
      ++count;
    }
  if (first < 0) return "";
  std::ostringstream out;
  out.precision(9);
  out << "element " << first << " is " << g[static_cast<std::size_t>(first)] << ", expected "
      << e[static_cast<std::size_t>(first)] << " (" << count << " of " << e.size()
      << " elements differ)";
  return out.str();
}

/// The checker's own mixed-precision training of a second copy of a model:
/// f32 masters with their own f32 gradient buffers, AdamW with defaults.
struct CheckerRun {
  explicit CheckerRun(const GPTConfig& config) : model(config) {
    std::vector<ParamBuffer> buffers;
    for (Unit* unit : model.units()) {
      const Device device = unit->params().device();
      Tensor master = Tensor::empty(unit->params().shape(), DType::f32, device);
      ops::cast(unit->params(), master);
      masters.push_back(master);
      grads.push_back(Tensor::zeros(unit->params().shape(), DType::f32, device));
      buffers.push_back({unit->name(), master, grads.back()});
    }
    adam = std::make_unique<AdamW>(buffers);
  }

  struct Step {
    double loss = 0, grad_norm = 0;
  };

  /// Forward, backward of scale x loss, cast up, norm, unscale, clip, AdamW,
  /// cast down.
  Step step(const Batch& batch, double scale, double lr, double max_norm) {
    masters_before.clear();
    for (const Tensor& m : masters) masters_before.push_back(m.clone());
    model.zero_grad();
    Step s;
    s.loss = model.forward(batch.inputs, batch.targets);
    model.backward(scale);
    std::vector<Unit*> units = model.units();
    for (std::size_t i = 0; i < units.size(); ++i) ops::cast(units[i]->grads(), grads[i]);
    return update(s, scale, lr, max_norm);
  }

  /// The update half of step(), on gradients already in grads.
  Step update(Step s, double scale, double lr, double max_norm) {
    s.grad_norm = global_grad_norm(grads) / scale;
    for (Tensor& g : grads) ops::scale(g, 1.0 / scale);
    clip_grad_norm(grads, max_norm);
    adam->step(lr);
    std::vector<Unit*> units = model.units();
    for (std::size_t i = 0; i < units.size(); ++i) ops::cast(masters[i], units[i]->params());
    return s;
  }

  GPT model;
  std::vector<Tensor> masters, grads;
  std::vector<Tensor> masters_before;  ///< the masters before the last step
  std::unique_ptr<AdamW> adam;
};

}  // namespace dtp::ch07::testing
