// The constructors of the chapter's attention classes: the argument checks a
// student should not have to write, and the hybrid's two communicators.
#include "06_sequence_expert/sequence_expert.h"

namespace dtp::ch06 {

namespace {
// The group communicator of the hybrid, after checking its sizes.
Comm hybrid_inner(Comm& sp, int ulysses_size, int heads) {
  const int n = sp.size();
  DTP_CHECK(ulysses_size >= 1 && n % ulysses_size == 0,
            "hybrid attention: the Ulysses group size u = ", ulysses_size,
            " must divide the n = ", n, " ranks (n / u groups form the ring)");
  DTP_CHECK(heads >= 1 && heads % ulysses_size == 0, "hybrid attention: H = ", heads,
            " heads do not split over a Ulysses group of u = ", ulysses_size, " ranks");
  return sp.split(sp.rank() / ulysses_size, sp.rank());
}
}  // namespace

UlyssesAttention::UlyssesAttention(Comm& sp, int heads) : sp_(sp), heads_(heads) {
  DTP_CHECK(heads >= 1 && heads % sp.size() == 0, "Ulysses attention: H = ", heads,
            " heads do not split over n = ", sp.size(),
            " ranks (each rank takes H / n whole heads; pick n dividing ", heads,
            ", or use ring attention, which has no such limit)");
}

RingAttention::RingAttention(Comm& sp, SequenceLayout layout) : sp_(sp), layout_(layout) {}

HybridAttention::HybridAttention(Comm& sp, int ulysses_size, int heads)
    : inner_(hybrid_inner(sp, ulysses_size, heads)),
      outer_(sp.split(sp.rank() % ulysses_size, sp.rank())),
      ring_(outer_, SequenceLayout::contiguous) {}

}  // namespace dtp::ch06
