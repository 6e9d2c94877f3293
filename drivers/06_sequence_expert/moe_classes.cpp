// The constructors of the chapter's mixture-of-experts classes: borrowing
// the weights, and the check that the experts split evenly over the ranks.
#include "06_sequence_expert/sequence_expert.h"

namespace dtp::ch06 {

MoeLayer::MoeLayer(const MoeMlp& weights) : w_(weights) {
  DTP_CHECK(!weights.experts.empty(),
            "MoeLayer: the MoeMlp has no experts (GPTConfig::experts is 0)");
}

ExpertParallelMoe::ExpertParallelMoe(Comm& ep, const MoeMlp& weights) : ep_(ep), w_(weights) {
  const int E = static_cast<int>(weights.experts.size()), m = ep.size();
  DTP_CHECK(E >= 1, "expert parallelism: the MoeMlp has no experts (GPTConfig::experts is 0)");
  DTP_CHECK(E % m == 0, "expert parallelism: E = ", E, " experts do not split over m = ", m,
            " ranks (each rank holds E / m whole experts; pick m dividing ", E, ")");
  local_ = E / m;
  first_ = ep.rank() * local_;
}

}  // namespace dtp::ch06
