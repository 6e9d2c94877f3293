// Selective recomputation: the block keeps all but the attention
// probabilities, and its backward makes them again from q and k.
#include "09_activation_checkpointing/checkpointing.h"

namespace dtp::ch09 {

Tensor SelectiveRecomputation::forward(const Block& block, const Tensor& x,
                                       BlockSaved& saved) const {
  DTP_CHECK(block.attn.kind == AttentionKind::naive, block.name(),
            ": selective recomputation drops naive attention's probabilities; flash attention "
            "keeps none (its backward already makes them again), so there is nothing to drop");
  DTP_CHECK(block.attn.core == nullptr, block.name(),
            ": selective recomputation drops the probabilities the block's own attention keeps; "
            "an attention core (sequence parallelism) keeps its own");
  Tensor out = block.run_forward(x, saved);
  saved.attn.probs = Tensor();
  return out;
}

Tensor SelectiveRecomputation::backward(const Block& block, const Tensor& dy, BlockSaved& saved,
                                        WeightGrads mode, double loss_scale) const {
  AttentionSaved& attn = saved.attn;
  DTP_CHECK(attn.q.defined() && !attn.probs.defined(), block.name(),
            " backward: expected the saved q, k, v without probabilities (forward not run, or "
            "its backward already ran)");
  {
    RecomputeScope recompute;
    const std::int64_t B = attn.q.size(0), T = attn.q.size(1), H = block.attn.heads;
    const Shape heads{B, T, H, attn.q.size(2) / H};
    attn.probs =
        Tensor::empty({B, H, T, T}, attn.q.dtype(), attn.q.device(), MemoryCategory::activations);
    Tensor scratch =
        Tensor::empty(heads, attn.q.dtype(), attn.q.device(), MemoryCategory::activations);
    ops::attention_forward(attn.q.view(heads), attn.k.view(heads), attn.v.view(heads), scratch,
                           attn.probs);
  }
  return block.run_backward(dy, saved, mode, loss_scale);
}

}  // namespace dtp::ch09
