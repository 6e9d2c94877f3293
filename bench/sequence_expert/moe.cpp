// Part 3, "moe_capacity" (--only moe): a small MoE GPT (dtp::Trainer, GPTConfig
// experts and top_k, synthetic data) for every E of --moe-experts, k of
// --moe-top-k and aux_loss_coef of --moe-coefs, at init and after --moe-steps
// AdamW steps on batches of 8 x 64 tokens (trained with capacity factor 1.25,
// the default). Each block's router probabilities of one held-out batch of
// 16 x 64 tokens (drawn with another seed; every block's forward run by hand)
// are routed with dtp::moe_route at capacity factors 0.5 .. 2 and E/k: choices
// dropped, tokens that lost every choice, and the load balance max_e f_e / mean
// (E max_e f_e, before drops). Peer: a router whose choices are uniform at
// random: expert loads Binomial(N, k/E), so expected drops E * sum_x
// max(0, x - c) P(x) exactly; its load balance by simulation (random rows
// through moe_route, --moe-trials of them).
#include <cstdio>
#include <string>
#include <vector>

#include "dtp/moe_routing.h"
#include "parts.h"

namespace dtp::bench::sequence_expert {

int run_moe_part(const MoeOptions& o, const RunContext& ctx, FILE* json) {
  namespace moe = dtp::bench::moe;
  std::printf(
      "# moe capacity: GPT d_model %d, %d layers, %d heads, vocabulary %d, synthetic data; router "
      "probabilities of one held-out batch of %lld x %lld tokens per block, at init and after %lld "
      "AdamW "
      "steps of %lld x %lld tokens (trained at capacity factor %g)\n",
      o.d_model, o.layers, o.heads, o.vocab, static_cast<long long>(o.probe_batch),
      static_cast<long long>(o.seq), static_cast<long long>(o.steps),
      static_cast<long long>(o.batch), static_cast<long long>(o.seq), o.train_capacity_factor);
  std::printf(
      "# drop %%: choices dropped / (N k) at each capacity factor (the last is E/k); uniform: a "
      "router choosing "
      "uniformly at random (binomial, exact). load: max_e f_e / mean (uniform: simulated, %d "
      "batches)\n",
      o.trials);
  for (std::int64_t E64 : o.experts)
    for (std::int64_t k64 : o.top_k) {
      const int E = static_cast<int>(E64), k = static_cast<int>(k64);
      if (k > E) continue;
      const std::vector<double> factors = moe::factors_for(o, E, k);
      std::printf("%-30s %5s", "E, k, coef, when", "load");
      for (double f : factors)
        std::printf(" %7s", ("cf " + std::to_string(f).substr(0, 4)).c_str());
      std::printf("  %s\n", "loss first -> last");
      const std::int64_t N = o.probe_batch * o.seq;
      const moe::UniformRouter uniform = moe::simulate_uniform_router(N, E, k, factors, o.trials);
      std::vector<double> exact;
      for (double f : factors)
        exact.push_back(moe::uniform_drop_fraction(N, E, k, dtp::moe_capacity(N, E, k, f)));
      std::printf("E %d k %d %-22s %5.2f", E, k, "uniform router", uniform.max_over_mean_load);
      for (double x : exact) std::printf(" %6.1f%%", 100 * x);
      std::printf("\n");
      for (double coef : o.coefs) {
        const moe::ModelLook look = moe::look_at_model(o, E, k, coef);
        for (int trained = 0; trained < 2; ++trained) {
          const auto& blocks = trained ? look.trained_probs : look.init_probs;
          for (std::size_t b = 0; b < blocks.size(); ++b) {
            const std::vector<double>& probs = blocks[b];
            std::vector<double> fraction, capacity, dropped, lost;
            for (double f : factors) {
              const moe::Routed r = moe::route(probs, E, k, f);
              fraction.push_back(r.drop_fraction);
              capacity.push_back(static_cast<double>(r.capacity));
              dropped.push_back(static_cast<double>(r.dropped));
              lost.push_back(static_cast<double>(r.tokens_lost));
            }
            const double load = moe::max_over_mean_load(probs, E, k);
            char label[64];
            std::snprintf(label, sizeof label, "%g %s block %zu", coef,
                          trained ? "trained" : "init", b);
            std::printf("E %d k %d %-22s %5.2f", E, k, label, load);
            for (double x : fraction) std::printf(" %6.1f%%", 100 * x);
            if (trained && b == 0) std::printf("  %.3f -> %.3f", look.first_loss, look.last_loss);
            std::printf("\n");
            JsonLine line;
            line.add("what", "moe_capacity")
                .add("experts", E)
                .add("top_k", k)
                .add("aux_loss_coef", coef)
                .add("stage", trained ? "trained" : "init")
                .add("steps", trained ? o.steps : std::int64_t{0})
                .add("block", static_cast<int>(b))
                .add("tokens", N)
                .add("d_model", o.d_model)
                .add("layers", o.layers)
                .add("heads", o.heads)
                .add("vocab_size", o.vocab)
                .add("train_batch", o.batch)
                .add("probe_batch", o.probe_batch)
                .add("seq", o.seq)
                .add("parameters", look.parameters)
                .add("train_capacity_factor", o.train_capacity_factor)
                .add("capacity_factors", factors)
                .add("capacity", capacity)
                .add("dropped_choices", dropped)
                .add("drop_fraction", fraction)
                .add("tokens_lost", lost)
                .add("max_over_mean_load", load)
                .add("balance_loss", moe::balance_loss(probs, E, k))
                .add("uniform_drop_fraction", exact)
                .add("uniform_drop_fraction_simulated", uniform.drop_fraction)
                .add("uniform_max_over_mean_load", uniform.max_over_mean_load)
                .add("uniform_trials", o.trials)
                .add("first_loss", look.first_loss)
                .add("last_loss", look.last_loss);
            add_context(line, ctx);
            write_line(json, line);
          }
        }
      }
      std::printf("\n");
    }
  return 0;
}

}  // namespace dtp::bench::sequence_expert
