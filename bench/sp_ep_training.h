// The training-step numbers of dtp-bench-sequence-expert (part 4): the
// reference's SequenceParallelTrainer and ExpertParallelTrainer (the steps of
// `dtp train --strategy sp` and `--strategy ep`) and their single-device
// peers, run for a few optimizer steps with each rank's time, memory and
// bytes collected. What the numbers mean, and the printing and JSON, are in
// bench/sequence_expert/train.cpp; the formulas they are compared with are here.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "06_sequence_expert/sequence_expert.h"
#include "drivers/06_sequence_expert/ep_strategy.h"
#include "drivers/06_sequence_expert/sp_strategy.h"
#include "dtp/launch.h"
#include "dtp/memory.h"
#include "dtp/trainer.h"
#include "sp_attention.h"

namespace dtp::bench::train {

using dtp::ch06::SequenceParallelKind;

// --- the setups ------------------------------------------------------------------------

// One configuration of part 4. The serial ones are the peers: `dense` for sp
// (the same model on one device), `moe` with moe_groups = m for ep on m
// ranks (what ep equals: README section 7).
struct Setup {
  enum Kind { dense, sp, moe, ep } kind = dense;
  int n = 1;  // ranks (sp, ep) or routing groups (moe)
  SequenceParallelKind sp_kind = SequenceParallelKind::ulysses;
  int ulysses = 1;  // the hybrid's Ulysses group

  int ranks() const { return kind == sp || kind == ep ? n : 1; }
  bool mixture() const { return kind == moe || kind == ep; }
  // "serial" (dense), "serial-moe", "sp" or "ep".
  const char* name() const {
    static const char* names[] = {"serial", "sp", "serial-moe", "ep"};
    return names[kind];
  }
  // What varies within a name: the sp kind, the routing groups of a serial MoE.
  std::string detail() const {
    if (kind == sp)
      return std::string(dtp::ch06::sequence_parallel_kind_name(sp_kind)) +
             (sp_kind == SequenceParallelKind::hybrid ? " u=" + std::to_string(ulysses) : "");
    if (kind == moe) return "groups=" + std::to_string(n);
    return "-";
  }
  // The peer's index in a list of setups: the dense serial one for sp, the
  // serial MoE with as many routing groups for ep; -1 for the peers themselves.
  int peer_in(const std::vector<Setup>& setups) const {
    for (std::size_t i = 0; i < setups.size(); ++i) {
      const Setup& s = setups[i];
      if (kind == sp && s.kind == dense) return static_cast<int>(i);
      if (kind == ep && s.kind == moe && s.n == n) return static_cast<int>(i);
    }
    return -1;
  }
};

// The model part 4 trains: a GPT with flash attention (what the sp classes
// compute, so that memory compares like with like), and its MoE variant.
struct Model {
  dtp::TrainConfig config;  // dense; experts and top_k are the MoE variant's
  int experts = 4, top_k = 2;

