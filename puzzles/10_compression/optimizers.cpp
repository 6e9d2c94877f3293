// Chapter 10 — communication compression: 1-bit Adam (10.3) and PowerSGD (10.4).
//
// Replace each `throw dtp::NotSolved(...)` with your code, then run
//     ./dtp grade 10
// to see which puzzles pass. The contract is in
// chapters/10_compression/compression.h; the lesson (what each compressor
// sends, and why error feedback makes it converge) is in
// chapters/10_compression/README.md.
//
// The model lives on comm.device() (a GPU under nccl). 1-bit Adam's formulas
// run on to_vector() copies; PowerSGD computes on the host (Q and E live
// there) and sends only P and Q, copied to comm.device().
//
// Tools you may use:
//   model.units()                          embedding, block.0, ..., head (forward order)
//   unit->params(), unit->grads()          the unit's flat buffers
//   unit->parameters()                     ParamView: name, shape, value, grad ([out, in] views)
//   unit->parameter(name)                  one of them by name
//   comm.all_reduce(t, ReduceOp::avg)      every rank's t becomes the mean
//   SignAllReduce(comm, numel, dtype)      puzzle 10.2: .all_reduce(x) averages x (on
//                                          comm.device()) in 1 bit
//   comm.device()                          where this rank's model and collectives live
//   t.to(Device::cpu()), t.to(comm.device())
//                                          a copy on the host or on the rank's device
//   t.to_vector()                          the elements as doubles
//   Tensor::from_values(values, dtype), dst.copy_from(src)
//                                          doubles back into a tensor (rounded to dtype);
//                                          copy_from copies across devices too
//   Tensor::zeros(shape, dtype, device, MemoryCategory::optimizer), Tensor::empty(...)
//   ops::matmul(a, b, out, transpose_a, transpose_b)
//                                          out = op(a) op(b)
//   ops::add(a, b, out), ops::axpy(y, alpha, x)
//                                          out = a + b; y += alpha x
//   Rng rng(seed); ops::fill_normal(t, 0, 1, rng)
//                                          N(0, 1) values, drawn in index order
// The `(void)x;` lines only silence unused-parameter warnings: delete them.
#include "10_compression/compression.h"

namespace dtp::ch10 {

OneBitAdam::OneBitAdam(Comm& comm, GPT& model, const OneBitAdamConfig& config)
    : comm_(comm), model_(model), config_(config) {
  // About 8 lines: per unit, a zeroed m and v like its params, and a
  // SignAllReduce of its numel and dtype (compressors_.emplace_back(...)).
  throw dtp::NotSolved("10.3 one_bit_adam");
}

void OneBitAdam::step() {
  // About 25 lines. Per unit: during warm-up (!compressing()) all-reduce
  // the gradient (avg); m from the gradient; during warm-up v too, after it
  // the momentum through the unit's SignAllReduce; then the parameters.
  // Each formula per element in double, exactly as the contract writes it.
  // Count the step.
  throw dtp::NotSolved("10.3 one_bit_adam");
}

PowerSgd::PowerSgd(Comm& comm, GPT& model, int low_rank, std::uint64_t seed)
    : comm_(comm), model_(model), low_rank_(low_rank) {
  // About 20 lines: check the rank; one Rng(seed); for every 2-D parameter
  // of every unit (in order) a Matrix with Q [in, r] drawn from it and a
  // zeroed error [out, in].
  (void)seed;
  throw dtp::NotSolved("10.4 power_sgd");
}

void PowerSgd::all_reduce_gradients() {
  // About 40 lines, Gram-Schmidt included. Per matrix: M = G + E; P = M Q;
  // all-reduce P; orthonormalize P's columns; Q = M^T P; all-reduce Q;
  // G = P Q^T; E = M - G. Then every parameter that is not 2-D: all-reduce
  // its gradient whole.
  throw dtp::NotSolved("10.4 power_sgd");
}

}  // namespace dtp::ch10
