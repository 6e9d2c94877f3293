// Puzzle 4.8: the whole model on a 2-D mesh. TP groups are consecutive ranks
// (they talk at every layer: keep them on the fast links), DP groups the
// ranks with the same TP rank (they talk once a step).
#include "04_tensor_parallel/tensor_parallel.h"

namespace dtp::ch04 {

Mesh make_mesh(Comm& world, int tp) {
  DTP_CHECK(tp >= 1 && world.size() % tp == 0, "make_mesh: a world of ", world.size(),
            " ranks does not split into tensor-parallel groups of ", tp, " (", world.size(), " % ",
            tp, " != 0)");
  const int w = world.rank();
  Comm tp_group = world.split(w / tp, w % tp);
  Comm dp_group = world.split(w % tp, w / tp);
  return Mesh{std::move(tp_group), std::move(dp_group)};
}

double TensorParallelGPT::forward(const Tensor& tokens, const Tensor& targets) {
  DTP_CHECK(tokens.defined() && tokens.ndim() == 2,
            "TensorParallelGPT forward: tokens must be i32 [B, T], got ", tokens.describe());
  sequences_ = tokens.size(0);
  Tensor x = embedding->layer.forward(tokens, embedding_saved_);
  for (std::size_t i = 0; i < blocks.size(); ++i)
    x = blocks[i]->forward(x, block_saved_[i], sequences_);
  Tensor h = head->ln.forward(x, head_saved_.ln);
  x = Tensor();
  Tensor logits = head->lm.forward(h, head_saved_.lm);
  const double loss = head->loss.forward(logits, targets, head_saved_.loss);
  has_saved_ = true;
  return loss;
}

void TensorParallelGPT::backward(double loss_scale) {
  DTP_CHECK(has_saved_, "TensorParallelGPT backward: no saved activations (call forward first)");
  Tensor dlogits = head->loss.backward(head_saved_.loss, loss_scale);
  Tensor dh = head->lm.backward(dlogits, head_saved_.lm);
  dlogits = Tensor();
  Tensor dx = head->ln.backward(dh, head_saved_.ln);
  for (std::size_t i = blocks.size(); i-- > 0;) dx = blocks[i]->backward(dx, block_saved_[i]);
  embedding->layer.backward(dx, embedding_saved_);
  has_saved_ = false;
}

void TensorParallelGPT::finish_backward(Comm& dp) {
  if (sequence_parallel_) {
    for (auto& block : blocks) block->reduce_replicated_gradients();
    for (Tensor gradient : {head->ln.weight_grad, head->ln.bias_grad}) tp_->all_reduce(gradient);
  }
  if (dp.size() == 1) return;
  for (Unit* unit : units()) dp.all_reduce(unit->grads(), ReduceOp::avg);
}

}  // namespace dtp::ch04
