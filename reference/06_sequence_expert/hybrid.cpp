// Reference for puzzle 6.5: Ulysses inside each group, ring attention across
// the groups on the group's whole positions for this rank's heads.
#include "06_sequence_expert/sequence_expert.h"

namespace dtp::ch06 {

Tensor HybridAttention::forward(const Tensor& q, const Tensor& k, const Tensor& v) {
  Tensor out = ring_.forward(sequence_to_heads(inner_, q), sequence_to_heads(inner_, k),
                             sequence_to_heads(inner_, v));
  return heads_to_sequence(inner_, out);
}

void HybridAttention::backward(const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv) {
  Tensor dq_heads, dk_heads, dv_heads;
  ring_.backward(sequence_to_heads(inner_, dout), dq_heads, dk_heads, dv_heads);
  dq = heads_to_sequence(inner_, dq_heads);
  dk = heads_to_sequence(inner_, dk_heads);
  dv = heads_to_sequence(inner_, dv_heads);
}

}  // namespace dtp::ch06
