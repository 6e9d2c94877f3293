// GPTConfig: validation, parameter count and a one-line description.
#include <sstream>

#include "dtp/error.h"
#include "dtp/nn.h"

namespace dtp {

const char* attention_kind_name(AttentionKind kind) {
  return kind == AttentionKind::flash ? "flash" : "naive";
}

AttentionKind parse_attention_kind(const std::string& name) {
  if (name == "naive") return AttentionKind::naive;
  if (name == "flash") return AttentionKind::flash;
  DTP_CHECK(false, "unknown attention kind '", name, "'; accepted: naive, flash");
  return AttentionKind::naive;
}

void GPTConfig::validate() const {
  DTP_CHECK(vocab_size >= 1, "GPTConfig: vocab_size must be at least 1, got ", vocab_size);
  DTP_CHECK(context >= 1, "GPTConfig: context must be at least 1, got ", context);
  DTP_CHECK(d_model >= 1, "GPTConfig: d_model must be at least 1, got ", d_model);
  DTP_CHECK(heads >= 1, "GPTConfig: heads must be at least 1, got ", heads);
  DTP_CHECK(d_model % heads == 0, "GPTConfig: d_model (", d_model, ") must divide by heads (",
            heads, ")");
  DTP_CHECK(layers >= 0, "GPTConfig: layers must be >= 0, got ", layers);
  DTP_CHECK(mlp_ratio >= 1, "GPTConfig: mlp_ratio must be at least 1, got ", mlp_ratio);
  DTP_CHECK(init_std > 0, "GPTConfig: init_std must be positive, got ", init_std);
  DTP_CHECK(layernorm_eps > 0, "GPTConfig: layernorm_eps must be positive, got ", layernorm_eps);
  DTP_CHECK(experts >= 0, "GPTConfig: experts must be >= 0 (0: a dense MLP), got ", experts);
  if (experts > 0) {
    DTP_CHECK(top_k >= 1 && top_k <= experts, "GPTConfig: top_k must be in [1, experts = ", experts,
              "], got ", top_k);
    DTP_CHECK(capacity_factor > 0, "GPTConfig: capacity_factor must be positive, got ",
              capacity_factor);
    DTP_CHECK(aux_loss_coef >= 0, "GPTConfig: aux_loss_coef must be >= 0, got ", aux_loss_coef);
    DTP_CHECK(moe_groups >= 1, "GPTConfig: moe_groups must be at least 1, got ", moe_groups);
    DTP_CHECK(expert_shards >= 1 && experts % expert_shards == 0, "GPTConfig: expert_shards (",
              expert_shards, ") must be at least 1 and divide experts (", experts, ")");
    DTP_CHECK(expert_shard >= 0 && expert_shard < expert_shards,
              "GPTConfig: expert_shard must be in [0, ", expert_shards, "), got ", expert_shard);
  } else {
    DTP_CHECK(expert_shards == 1 && expert_shard == 0, "GPTConfig: expert_shards ", expert_shards,
              " needs experts (a mixture of experts to shard), got experts = 0");
  }
  DTP_CHECK(is_floating(dtype), "GPTConfig: dtype must be f64, f32, bf16 or f16, got ",
            dtype_name(dtype),
            " (a bf16 or f16 model is the working copy of mixed-precision training: chapter 07)");
}

std::int64_t GPTConfig::parameter_count() const {
  const std::int64_t V = vocab_size, P = context, C = d_model, H = std::int64_t{mlp_ratio} * C;
  const std::int64_t embedding = V * C + P * C;
  const std::int64_t mlp = (C * H + H)                                            // fc
                           + (H * C + C);                                         // proj
  const std::int64_t mlp_half = experts > 0 ? C * experts + experts * mlp : mlp;  // router + E MLPs
  const std::int64_t block = 2 * 2 * C                                            // two LayerNorms
                             + 4 * (C * C + C)                                    // q, k, v, proj
                             + mlp_half;
  const std::int64_t head = 2 * C + V * C;
  return embedding + layers * block + head;
}

std::string GPTConfig::describe() const {
  std::ostringstream out;
  out << "vocab " << vocab_size << ", context " << context << ", d_model " << d_model << ", heads "
      << heads << ", layers " << layers << ", " << dtype_name(dtype) << " on " << device.str()
      << ", " << attention_kind_name(attention) << " attention";
  if (experts > 0)
    out << ", " << experts << " experts top-" << top_k << " capacity factor " << capacity_factor
        << (moe_groups > 1 ? " routed in " + std::to_string(moe_groups) + " groups"
                           : std::string());
  return out.str();
}

}  // namespace dtp
