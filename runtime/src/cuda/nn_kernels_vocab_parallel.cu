// One rank's share of a vocabulary split over tensor-parallel ranks (chapter
// 04). The lookup is a gather with a mask; the softmax statistics use one
// block per row like the fused cross-entropy, but take the row's max over the
// whole vocabulary as an input (the ranks agree on it by an all-reduce first).
#include <cmath>

#include "cuda/nn_kernels_common.cuh"

namespace dtp::cuda {

namespace {
using nn::check_launch;
using nn::grid_for;
using nn::ptr;
using nn::stream;

constexpr int kThreads = 256;

#define DTP_GRID_STRIDE(i, n)                                                                      \
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)

template <typename T>
__global__ void shard_gather_kernel(const std::int32_t* ids, const T* table, T* out, std::int64_t n,
                                    std::int64_t C, std::int64_t vocab_start, std::int64_t rows) {
  DTP_GRID_STRIDE(i, n * C) {
    const std::int64_t row = i / C, c = i - row * C;
    const std::int64_t local = static_cast<std::int64_t>(ids[row]) - vocab_start;
    out[i] = local >= 0 && local < rows ? table[local * C + c] : T(0);
  }
}

template <typename T>
__global__ void row_max_kernel(const T* x, T* out, std::int64_t V) {
  __shared__ float shared[32];
  const T* row = x + blockIdx.x * V;
  float m = -INFINITY;
  for (std::int64_t c = threadIdx.x; c < V; c += blockDim.x) m = fmaxf(m, load(row, c));
  m = nn::block_max(m, shared);
  if (threadIdx.x == 0) store(out, blockIdx.x, m);
}

template <typename T>
__global__ void softmax_sums_kernel(const T* logits, const std::int32_t* targets, const T* row_max,
                                    T* sum_exp, T* target_logit, std::int64_t V,
                                    std::int64_t vocab_start) {
  __shared__ float shared[32];
  const T* row = logits + blockIdx.x * V;
  const float m = load(row_max, blockIdx.x);
  float s = 0.f;
  for (std::int64_t c = threadIdx.x; c < V; c += blockDim.x) s += expf(load(row, c) - m);
  s = nn::block_sum(s, shared);
  if (threadIdx.x == 0) {
    const std::int64_t local = static_cast<std::int64_t>(targets[blockIdx.x]) - vocab_start;
    store(sum_exp, blockIdx.x, s);
    store(target_logit, blockIdx.x, local >= 0 && local < V ? load(row, local) : 0.f);
  }
}

template <typename T>
__global__ void shard_ce_backward_kernel(const T* logits, const std::int32_t* targets,
                                         const T* row_max, const T* sum_exp, float scale,
                                         T* dlogits, std::int64_t V, std::int64_t vocab_start) {
  const T* row = logits + blockIdx.x * V;
  T* grad = dlogits + blockIdx.x * V;  // may be the same memory as row
  const float m = load(row_max, blockIdx.x);
  const float inverse_sum = 1.f / load(sum_exp, blockIdx.x);
  const std::int64_t local = static_cast<std::int64_t>(targets[blockIdx.x]) - vocab_start;
  for (std::int64_t c = threadIdx.x; c < V; c += blockDim.x) {
    float g = expf(load(row, c) - m) * inverse_sum * scale;
    if (c == local) g -= scale;
    store(grad, c, g);
  }
}

struct Rows {
  std::int64_t N, C;
};

Rows check_shard_lookup(const char* op, const Tensor& ids, const Tensor& table,
                        const char* table_name, const Tensor& rows_tensor, const char* rows_name) {
  nn::check_float(op, table_name, table, table.device());
  nn::check_same_gpu(op, "ids", ids, table.device());
  DTP_CHECK(ids.dtype() == DType::i32, op, ": ids must be i32 token ids, got ", ids.describe());
  nn::check_float(op, rows_name, rows_tensor, table.device());
  detail::check_dtype_is(op, rows_name, rows_tensor, table.dtype());
  DTP_CHECK(table.ndim() == 2, op, ": ", table_name, " must be [V/t, C], got ", table.describe());
  const std::int64_t C = table.size(1), N = ids.numel();
  DTP_CHECK(rows_tensor.numel() == N * C && detail::last_dim(op, rows_name, rows_tensor) == C, op,
            ": ", rows_name, " must be [..., ", C, "] with ", N, " rows (one per id), got ",
            rows_tensor.describe());
  return {N, C};
}

detail::LogitRows check_logits_slice(const char* op, const Tensor& logits, const Tensor& targets) {
  nn::check_float(op, "logits", logits, logits.device());
  nn::check_same_gpu(op, "targets", targets, logits.device());
  return detail::logit_rows(op, logits, targets, "vocabulary slice");
}

void check_row_stat(const char* op, const char* name, const Tensor& stat, const Tensor& logits,
                    std::int64_t N) {
  nn::check_float(op, name, stat, logits.device());
  detail::check_dtype_is(op, name, stat, logits.dtype());
  detail::check_numel(op, name, stat, N, "one per row of logits");
}
}  // namespace

