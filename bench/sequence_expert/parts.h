// The four parts of dtp-bench-sequence-expert, one file each (attention.cpp,
// tiers.cpp, moe.cpp, train.cpp, named as --only names them): what each
// part measures with, and how main.cpp runs it. Each run prints its table
// and appends one JSON object per measurement to @p json (nothing when null).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "bench_common.h"
#include "moe_capacity.h"
#include "sp_attention.h"
#include "sp_ep_training.h"

namespace dtp::bench::sequence_expert {

constexpr double kMiB = 1024.0 * 1024.0;
inline double mib(double bytes) { return bytes / kMiB; }

// --- part 1, "sp_attention": time and memory of sequence-parallel attention ---

struct AttentionOptions {
  std::vector<std::int64_t> seqs = {256, 512, 1024, 2048};
  std::vector<int> degrees = {1, 2, 4, 8};
  std::vector<sp::Method> methods = {sp::Method::flash, sp::Method::ulysses, sp::Method::ring,
                                     sp::Method::zigzag, sp::Method::hybrid};
  sp::Dims dims;
  int warmup = 1, repeats = 3;
};

int run_attention_part(const AttentionOptions& o, const RunContext& ctx, FILE* json);

// --- part 2, "sp_comm_tiers": what Ulysses and the ring send, on the clock of two tiers ---

struct TierOptions {
  sp::Dims dims{1, 16, 32, 8192, dtp::DType::f32};
  std::vector<int> degrees = {2, 4, 8};
  std::vector<sp::Tier> tiers = {nvlink_tier(), infiniband_tier()};
};

int run_tier_part(const TierOptions& o, const RunContext& ctx, FILE* json);

// --- part 3, "moe_capacity": the tokens a mixture of experts drops ---

using MoeOptions = moe::Options;

int run_moe_part(const MoeOptions& o, const RunContext& ctx, FILE* json);

// --- part 4, "sp_ep_train_step": whole training steps of sp and ep against one device ---

struct TrainOptions {
  train::Model model = default_train_model();
  std::vector<int> degrees = {2, 4};
  std::int64_t warmup = 1, steps = 4, repeats = 6;

  static train::Model default_train_model() {
    train::Model m;
    m.config.model.layers = 2;
    m.config.model.d_model = 128;
    m.config.model.heads = 8;
    m.config.seq = 256;
    m.config.batch = 4;
    return m;
  }
};

/// Every setup part 4 runs, each peer before the setups compared with it;
/// throws dtp::Error naming the flag when the model cannot run one of them.
std::vector<train::Setup> train_setups(const TrainOptions& o);

int run_train_part(const TrainOptions& o, const RunContext& ctx, FILE* json);

}  // namespace dtp::bench::sequence_expert
