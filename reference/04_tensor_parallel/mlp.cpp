// Puzzle 4.3: the MLP. fc is column-parallel, proj row-parallel, and the GELU
// between them acts on this rank's hidden units alone: the only
// communication is proj's reduction forward and fc's backward.
#include "04_tensor_parallel/tensor_parallel.h"

namespace dtp::ch04 {

Tensor TensorParallelMlp::forward(const Tensor& x, TensorParallelMlpSaved& saved) const {
  Tensor hidden = fc.forward(x, saved.fc);
  Tensor activated = gelu.forward(hidden, saved.gelu);
  return proj.forward(activated, saved.proj);
}

Tensor TensorParallelMlp::backward(const Tensor& dy, TensorParallelMlpSaved& saved) const {
  Tensor d_activated = proj.backward(dy, saved.proj);
  Tensor d_hidden = gelu.backward(d_activated, saved.gelu);
  return fc.backward(d_hidden, saved.fc);
}

}  // namespace dtp::ch04
