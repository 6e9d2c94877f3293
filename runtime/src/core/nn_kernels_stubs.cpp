// Without CUDA, every nn kernel request fails with one clear sentence (the
// CPU ops only call these for CUDA tensors, which such a build cannot make).
#ifndef DTP_HAVE_CUDA
#include <string>
#include "cuda/nn_kernels.h"

#include "dtp/error.h"

namespace dtp::cuda {

namespace {
[[noreturn]] void no_cuda(const char* op) {
  throw Error(
      std::string(op) +
      ": this build of DTP has no CUDA (nvcc was not found at configure time); use a cpu device");
}
}  // namespace

void fill_normal(Tensor&, double, double, Rng&) { no_cuda("fill_normal"); }
void add(const Tensor&, const Tensor&, Tensor&) { no_cuda("add"); }
void permute(const Tensor&, const std::array<int, 4>&, Tensor&) { no_cuda("permute"); }
void axpy(Tensor&, double, const Tensor&) { no_cuda("axpy"); }
void scale_rows(Tensor&, const Tensor&) { no_cuda("scale_rows"); }
void row_dot(const Tensor&, const Tensor&, Tensor&) { no_cuda("row_dot"); }
double sum_squares(const Tensor&) { no_cuda("sum_squares"); }
bool all_finite(const Tensor&) { no_cuda("all_finite"); }
std::vector<double> sum_squares(const std::vector<Tensor>&) { no_cuda("sum_squares"); }
bool all_finite(const std::vector<Tensor>&) { no_cuda("all_finite"); }
void cast(const Tensor&, Tensor&) { no_cuda("cast"); }
void add_bias(Tensor&, const Tensor&) { no_cuda("add_bias"); }
void bias_backward(const Tensor&, Tensor&) { no_cuda("bias_backward"); }
void gelu_forward(const Tensor&, Tensor&) { no_cuda("gelu_forward"); }
void gelu_backward(const Tensor&, const Tensor&, Tensor&) { no_cuda("gelu_backward"); }
void adamw_update(Tensor&, const Tensor&, Tensor&, Tensor&, double, double, double, double, double,
                  std::int64_t) {
  no_cuda("adamw_update");
}
void sgd_update(Tensor&, const Tensor&, Tensor&, double, double, double, bool) {
  no_cuda("sgd_update");
}
void matmul(const Tensor&, const Tensor&, Tensor&, bool, bool, double, double) {
  no_cuda("matmul");
}
void gemm_strided_batched_f32(bool, bool, std::int64_t, std::int64_t, std::int64_t, float,
                              const float*, std::int64_t, std::int64_t, const float*, std::int64_t,
                              std::int64_t, float, float*, std::int64_t, std::int64_t,
                              std::int64_t) {
  no_cuda("gemm_strided_batched_f32");
}
bool tf32_enabled() { return false; }
void set_tf32_enabled(bool) {}
void layernorm_forward(const Tensor&, const Tensor&, const Tensor&, Tensor&, Tensor&, Tensor&,
                       double) {
  no_cuda("layernorm_forward");
}
void layernorm_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                        Tensor&, Tensor&, Tensor&) {
  no_cuda("layernorm_backward");
}
void softmax_forward(const Tensor&, Tensor&) { no_cuda("softmax_forward"); }
void softmax_backward(const Tensor&, const Tensor&, Tensor&) { no_cuda("softmax_backward"); }
void attention_forward(const Tensor&, const Tensor&, const Tensor&, Tensor&, Tensor&,
                       const ops::AttentionMask&, double) {
  no_cuda("attention_forward");
}
void attention_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                        Tensor&, Tensor&, Tensor&, const ops::AttentionMask&, double) {
  no_cuda("attention_backward");
}
void flash_attention_forward(const Tensor&, const Tensor&, const Tensor&, Tensor&, Tensor&, Tensor&,
                             const ops::AttentionMask&, double, std::int64_t) {
  no_cuda("flash_attention_forward");
}
void flash_attention_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                              const Tensor&, const Tensor&, const Tensor&, Tensor&, Tensor&,
                              Tensor&, const ops::AttentionMask&, double) {
  no_cuda("flash_attention_backward");
}
void attention_merge(Tensor&, Tensor&, Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  no_cuda("attention_merge");
}
void embedding_forward(const Tensor&, const Tensor&, Tensor&) { no_cuda("embedding_forward"); }
void embedding_backward(const Tensor&, const Tensor&, Tensor&) { no_cuda("embedding_backward"); }
void add_positions(Tensor&, const Tensor&, std::int64_t) { no_cuda("add_positions"); }
void positions_backward(const Tensor&, Tensor&, std::int64_t) { no_cuda("positions_backward"); }
double cross_entropy_forward(const Tensor&, const Tensor&, Tensor&) {
  no_cuda("cross_entropy_forward");
}
void cross_entropy_backward(const Tensor&, const Tensor&, double, Tensor&) {
  no_cuda("cross_entropy_backward");
}
void embedding_shard_forward(const Tensor&, const Tensor&, std::int64_t, Tensor&) {
  no_cuda("embedding_shard_forward");
}
void embedding_shard_backward(const Tensor&, const Tensor&, std::int64_t, Tensor&) {
  no_cuda("embedding_shard_backward");
}
void row_max(const Tensor&, Tensor&) { no_cuda("row_max"); }
void vocab_shard_softmax_sums(const Tensor&, const Tensor&, std::int64_t, const Tensor&, Tensor&,
                              Tensor&) {
  no_cuda("vocab_shard_softmax_sums");
}
void vocab_shard_cross_entropy_backward(const Tensor&, const Tensor&, std::int64_t, const Tensor&,
                                        const Tensor&, double, Tensor&) {
  no_cuda("vocab_shard_cross_entropy_backward");
}

}  // namespace dtp::cuda
#endif
