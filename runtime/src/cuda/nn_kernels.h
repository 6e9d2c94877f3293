// Internal: the CUDA kernels of the nn ops (dtp/nn_ops.h), in plain C++ types
// so that the CPU op files can dispatch to them without CUDA headers:
//
//   if (x.device().is_cuda()) return cuda::layernorm_forward(...);
//
// Each entry point has the contract of the ops:: function of the same name
// (same shapes, same aliasing rules, same accumulate-vs-overwrite), checks
// its arguments itself (every tensor on one GPU, matching dtypes and shapes)
// and queues its work on the calling rank's current stream. Functions that
// return a value to the host (sum_squares, all_finite, cross_entropy_forward)
// and the ones that validate token ids (embedding_forward) wait for the stream.
//
// Dtypes: f32 now (matmuls may use TF32 tensor cores). The kernels are
// templates over the storage type with float accumulation, so bf16/f16 are a
// dispatch change; other dtypes fail with a clear dtp::Error today.
// Implemented in src/cuda/nn_*.cu; src/core/nn_kernels_stubs.cpp explains
// itself in builds without CUDA.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "dtp/nn_ops.h"
#include "dtp/tensor.h"

namespace dtp::cuda {

// --- element-wise (nn_elementwise.cu) ---
void fill_normal(Tensor& x, double mean, double std, Rng& rng);
void add(const Tensor& a, const Tensor& b, Tensor& out);
void axpy(Tensor& y, double alpha, const Tensor& x);
double sum_squares(const Tensor& x);
bool all_finite(const Tensor& x);
/// Of every tensor (all on one GPU), with one wait for the stream.
std::vector<double> sum_squares(const std::vector<Tensor>& xs);
bool all_finite(const std::vector<Tensor>& xs);
void cast(const Tensor& src, Tensor& dst);
void add_bias(Tensor& x, const Tensor& bias);
void bias_backward(const Tensor& dy, Tensor& dbias);
void gelu_forward(const Tensor& x, Tensor& y);
void gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx);
void adamw_update(Tensor& params, const Tensor& grads, Tensor& m, Tensor& v, double lr,
                  double beta1, double beta2, double eps, double weight_decay, std::int64_t step);
void sgd_update(Tensor& params, const Tensor& grads, Tensor& momentum_buffer, double lr,
                double momentum, double weight_decay, bool nesterov);

// --- matrix products through cuBLAS (nn_matmul_cublas.cu) ---
void matmul(const Tensor& a, const Tensor& b, Tensor& out, bool transpose_a, bool transpose_b,
            double alpha, double beta);
/// Row-major strided-batched product on the current stream, f32 data (TF32
/// math): for each batch index i, C_i = alpha op(A_i) op(B_i) + beta C_i with
/// C_i [M, N] (leading dim ldc), A_i [M, K] or [K, M] (lda), B_i [K, N] or
/// [N, K] (ldb); A_i = A + i * stride_a and so on, in elements.
void gemm_strided_batched_f32(bool transpose_a, bool transpose_b, std::int64_t M, std::int64_t N,
                              std::int64_t K, float alpha, const float* A, std::int64_t lda,
                              std::int64_t stride_a, const float* B, std::int64_t ldb,
                              std::int64_t stride_b, float beta, float* C, std::int64_t ldc,
                              std::int64_t stride_c, std::int64_t batch);
/// Whether f32 matmuls use TF32 tensor cores (default true; DTP_TF32=0 in the
/// environment turns it off at start). Per process.
bool tf32_enabled();
void set_tf32_enabled(bool enabled);

// --- LayerNorm and softmax (nn_layernorm.cu) ---
void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& y,
                       Tensor& mean, Tensor& rstd, double eps);
void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd, Tensor& dx, Tensor& dweight, Tensor& dbias);
void softmax_forward(const Tensor& x, Tensor& y);
void softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx);

// --- attention (nn_attention.cu) ---
void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out,
                       Tensor& probs, const ops::AttentionMask& mask, double scale);
void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& probs,
                        const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv,
                        const ops::AttentionMask& mask, double scale);
void flash_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out,
                             Tensor& row_max, Tensor& row_sum, const ops::AttentionMask& mask,
                             double scale, std::int64_t block_size);
void flash_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                              const Tensor& row_max, const Tensor& row_sum, const Tensor& dout,
                              Tensor& dq, Tensor& dk, Tensor& dv, const ops::AttentionMask& mask,
                              double scale);
void attention_merge(Tensor& out, Tensor& row_max, Tensor& row_sum, const Tensor& other_out,
                     const Tensor& other_max, const Tensor& other_sum);

// --- embedding and cross-entropy (nn_embedding.cu, nn_cross_entropy.cu) ---
void embedding_forward(const Tensor& ids, const Tensor& table, Tensor& out);
void embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dtable);
void add_positions(Tensor& x, const Tensor& positions, std::int64_t start);
void positions_backward(const Tensor& dx, Tensor& dpositions, std::int64_t start);
double cross_entropy_forward(const Tensor& logits, const Tensor& targets, Tensor& losses);
void cross_entropy_backward(const Tensor& logits, const Tensor& targets, double loss_scale,
                            Tensor& dlogits);

// --- vocabulary-parallel lookup and loss (nn_kernels_vocab_parallel.cu) ---
void embedding_shard_forward(const Tensor& ids, const Tensor& table_shard, std::int64_t vocab_start,
                             Tensor& out);
void embedding_shard_backward(const Tensor& ids, const Tensor& dout, std::int64_t vocab_start,
                              Tensor& dtable_shard);
void row_max(const Tensor& x, Tensor& out);
void vocab_shard_softmax_sums(const Tensor& logits, const Tensor& targets, std::int64_t vocab_start,
                              const Tensor& row_max, Tensor& sum_exp, Tensor& target_logit);
void vocab_shard_cross_entropy_backward(const Tensor& logits, const Tensor& targets,
                                        std::int64_t vocab_start, const Tensor& row_max,
                                        const Tensor& sum_exp, double loss_scale, Tensor& dlogits);

// --- per-row weights (nn_kernels_rows.cu) ---
void scale_rows(Tensor& x, const Tensor& w);
void row_dot(const Tensor& a, const Tensor& b, Tensor& out);

// --- layout (nn_kernels_permute.cu) ---
void permute(const Tensor& in, const std::array<int, 4>& order, Tensor& out);

}  // namespace dtp::cuda
