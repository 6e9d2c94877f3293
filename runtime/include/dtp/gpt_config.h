/// @file gpt_config.h
/// @brief The shape of a GPT (GPTConfig) and how attention is computed.
#pragma once

#include <cstdint>
#include <string>

#include "dtp/device.h"
#include "dtp/dtype.h"

namespace dtp {

/// How attention is computed: the naive form keeps the B*H*T*T probabilities
/// for the backward; the flash form keeps only two numbers per query row.
enum class AttentionKind { naive, flash };
/// "naive" or "flash".
const char* attention_kind_name(AttentionKind kind);
/// Parses "naive" or "flash"; throws dtp::Error naming both otherwise.
AttentionKind parse_attention_kind(const std::string& name);

/// The shape of a GPT and how it is initialized.
struct GPTConfig {
  int vocab_size = 64;          ///< number of token ids
  int context = 64;             ///< longest sequence (number of learned positions)
  int d_model = 64;             ///< width C of the residual stream
  int heads = 4;                ///< attention heads; d_model must divide by it
  int layers = 2;               ///< transformer blocks
  std::uint64_t seed = 1234;    ///< initialization seed: same seed, same weights
  int mlp_ratio = 4;            ///< MLP hidden width = mlp_ratio * d_model
  double init_std = 0.02;       ///< std of weight init (residual projections: / sqrt(2 layers))
  double layernorm_eps = 1e-5;  ///< LayerNorm epsilon
  AttentionKind attention = AttentionKind::naive;  ///< attention kernel
  /// Mixture of experts: 0 (the default) gives every block one dense MLP;
  /// E > 0 replaces it by a router and E expert MLPs of the same width
  /// (MoeMlp; the routing rules are in dtp/moe_routing.h).
  int experts = 0;
  int top_k = 1;                  ///< experts per token, 1 to experts (with experts > 0)
  double capacity_factor = 1.25;  ///< expert capacity = ceil(factor * tokens * top_k / experts)
  double aux_loss_coef = 0.01;    ///< weight of each block's load-balancing loss in the total loss
  /// The N tokens of a batch are routed in this many equal consecutive
  /// groups, each with its own capacity and balance loss (the loss is their
  /// mean), as GShard does: expert parallelism on G ranks, where each rank
  /// routes its own tokens, equals one device with moe_groups = G.
  int moe_groups = 1;
  /// Expert parallelism over expert_shards ranks: this model holds only
  /// experts [expert_shard E / expert_shards, (expert_shard + 1) E /
  /// expert_shards) of each block, with memory for their weights and
  /// gradients. The others' parameters are drawn at init and dropped, so
  /// the held experts start as in the whole model. A layer that does not
  /// hold every expert runs only through a MoeCore. 1 (the default): all.
  int expert_shards = 1;
  int expert_shard = 0;  ///< which share of the experts, 0 to expert_shards - 1
  /// Parameters, gradients and activations. bf16 and f16 compute in f32 and
  /// round every stored value (chapter 07 keeps f32 master weights beside them).
  DType dtype = DType::f32;
  Device device = Device::cpu();  ///< where parameters and activations live

  /// Throws dtp::Error naming the first bad field.
  void validate() const;
  /// d_model / heads.
  int head_dim() const { return d_model / heads; }
  /// Parameters in the whole model.
  std::int64_t parameter_count() const;
  /// "vocab 64, context 64, d_model 64, heads 4, layers 2, f32 on cpu, naive attention".
  std::string describe() const;
};

}  // namespace dtp
