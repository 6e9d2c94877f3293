/// @file moe.h
/// @brief A mixture of experts in place of a block's MLP (MoeMlp), and the
/// hook through which expert parallelism runs one elsewhere (MoeCore).
#pragma once

#include <string>
#include <vector>

#include "dtp/gpt_config.h"
#include "dtp/layers.h"
#include "dtp/moe_routing.h"
#include "dtp/tensor.h"
#include "dtp/unit.h"

namespace dtp {

/// What a mixture-of-experts MLP keeps for its backward.
struct MoeSaved {
  LinearSaved router;  ///< the router's input: the LayerNorm output as [N, C]
  Tensor probs;        ///< router softmax [N, E]
  MoeRouting routing;  ///< the batch's routing, decided on the host (groups merged)
  /// balance_gradient[g * E + e]: d balance loss / d probs[n][e] for a token n of group g.
  std::vector<double> balance_gradient;
  std::vector<Tensor> rows;       ///< per expert: i32 [n_e] token rows it took (on the device)
  std::vector<Tensor> weights;    ///< per expert: [n_e] combine weights of those rows
  std::vector<Tensor> outputs;    ///< per expert: its output [n_e, C] before the weighting
  std::vector<MlpSaved> experts;  ///< per expert: the MLP's own
  double aux_loss = 0;            ///< aux_loss_coef * the routing's balance loss
};

/// Mixture of experts in place of the MLP: a router (Linear C -> E, no bias)
/// and softmax give each token a distribution over E expert MLPs; the token
/// goes to its top-k experts (capacity permitting) and the output is the sum
/// of their outputs weighted by the router probabilities. The routing rules
/// and the load-balancing loss are in dtp/moe_routing.h. Each expert runs on
/// exactly the rows routed to it: gathered with ops::embedding_forward
/// (the token rows are the "ids"), scaled with ops::scale_rows, added back
/// with ops::embedding_backward.
class MoeMlp {
 public:
  MoeMlp() = default;
  /// Sized by config.d_model, mlp_ratio, experts, top_k, capacity_factor, aux_loss_coef.
  explicit MoeMlp(const GPTConfig& config);
  /// Appends "<prefix>.router.weight" and "<prefix>.expert.<e>.{fc,proj}.{weight,bias}"
  /// (the experts it does not hold with ParamSpec::held false).
  void declare(std::vector<ParamSpec>& layout, const std::string& prefix) const;
  /// Points the router and the experts at the unit's views.
  void bind(const Unit& unit, const std::string& prefix);
  /// y [..., C] (activations) for x [..., C]; fills saved, including the
  /// auxiliary loss of this batch (saved.aux_loss).
  Tensor forward(const Tensor& x, MoeSaved& saved) const;
  /// dx for dy, for the total loss "loss_scale * (main loss + aux loss)":
  /// the combine weights pass dy's gradient to the router, and the
  /// load-balancing term adds loss_scale * coef * E f_e / N to every
  /// d probs[n][e]. Weight gradients accumulate or (with @p defer) queue;
  /// releases saved.
  Tensor backward(const Tensor& dy, MoeSaved& saved, double loss_scale = 1.0,
                  PendingWeightGrads* defer = nullptr) const;

  Linear router;               ///< C -> E, no bias
  double router_std = 0.02;    ///< init std of the router (config.init_std)
  std::vector<Mlp> experts;    ///< E MLPs shaped like the dense one
  int top_k = 1;               ///< choices per token
  double capacity_factor = 1;  ///< see moe_capacity()
  double aux_loss_coef = 0;    ///< weight of the load-balancing loss
  int groups = 1;              ///< routing groups (GPTConfig::moe_groups)
  int first_held = 0;          ///< the first expert this layer holds (GPTConfig::expert_shard)
  int held = 0;                ///< how many it holds, from first_held; the others' Mlp are unbound
  /// Whether this layer holds expert @p e's weights.
  bool holds(int e) const { return e >= first_held && e < first_held + held; }

 private:
  void require_every_expert(const char* pass) const;
};

/// A mixture-of-experts layer computed elsewhere: expert parallelism
/// installs one in a Block to run the experts on the ranks that hold them.
/// It uses the block's MoeMlp weights and keeps what its backward needs
/// between the two calls, so every block needs its own.
class MoeCore {
 public:
  virtual ~MoeCore() = default;
  /// y [N, C] for this rank's tokens x [N, C].
  virtual Tensor forward(const Tensor& x) = 0;
  /// dx [N, C] for dy [N, C], for the loss "loss_scale * (main loss + aux_loss())";
  /// accumulates the weight gradients of the experts it runs and the router.
  virtual Tensor backward(const Tensor& dy, double loss_scale) = 0;
  /// aux_loss_coef times the last forward's load-balancing loss.
  virtual double aux_loss() const = 0;
};

}  // namespace dtp
