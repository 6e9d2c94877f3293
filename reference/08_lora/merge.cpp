// Puzzle 8.2: folding an adapter into its weight and out again. One matmul
// with beta = 1 adds (or subtracts) s B A straight into W.
#include "08_lora/lora.h"

namespace dtp::ch08 {

void merge(Tensor& weight, const Tensor& a, const Tensor& b, double scale) {
  ops::matmul(b, a, weight, false, false, scale, 1.0);
}

void unmerge(Tensor& weight, const Tensor& a, const Tensor& b, double scale) {
  ops::matmul(b, a, weight, false, false, -scale, 1.0);
}

}  // namespace dtp::ch08
