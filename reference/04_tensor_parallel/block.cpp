// Puzzle 4.7: the tensor-parallel block, with or without sequence
// parallelism. The code is the serial block's; what changes under sequence
// parallelism is what the tensors hold (this rank's tokens) and that the
// replicated parameters' gradients are partial sums to be added up.
#include "04_tensor_parallel/tensor_parallel.h"
#include "dtp/trace.h"

namespace dtp::ch04 {

Tensor TensorParallelBlock::forward(const Tensor& x, TensorParallelBlockSaved& saved,
                                    std::int64_t sequences) const {
  require_params("forward");
  Tensor mid;
  {
    trace::Scope span(name() + " attention forward", "compute");
    Tensor h = ln1.forward(x, saved.ln1);
    mid = attn.forward(h, saved.attn, sequences);
    ops::axpy(mid, 1.0, x);
  }
  trace::Scope span(name() + " mlp forward", "compute");
  Tensor h = ln2.forward(mid, saved.ln2);
  Tensor out = mlp.forward(h, saved.mlp);
  ops::axpy(out, 1.0, mid);
  return out;
}

Tensor TensorParallelBlock::backward(const Tensor& dy, TensorParallelBlockSaved& saved) const {
  require_params("backward");
  Tensor d_mid;
  {
    trace::Scope span(name() + " mlp backward", "compute");
    Tensor dh = mlp.backward(dy, saved.mlp);
    d_mid = ln2.backward(dh, saved.ln2);
    ops::axpy(d_mid, 1.0, dy);
  }
  trace::Scope span(name() + " attention backward", "compute");
  Tensor dh = attn.backward(d_mid, saved.attn);
  Tensor dx = ln1.backward(dh, saved.ln1);
  ops::axpy(dx, 1.0, d_mid);
  return dx;
}

void TensorParallelBlock::reduce_replicated_gradients() const {
  if (!sequence_parallel) return;
  for (Tensor gradient : replicated_gradients()) tp_->all_reduce(gradient);
}

}  // namespace dtp::ch04
