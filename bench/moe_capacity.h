// The mixture-of-experts numbers of dtp-bench-sequence-expert (part 3): a
// small MoE GPT's real router probabilities, routed at several capacity
// factors by dtp::moe_route, and what a router that chooses uniformly at
// random would give. Printing and JSON stay in bench/sequence_expert/moe.cpp.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "dtp/launch.h"
#include "dtp/moe_routing.h"
#include "dtp/trainer.h"

namespace dtp::bench::moe {

struct Options {
  std::vector<std::int64_t> experts = {4, 8};
  std::vector<std::int64_t> top_k = {1, 2};
  std::vector<double> coefs = {0.0, 0.01};
  std::int64_t steps = 300;  // training steps between the two looks at the router
  int trials = 200;          // random routings behind the uniform router's load balance
  // Routed at each of these, then at E/k (capacity N: nothing can drop).
  std::vector<double> capacity_factors = {0.5, 0.75, 1.0, 1.25, 1.5, 2.0};
  // The model: `dtp train --moe-experts E`'s defaults, trained on batches of
  // 8 x 64 tokens; the router is looked at on one batch of N = 16 x 64.
  int d_model = 64, heads = 4, layers = 2, vocab = 64;
  std::int64_t batch = 8, probe_batch = 16, seq = 64;
  double train_capacity_factor = 1.25;
};

/// Every capacity factor one routing is looked at with: the options' list, then E/k.
inline std::vector<double> factors_for(const Options& o, int experts, int top_k) {
  std::vector<double> f = o.capacity_factors;
  const double enough = static_cast<double>(experts) / top_k;
  if (std::find(f.begin(), f.end(), enough) == f.end()) f.push_back(enough);
  return f;
}

/// One batch's routing at one capacity factor.
struct Routed {
  std::int64_t capacity = 0;
  std::int64_t dropped = 0;      // choices that found their expert full
  std::int64_t tokens_lost = 0;  // tokens whose every choice was dropped
  double drop_fraction = 0;      // dropped / (N k)
};

inline Routed route(const std::vector<double>& probs, int experts, int top_k, double factor) {
  const MoeRouting r = moe_route(probs, experts, top_k, factor);
  Routed out;
  out.capacity = r.capacity;
  out.dropped = r.dropped();
  for (std::int64_t n = 0; n < r.tokens; ++n) {
    bool any = false;
    for (int j = 0; j < top_k; ++j) any = any || r.kept[static_cast<std::size_t>(n * top_k + j)];
    if (!any) ++out.tokens_lost;
  }
  out.drop_fraction = static_cast<double>(out.dropped) / static_cast<double>(r.tokens * top_k);
  return out;
}

/// max_e f_e over the mean 1/E: the most loaded expert's load over an even
/// share, before drops (capacity does not change f).
inline double max_over_mean_load(const std::vector<double>& probs, int experts, int top_k) {
  const MoeRouting r = moe_route(probs, experts, top_k, static_cast<double>(experts) / top_k);
  return experts * *std::max_element(r.load.begin(), r.load.end());
}

inline double balance_loss(const std::vector<double>& probs, int experts, int top_k) {
  return moe_route(probs, experts, top_k, static_cast<double>(experts) / top_k).balance_loss();
}

/// The router probabilities [N, E] of every block for @p batch: the
/// embedding and each block's forward run by hand, so the trainer's own
/// state (saved activations, gradients) is untouched.
inline std::vector<std::vector<double>> router_probabilities(GPT& model, const Batch& batch) {
  std::vector<std::vector<double>> probs;
  EmbeddingSaved embedding_saved;
  Tensor x = model.embedding().forward(batch.inputs, embedding_saved);
  for (int layer = 0; layer < model.num_blocks(); ++layer) {
    BlockSaved saved;
    x = model.block(layer).forward(x, saved);
    probs.push_back(saved.moe.probs.to_vector());
  }
  return probs;
}

/// What one model looked like at init and after training.
struct ModelLook {
  std::vector<std::vector<double>> init_probs, trained_probs;  // per block, [N, E] row-major
  double first_loss = 0,
         last_loss =
             0;  // training loss (with the balance term), mean of the first and last 10 steps
  std::int64_t parameters = 0, tokens = 0;
};

inline TrainConfig moe_config(const Options& o, int experts, int top_k, double coef) {
  TrainConfig c;
  c.model.d_model = o.d_model;
  c.model.heads = o.heads;
  c.model.layers = o.layers;
  c.model.vocab_size = o.vocab;
  c.model.experts = experts;
  c.model.top_k = top_k;
  c.model.capacity_factor = o.train_capacity_factor;
  c.model.aux_loss_coef = coef;
  c.batch = o.batch;
  c.seq = o.seq;
  c.steps = std::max<std::int64_t>(o.steps, 1);
  return c;
}

constexpr std::uint64_t kProbeSeed = 20261124;

inline ModelLook look_at_model(const Options& o, int experts, int top_k, double coef) {
  ModelLook look;
  launch(World::from_env(1), [&](Comm&) {
    Trainer trainer(moe_config(o, experts, top_k, coef));
    // A batch the training never sees: drawn with another seed, the same for every --moe-steps.
    const BatchSampler probes(trainer.sampler().data(), o.probe_batch, o.seq, 0, 1, kProbeSeed);
    const Batch probe = probes.batch(0);
    look.tokens = probe.inputs.numel();
    look.parameters = trainer.model().parameter_count();
    look.init_probs = router_probabilities(trainer.model(), probe);
    std::vector<double> losses;
    for (std::int64_t s = 0; s < o.steps; ++s) losses.push_back(trainer.step().loss);
    look.trained_probs = router_probabilities(trainer.model(), probe);
    const std::size_t w = std::min<std::size_t>(10, losses.size());
    auto mean = [](auto first, auto last) {
      double sum = 0;
      for (auto it = first; it != last; ++it) sum += *it;
      return last == first ? 0.0 : sum / static_cast<double>(last - first);
    };
    look.first_loss = mean(losses.begin(), losses.begin() + static_cast<std::ptrdiff_t>(w));
    look.last_loss = mean(losses.end() - static_cast<std::ptrdiff_t>(w), losses.end());
  });
  return look;
}

/// The uniform router, exactly: each token's k choices are a uniformly random
/// k-subset, so expert e's load is Binomial(N, k/E) and it drops
/// max(0, load - c); expected drops over all E experts, as a fraction of N k.
inline double uniform_drop_fraction(std::int64_t tokens, int experts, int top_k,
                                    std::int64_t capacity) {
  const double p = static_cast<double>(top_k) / experts;
  if (p >= 1)
    return 0.0;  // every token picks every expert: load N <= capacity or not, no randomness
  double expected_excess = 0;
  for (std::int64_t x = capacity + 1; x <= tokens; ++x) {
    const double log_pmf = std::lgamma(tokens + 1.0) - std::lgamma(x + 1.0) -
                           std::lgamma(tokens - x + 1.0) + x * std::log(p) +
                           (tokens - x) * std::log1p(-p);
    expected_excess += static_cast<double>(x - capacity) * std::exp(log_pmf);
  }
  return experts * expected_excess / static_cast<double>(tokens * top_k);
}

/// The uniform router, simulated: @p trials batches of random probability
/// rows (independent uniform numbers, normalized: the top-k set is a uniform
/// k-subset) through moe_route. Means over the trials.
struct UniformRouter {
  std::vector<double> drop_fraction;  // per capacity factor
  double max_over_mean_load = 0;
};

inline UniformRouter simulate_uniform_router(std::int64_t tokens, int experts, int top_k,
                                             const std::vector<double>& factors, int trials) {
  UniformRouter u;
  u.drop_fraction.assign(factors.size(), 0.0);
  std::mt19937_64 generator(kProbeSeed);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::vector<double> probs(static_cast<std::size_t>(tokens * experts));
  for (int t = 0; t < trials; ++t) {
    for (std::int64_t n = 0; n < tokens; ++n) {
      double sum = 0;
      for (int e = 0; e < experts; ++e)
        sum += probs[static_cast<std::size_t>(n * experts + e)] = uniform(generator);
      for (int e = 0; e < experts; ++e) probs[static_cast<std::size_t>(n * experts + e)] /= sum;
    }
    for (std::size_t f = 0; f < factors.size(); ++f)
      u.drop_fraction[f] += route(probs, experts, top_k, factors[f]).drop_fraction / trials;
    u.max_over_mean_load += max_over_mean_load(probs, experts, top_k) / trials;
  }
  return u;
}

}  // namespace dtp::bench::moe
