// Puzzle 8.1: the low-rank term of a LoRA Linear.
//
// y += s (x A^T) B^T is computed as two thin products, never as the full
// [out, in] matrix s B A: with rank r the forward costs 2 rows r (in + out)
// flops against 2 rows in out for W, which is what makes adapters cheap.
// The backward follows by the chain rule through h = x A^T:
//   dh = s dy B,  dx += dh A,  dA += dh^T x,  dB += s dy^T h.
#include "08_lora/lora.h"

namespace dtp::ch08 {

namespace {
std::int64_t rows_of(const Tensor& x) { return x.numel() / x.size(x.ndim() - 1); }

void check_shapes(const char* what, const Tensor& a, const Tensor& b) {
  DTP_CHECK(a.ndim() == 2 && b.ndim() == 2 && b.size(1) == a.size(0), what,
            ": A must be [r, in] and B [out, r], got A ", a.describe(), " and B ", b.describe());
}
}  // namespace

Tensor lora_forward(const Tensor& x, const Tensor& a, const Tensor& b, double scale, Tensor& y) {
  check_shapes("lora_forward", a, b);
  Tensor h =
      Tensor::empty({rows_of(x), a.size(0)}, x.dtype(), x.device(), MemoryCategory::activations);
  ops::matmul(x, a, h, false, true);
  ops::matmul(h, b, y, false, true, scale, 1.0);
  return h;
}

void lora_backward_input(const Tensor& dy, const Tensor& a, const Tensor& b, double scale,
                         Tensor& dx) {
  check_shapes("lora_backward_input", a, b);
  Tensor dh =
      Tensor::empty({rows_of(dy), a.size(0)}, dy.dtype(), dy.device(), MemoryCategory::other);
  ops::matmul(dy, b, dh, false, false, scale, 0.0);
  ops::matmul(dh, a, dx, false, false, 1.0, 1.0);
}

void lora_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& h, const Tensor& b,
                          double scale, Tensor& grad_a, Tensor& grad_b) {
  Tensor dh =
      Tensor::empty({rows_of(dy), b.size(1)}, dy.dtype(), dy.device(), MemoryCategory::other);
  ops::matmul(dy, b, dh, false, false, scale, 0.0);
  ops::matmul(dh, x, grad_a, true, false, 1.0, 1.0);
  ops::matmul(dy, h, grad_b, true, false, scale, 1.0);
}

}  // namespace dtp::ch08