  dtp::TrainConfig for_setup(const Setup& s) const {
    dtp::TrainConfig c = config;
    c.model.attention = dtp::AttentionKind::flash;
    if (s.mixture()) c.model.experts = experts, c.model.top_k = top_k;
    if (s.kind == Setup::moe) c.model.moe_groups = s.n;
    return c;
  }
  dtp::ch06::SequenceParallelRunOptions sp_options(const Setup& s) const {
    dtp::ch06::SequenceParallelRunOptions o;
    o.sp = s.n, o.kind = s.sp_kind, o.ulysses = s.ulysses;
    return o;
  }
};

// Throws dtp::Error naming the flag when @p s cannot run on @p m.
inline void validate(const Model& m, const Setup& s) {
  const dtp::TrainConfig c = m.for_setup(s);
  if (s.kind == Setup::sp) dtp::ch06::validate_sequence_parallel(c, m.sp_options(s));
  if (s.kind == Setup::ep)
    dtp::ch06::validate_expert_parallel(c, dtp::ch06::ExpertParallelRunOptions{s.n});
  if (s.kind != Setup::sp && s.kind != Setup::ep) c.validate();
}

// --- one run -----------------------------------------------------------------------------

// What one rank measured over the steps after the warm-up.
struct RankNumbers {
  std::vector<double> seconds, cpu_seconds;  // per timed step: wall, and the rank's thread CPU time
  std::int64_t params_bytes = 0, grads_bytes = 0, optimizer_bytes = 0;  // live after the last step
  std::int64_t activation_peak = 0;                                     // the largest step's
  std::int64_t bytes_per_step = 0;  // payload of the last step's collectives and sends
  double last_loss = 0;             // of the last step (sp, ep: the group's mean)
};

// Runs @p s for @p warmup + @p steps optimizer steps from a fresh model;
// one RankNumbers per rank. Every rank writes its own entry: the thread
// backend's ranks share this process.
inline std::vector<RankNumbers> run(const Model& m, const Setup& s, std::int64_t warmup,
                                    std::int64_t steps) {
  std::vector<RankNumbers> ranks(static_cast<std::size_t>(s.ranks()));
  dtp::launch(dtp::World::from_env(s.ranks()), [&](dtp::Comm& comm) {
    dtp::TrainConfig config = m.for_setup(s);
    config.model.device = comm.device();
    config.steps = warmup + steps;
    RankNumbers& out = ranks[static_cast<std::size_t>(comm.rank())];
    dtp::MemoryTracker& tracker = *dtp::current_memory_tracker();
    auto run_steps = [&](auto&& step, auto&& bytes_so_far) {
      for (std::int64_t i = 0; i < warmup + steps; ++i) {
        comm.barrier();  // every rank starts the step together
        const std::int64_t bytes0 = bytes_so_far();
        const double cpu0 = sp::thread_cpu_seconds();
        const dtp::StepRecord record = step();
        const double cpu = sp::thread_cpu_seconds() - cpu0;
        if (i < warmup) continue;
        out.seconds.push_back(record.seconds);
        out.cpu_seconds.push_back(cpu);
        out.activation_peak = std::max(out.activation_peak, record.peak_activation_bytes);
        out.bytes_per_step = bytes_so_far() - bytes0;
        out.last_loss = record.loss;
      }
      out.params_bytes = tracker.live(dtp::MemoryCategory::params);
      out.grads_bytes = tracker.live(dtp::MemoryCategory::grads);
      out.optimizer_bytes = tracker.live(dtp::MemoryCategory::optimizer);
    };
    if (s.kind == Setup::sp) {
      dtp::ch06::SequenceParallelTrainer trainer(config, comm, m.sp_options(s));
      run_steps([&] { return trainer.step(); }, [&] { return trainer.bytes_moved(); });
    } else if (s.kind == Setup::ep) {
      dtp::ch06::ExpertParallelTrainer trainer(config, comm);
      run_steps([&] { return trainer.step(); }, [&] { return trainer.bytes_moved(); });
    } else {
      dtp::Trainer trainer(config);
      run_steps([&] { return trainer.step(); }, [] { return std::int64_t{0}; });
    }
  });
  return ranks;
}

// --- the formulas ----------------------------------------------------------------------------

// Parameters of the dense model and of one expert (an MLP shaped like the
// dense one: C x 4C and 4C x C weights with their biases).
inline std::int64_t expert_parameters(const dtp::GPTConfig& g) {
  const std::int64_t C = g.d_model, hidden = static_cast<std::int64_t>(g.mlp_ratio) * C;
  return 2 * C * hidden + hidden + C;
}

// The bytes a rank's collectives and sends move in one step, as the lesson
// counts them (README section 6 for attention, section 7 for the experts),
// leaving out the scalar all-reduces (the loss, the clipping norm) and the
// routing counts. @p parameters: Psi of the setup's model; @p e: bytes per element.
inline std::int64_t formula_bytes(const Model& m, const Setup& s, std::int64_t parameters) {
  const dtp::TrainConfig c = m.for_setup(s);
  const std::int64_t e = static_cast<std::int64_t>(dtp::dtype_size(c.model.dtype)),
                     L = c.model.layers, C = c.model.d_model;
  const std::int64_t n = s.n;
  if (s.kind == Setup::sp) {
    const std::int64_t S =
        c.batch * (c.seq / n) * C * e;  // one local q, k, v or out: B (T/n) H D e
    std::int64_t per_layer = 0;
    switch (s.sp_kind) {
      case SequenceParallelKind::ulysses:
        per_layer = 8 * S;  // 4 all-to-alls each way, each counted whole
        break;
      case SequenceParallelKind::ring:
      case SequenceParallelKind::zigzag:
        per_layer = 2 * (n - 1) * S + (4 * n - 2) * S;
        break;
      case SequenceParallelKind::hybrid: {
        const std::int64_t groups = n / s.ulysses;
        per_layer = 8 * S + 2 * (groups - 1) * S + (4 * groups - 2) * S;
        break;
      }
    }
    return parameters * e + L * per_layer;  // the gradients' all-reduce, then attention
  }
  if (s.kind == Setup::ep) {
    const std::int64_t replicated = parameters - L * c.model.experts * expert_parameters(c.model);
    const std::int64_t tokens = c.batch / n * c.seq;  // this rank's
    // Four exchanges per layer (dispatch and combine, forward and backward),
    // each counted by its whole buffer: every kept choice's row, k per token.
    return replicated * e + L * 4 * tokens * c.model.top_k * C * e;
  }
  return 0;
}

}  // namespace dtp::bench::train
