// Internal: how the CPU nn ops run on bf16 and f16 tensors.
//
// The contract is that of tensor-core kernels (cuBLAS with f32 accumulation,
// PyTorch's on a GPU, DTP's CUDA kernels): read the 16-bit inputs as f32,
// compute in f32, and round each output to its 16-bit type with
// round-to-nearest-even once, when it is stored. On the CPU that is done
// literally: an op called with 16-bit tensors runs its f32 kernel on exact
// f32 copies of them, and rounds the outputs back at the end: every value an
// op writes is rounded, nothing in between. Naive attention and the
// attention merge do the same on a GPU (the copies are made on the tensors'
// device): their CUDA kernels are f32 kernels; the other CUDA kernels, flash
// attention's included, read and write 16-bit elements themselves.
//
//   if (detail::is_half(x.dtype())) {
//     detail::Widened f32("gelu_forward", x.dtype());
//     gelu_forward(f32.in("x", x), f32.out("y", y));
//     return f32.store();
//   }
//
// Outputs are copied in too, so ops that accumulate (dweight +=) or work in
// place (y aliasing x) behave as they do in f32.
#pragma once

#include <deque>
#include <utility>
#include <vector>

#include "dtp/dtype.h"
#include "dtp/error.h"
#include "dtp/tensor.h"

namespace dtp::detail {

/// bf16 or f16: the types the CPU ops widen to f32.
inline bool is_half(DType dtype) { return dtype == DType::bf16 || dtype == DType::f16; }

/// f32 working copies of one op's 16-bit tensors (MemoryCategory::other).
class Widened {
 public:
  /// For op @p op whose floating tensors are all @p dtype (bf16 or f16).
  Widened(const char* op, DType dtype) : op_(op), dtype_(dtype) {}

  /// An exact f32 copy of input @p t, on its device; @p t itself when it is
  /// undefined or i32 (token ids, targets). Any other dtype is an error
  /// naming @p name.
  const Tensor& in(const char* name, const Tensor& t) { return widen(name, t); }

  /// As in(), and store() rounds the copy back into @p t.
  Tensor& out(const char* name, Tensor& t) {
    Tensor& copy = widen(name, t);
    if (&copy != &t) outputs_.emplace_back(&t, &copy);
    return copy;
  }

  /// Rounds every output copy into its 16-bit tensor (nearest even).
  void store();

 private:
  Tensor& widen(const char* name, const Tensor& t);

  const char* op_;
  DType dtype_;
  std::deque<Tensor> copies_;  // a deque: references to its elements stay valid
  std::vector<std::pair<Tensor*, Tensor*>> outputs_;
};

}  // namespace dtp::detail