void embedding_shard_forward(const Tensor& ids, const Tensor& table_shard, std::int64_t vocab_start,
                             Tensor& out) {
  const Rows r =
      check_shard_lookup("embedding_shard_forward", ids, table_shard, "table_shard", out, "out");
  if (r.N == 0 || r.C == 0) return;
  nn::use_device(table_shard.device());
  nn::with_float(table_shard.dtype(), [&](auto zero) {
    using T = decltype(zero);
    shard_gather_kernel<<<grid_for(r.N * r.C), kThreads, 0, stream()>>>(
        ptr<std::int32_t>(ids), ptr<T>(table_shard), ptr<T>(out), r.N, r.C, vocab_start,
        table_shard.size(0));
  });
  check_launch();
}

void embedding_shard_backward(const Tensor& ids, const Tensor& dout, std::int64_t vocab_start,
                              Tensor& dtable_shard) {
  const Rows r = check_shard_lookup("embedding_shard_backward", ids, dtable_shard, "dtable_shard",
                                    dout, "dout");
  if (r.N == 0 || r.C == 0) return;
  nn::use_device(dtable_shard.device());
  nn::add_rows_by_id(ids, dout, vocab_start,
                     dtable_shard);  // ids of other ranks' shards are skipped
}

void row_max(const Tensor& x, Tensor& out) {
  const char* op = "row_max";
  nn::check_float(op, "x", x, x.device());
  const std::int64_t V = detail::last_dim(op, "x", x);
  DTP_CHECK(V >= 1, op, ": rows need at least one element, got ", x.describe());
  const std::int64_t N = x.numel() / V;
  check_row_stat(op, "out", out, x, N);
  if (N == 0) return;
  nn::use_device(x.device());
  nn::with_float(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    row_max_kernel<<<static_cast<unsigned>(N), kThreads, 0, stream()>>>(ptr<T>(x), ptr<T>(out), V);
  });
  check_launch();
}

void vocab_shard_softmax_sums(const Tensor& logits, const Tensor& targets, std::int64_t vocab_start,
                              const Tensor& row_max, Tensor& sum_exp, Tensor& target_logit) {
  const char* op = "vocab_shard_softmax_sums";
  const detail::LogitRows r = check_logits_slice(op, logits, targets);
  check_row_stat(op, "row_max", row_max, logits, r.N);
  check_row_stat(op, "sum_exp", sum_exp, logits, r.N);
  check_row_stat(op, "target_logit", target_logit, logits, r.N);
  if (r.N == 0) return;
  nn::use_device(logits.device());
  nn::with_float(logits.dtype(), [&](auto zero) {
    using T = decltype(zero);
    softmax_sums_kernel<<<static_cast<unsigned>(r.N), kThreads, 0, stream()>>>(
        ptr<T>(logits), ptr<std::int32_t>(targets), ptr<T>(row_max), ptr<T>(sum_exp),
        ptr<T>(target_logit), r.V, vocab_start);
  });
  check_launch();
}

void vocab_shard_cross_entropy_backward(const Tensor& logits, const Tensor& targets,
                                        std::int64_t vocab_start, const Tensor& row_max,
                                        const Tensor& sum_exp, double loss_scale, Tensor& dlogits) {
  const char* op = "vocab_shard_cross_entropy_backward";
  const detail::LogitRows r = check_logits_slice(op, logits, targets);
  check_row_stat(op, "row_max", row_max, logits, r.N);
  check_row_stat(op, "sum_exp", sum_exp, logits, r.N);
  nn::check_float(op, "dlogits", dlogits, logits.device());
  detail::check_dtype_is(op, "dlogits", dlogits, logits.dtype());
  detail::check_shape(op, "dlogits", dlogits, logits.shape());
  if (r.N == 0) return;
  nn::use_device(logits.device());
  nn::with_float(logits.dtype(), [&](auto zero) {
    using T = decltype(zero);
    shard_ce_backward_kernel<<<static_cast<unsigned>(r.N), kThreads, 0, stream()>>>(
        ptr<T>(logits), ptr<std::int32_t>(targets), ptr<T>(row_max), ptr<T>(sum_exp),
        static_cast<float>(loss_scale), ptr<T>(dlogits), r.V, vocab_start);
  });
  check_launch();
}

}  // namespace dtp::cuda
