// Full recomputation: the block keeps its input; its backward runs the
// forward again first.
#include "09_activation_checkpointing/checkpointing.h"

namespace dtp::ch09 {

Tensor FullRecomputation::forward(const Block& block, const Tensor& x, BlockSaved& saved) const {
  Tensor out = block.run_forward(x, saved);
  const double aux_loss = saved.moe.aux_loss;  // a result the model adds to its loss, not a tensor
  saved.clear();
  saved.moe.aux_loss = aux_loss;
  saved.checkpoint = x;
  return out;
}

Tensor FullRecomputation::backward(const Block& block, const Tensor& dy, BlockSaved& saved,
                                   WeightGrads mode, double loss_scale) const {
  DTP_CHECK(saved.checkpoint.defined(), block.name(),
            " backward: no checkpoint (forward not run, or its backward already ran)");
  const Tensor x = saved.checkpoint;
  saved.checkpoint = Tensor();
  {
    RecomputeScope recompute;
    block.run_forward(x, saved);  // the output is dropped: the next block has the first one
  }
  return block.run_backward(dy, saved, mode, loss_scale);
}

}  // namespace dtp::ch09
