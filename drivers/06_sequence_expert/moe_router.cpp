// The router's two ends for the mixture-of-experts puzzles: probabilities
// from the tokens, and the tokens' gradient from d probs. What happens in
// between (routing, dispatch, combine, and where d probs comes from) is the
// puzzles'.
#include "06_sequence_expert/sequence_expert.h"

namespace dtp::ch06 {

Tensor router_probabilities(const MoeMlp& weights, const Tensor& x, LinearSaved& saved) {
  const std::int64_t C = weights.router.in_features;
  DTP_CHECK(x.defined() && x.ndim() == 2 && x.size(1) == C,
            "router_probabilities: tokens must be [N, ", C, "], got ",
            x.defined() ? x.describe() : std::string("an undefined tensor"));
  Tensor logits = weights.router.forward(x, saved);
  Tensor probs = Tensor::empty(logits.shape(), x.dtype(), x.device(), MemoryCategory::activations);
  ops::softmax_forward(logits, probs);
  return probs;
}

Tensor router_backward(const MoeMlp& weights, const Tensor& probs,
                       const std::vector<double>& d_probs, LinearSaved& saved) {
  DTP_CHECK(probs.defined() && static_cast<std::int64_t>(d_probs.size()) == probs.numel(),
            "router_backward: d_probs must have one value per probability (",
            probs.defined() ? probs.numel() : 0, " = N x E), got ", d_probs.size());
  Tensor d_probs_tensor =
      Tensor::from_values(d_probs, probs.dtype(), probs.device()).view(probs.shape());
  Tensor d_logits =
      Tensor::empty(probs.shape(), probs.dtype(), probs.device(), MemoryCategory::other);
  ops::softmax_backward(probs, d_probs_tensor, d_logits);
  return weights.router.backward(d_logits, saved);
}

}  // namespace dtp::ch06
