// Causal multi-head attention on the GPU, in the [B, T, H, D] layout of the
// CPU ops (row i of head h in batch b starts at ((b T + i) H + h) D).
//
// Naive: the scores of one batch entry are H strided GEMMs through cuBLAS
// (a head's rows are H * D apart, consecutive heads D apart), a row kernel
// applies the mask and the softmax in place, and P V is another batched
// GEMM; the backward is four batched GEMMs and one row kernel.
//
// Flash: FlashAttention-2. Blocks of 64 query rows (forward, dQ) or 64 key
// rows (dK, dV) walk the other side with an online softmax, and the backward
// recomputes the probabilities from the saved row max and sum. No atomics:
// every output row has one writer. Which kernels run is decided in
// flash_attention_launches.cuh from the dtype, the head width and
// kernel_choice() below:
// - f32 with TF32 on (tf32_enabled(), the default) runs the WMMA kernels in
//   TF32 (flash_attention_tc.cuh), 64 rows of the other side at a time
//   through shared memory;
// - f32 with TF32 off (DTP_TF32=0) runs the exact f32 kernels on CUDA cores,
//   one thread per row (flash_attention_exact.cuh), as the cuBLAS matmuls
//   then multiply in f32;
// - bf16 and f16 with heads up to 64 wide run the mma.sync kernels, whose
//   scores stay in registers (flash_attention_mma.cuh), or the WMMA ones with
//   DTP_FLASH_KERNEL=wmma; wider 16-bit heads run WMMA. The 16-bit tensors
//   are read as they are, with f32 scores, softmax and accumulators.
// The naive path and the merge are f32 kernels: ops:: widens bf16/f16 to f32
// copies for them and rounds the outputs back (cpu/widen.h).
#include <cmath>
#include <cstdlib>
#include <limits>
#include <type_traits>

#include "cuda/flash_attention_launches.cuh"
#include "cuda/nn_kernels_common.cuh"

namespace dtp::cuda {

namespace {
using nn::check_launch;
using nn::ptr;
using nn::stream;

using flash::Dims;
using flash::kNegInf;
using flash::Mask;

Mask to_mask(const ops::AttentionMask& m) { return {m.causal, m.q_start, m.k_start}; }

Dims check_qkv(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, double scale) {
  nn::check_float(op, "q", q, q.device());
  nn::check_float(op, "k", k, q.device());
  nn::check_float(op, "v", v, q.device());
  detail::check_dtype_is(op, "k", k, q.dtype());
  detail::check_dtype_is(op, "v", v, q.dtype());
  DTP_CHECK(q.ndim() == 4, op, ": q must be [B, T, H, D] (view a [B, T, C] activation as ",
            "[B, T, heads, C / heads]), got ", q.describe());
  DTP_CHECK(
      k.ndim() == 4 && k.size(0) == q.size(0) && k.size(2) == q.size(2) && k.size(3) == q.size(3),
      op, ": k must be [", q.size(0), ", Tk, ", q.size(2), ", ", q.size(3), "] to match q ",
      q.describe(), ", got ", k.describe());
  detail::check_shape(op, "v", v, k.shape());
  Dims d{q.size(0), q.size(1), k.size(1), q.size(2), q.size(3), static_cast<float>(scale)};
  if (scale <= 0)
    d.scale = d.D > 0 ? static_cast<float>(1.0 / std::sqrt(static_cast<double>(d.D))) : 1.f;
  return d;
}

void check_like(const char* op, const char* name, const Tensor& t, const Tensor& q,
                const Shape& shape) {
  nn::check_float(op, name, t, q.device());
  detail::check_dtype_is(op, name, t, q.dtype());
  detail::check_shape(op, name, t, shape);
}

// --- naive ----------------------------------------------------------------------

// One block per row of scores [B, H, Tq, Tk]: masked softmax in place.
__global__ void masked_softmax_kernel(float* p, std::int64_t Tq, std::int64_t Tk, Mask mask) {
  __shared__ nn::MaxSum shared[32];
  float* row = p + blockIdx.x * Tk;
  const std::int64_t nk = mask.visible(blockIdx.x % Tq, Tk);
  nn::MaxSum ms{kNegInf, 0.f};
  for (std::int64_t c = threadIdx.x; c < nk; c += blockDim.x) ms = nn::merge(ms, {row[c], 1.f});
  ms = nn::block_merge(ms, shared);
  const float inv = nk > 0 ? 1.f / ms.s : 0.f;
  for (std::int64_t c = threadIdx.x; c < Tk; c += blockDim.x)
    row[c] = c < nk ? expf(row[c] - ms.m) * inv : 0.f;
}

// dS = scale * P * (dP - rowsum(P * dP)), in place over dP.
__global__ void softmax_grad_kernel(const float* p, float* dp, std::int64_t Tk, float scale) {
  __shared__ float shared[32];
  const float* prow = p + blockIdx.x * Tk;
  float* drow = dp + blockIdx.x * Tk;
  float dot = 0;
  for (std::int64_t c = threadIdx.x; c < Tk; c += blockDim.x) dot += prow[c] * drow[c];
  dot = nn::block_sum(dot, shared);
  for (std::int64_t c = threadIdx.x; c < Tk; c += blockDim.x)
    drow[c] = scale * prow[c] * (drow[c] - dot);
}

// --- flash ----------------------------------------------------------------------

__global__ void merge_kernel(float* out, float* row_max, float* row_sum, const float* other_out,
                             const float* other_max, const float* other_sum, Dims d) {
  const std::int64_t rows = d.B * d.H * d.Tq;
  for (std::int64_t r = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; r < rows;
       r += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t i = r % d.Tq, bh = r / d.Tq, h = bh % d.H, b = bh / d.H;
    const std::int64_t o = ((b * d.Tq + i) * d.H + h) * d.D;
    const float l_b = other_sum[r];
    if (l_b == 0.f) continue;  // b saw no key
    const float l_a = row_sum[r];
    if (l_a == 0.f) {
      for (std::int64_t c = 0; c < d.D; ++c) out[o + c] = other_out[o + c];
      row_max[r] = other_max[r];
      row_sum[r] = l_b;
      continue;
    }
    const float m = fmaxf(row_max[r], other_max[r]);
    const float w_a = l_a * expf(row_max[r] - m), w_b = l_b * expf(other_max[r] - m);
    const float l = w_a + w_b, c_a = w_a / l, c_b = w_b / l;
    for (std::int64_t c = 0; c < d.D; ++c) out[o + c] = c_a * out[o + c] + c_b * other_out[o + c];
    row_max[r] = m;
    row_sum[r] = l;
  }
}

// Calls fn(std::integral_constant<int, MAXD>{}) with the smallest supported
// MAXD >= D.
template <typename Fn>
void with_head_dim(const char* op, std::int64_t D, Fn&& fn) {
  if (D <= 16)
    fn(std::integral_constant<int, 16>{});
  else if (D <= 32)
    fn(std::integral_constant<int, 32>{});
  else if (D <= 64)
    fn(std::integral_constant<int, 64>{});
  else if (D <= 128)
    fn(std::integral_constant<int, 128>{});
  else
    throw Error(std::string(op) + ": the CUDA flash kernels support head dims up to 128, got " +
                std::to_string(D));
}

template <typename Kernel>
void allow_shared(Kernel kernel, std::size_t bytes) {
  DTP_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(bytes)));
}

/// Launches a flash kernel on @p grid blocks of @p threads with @p bytes of shared memory.
template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), dim3 grid, int threads, std::size_t bytes, Args... args) {
  allow_shared(kernel, bytes);
  kernel<<<grid, threads, bytes, stream()>>>(args...);
  check_launch();
}

/// Whether 16-bit attention runs the mma.sync kernels (the default) or the
/// WMMA ones: DTP_FLASH_KERNEL=mma|wmma. Both are kept so that a GPU run can
/// time one against the other, and fall back to the simpler one.
bool sixteen_bit_on_mma() {
  const char* env = std::getenv("DTP_FLASH_KERNEL");
  const std::string name = env == nullptr ? "" : env;
  if (name.empty() || name == "mma") return true;
  if (name == "wmma") return false;
  throw Error("DTP_FLASH_KERNEL must be mma or wmma (the bf16/f16 flash attention kernels), got '" +
              name + "'");
}

/// The flash kernels a call asks for: 16-bit tensors on mma.sync or WMMA
/// (DTP_FLASH_KERNEL), f32 in TF32 or in exact f32 (DTP_TF32, set_tf32_enabled()).
flash::KernelChoice kernel_choice() { return {sixteen_bit_on_mma(), tf32_enabled()}; }

// One block per 64 rows (flash::kRows) of one (batch, head).
dim3 row_grid(const Dims& d, std::int64_t T) {
  return dim3(static_cast<unsigned>((T + flash::kRows - 1) / flash::kRows),
              static_cast<unsigned>(d.H), static_cast<unsigned>(d.B));
}

void check_grid(const char* op, const Dims& d) {
  DTP_CHECK(d.H <= 65535 && d.B <= 65535, op,
            ": at most 65535 heads and batch entries on CUDA, got ", d.H, " and ", d.B);
}
}  // namespace

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out,
                       Tensor& probs, const ops::AttentionMask& mask, double scale) {
  const char* op = "attention_forward";
  const Dims d = check_qkv(op, q, k, v, scale);
  check_like(op, "out", out, q, q.shape());
  check_like(op, "probs", probs, q, Shape{d.B, d.H, d.Tq, d.Tk});
  if (d.B * d.H * d.Tq == 0) return;
  nn::use_device(q.device());
  if (d.Tk == 0 || d.D == 0) {
    out.fill(0);
    if (probs.numel() > 0) probs.fill(0);
    return;
  }
  const std::int64_t ld = d.H * d.D, TqTk = d.Tq * d.Tk;
  for (std::int64_t b = 0; b < d.B; ++b) {
    // S_h = scale Q_h K_h^T into probs[b, h].
    gemm_strided_batched_f32(false, true, d.Tq, d.Tk, d.D, d.scale, ptr<float>(q) + b * d.Tq * ld,
                             ld, d.D, ptr<float>(k) + b * d.Tk * ld, ld, d.D, 0.f,
                             ptr<float>(probs) + b * d.H * TqTk, d.Tk, TqTk, d.H);
  }
  masked_softmax_kernel<<<static_cast<unsigned>(d.B * d.H * d.Tq), 128, 0, stream()>>>(
      ptr<float>(probs), d.Tq, d.Tk, to_mask(mask));
  check_launch();
  for (std::int64_t b = 0; b < d.B; ++b) {
    // O_h = P_h V_h.
    gemm_strided_batched_f32(false, false, d.Tq, d.D, d.Tk, 1.f, ptr<float>(probs) + b * d.H * TqTk,
                             d.Tk, TqTk, ptr<float>(v) + b * d.Tk * ld, ld, d.D, 0.f,
                             ptr<float>(out) + b * d.Tq * ld, ld, d.D, d.H);
  }
}

void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& probs,
                        const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv,
                        const ops::AttentionMask& mask, double scale) {
  const char* op = "attention_backward";
  const Dims d = check_qkv(op, q, k, v, scale);
  check_like(op, "probs", probs, q, Shape{d.B, d.H, d.Tq, d.Tk});
  check_like(op, "dout", dout, q, q.shape());
  check_like(op, "dq", dq, q, q.shape());
  check_like(op, "dk", dk, q, k.shape());
  check_like(op, "dv", dv, q, v.shape());
  (void)mask;  // hidden entries have P = 0, so they get no gradient
  nn::use_device(q.device());
  if (d.B * d.H * d.Tq * d.Tk * d.D == 0) {
    if (dq.numel()) dq.fill(0);
    if (dk.numel()) dk.fill(0);
    if (dv.numel()) dv.fill(0);
    return;
  }
  const std::int64_t ld = d.H * d.D, TqTk = d.Tq * d.Tk;
  Tensor dp = Tensor::empty(probs.shape(), DType::f32, q.device(), MemoryCategory::activations);
  for (std::int64_t b = 0; b < d.B; ++b) {
    const float* P = ptr<float>(probs) + b * d.H * TqTk;
    const float* dO = ptr<float>(dout) + b * d.Tq * ld;
    float* dP = ptr<float>(dp) + b * d.H * TqTk;
    // dP_h = dO_h V_h^T; dV_h = P_h^T dO_h.
    gemm_strided_batched_f32(false, true, d.Tq, d.Tk, d.D, 1.f, dO, ld, d.D,
                             ptr<float>(v) + b * d.Tk * ld, ld, d.D, 0.f, dP, d.Tk, TqTk, d.H);
    gemm_strided_batched_f32(true, false, d.Tk, d.D, d.Tq, 1.f, P, d.Tk, TqTk, dO, ld, d.D, 0.f,
                             ptr<float>(dv) + b * d.Tk * ld, ld, d.D, d.H);
  }
  softmax_grad_kernel<<<static_cast<unsigned>(d.B * d.H * d.Tq), 128, 0, stream()>>>(
      ptr<float>(probs), ptr<float>(dp), d.Tk, d.scale);
  check_launch();
  for (std::int64_t b = 0; b < d.B; ++b) {
    const float* dS = ptr<float>(dp) + b * d.H * TqTk;
    // dQ_h = dS_h K_h; dK_h = dS_h^T Q_h.
    gemm_strided_batched_f32(false, false, d.Tq, d.D, d.Tk, 1.f, dS, d.Tk, TqTk,
                             ptr<float>(k) + b * d.Tk * ld, ld, d.D, 0.f,
                             ptr<float>(dq) + b * d.Tq * ld, ld, d.D, d.H);
    gemm_strided_batched_f32(true, false, d.Tk, d.D, d.Tq, 1.f, dS, d.Tk, TqTk,
                             ptr<float>(q) + b * d.Tq * ld, ld, d.D, 0.f,
                             ptr<float>(dk) + b * d.Tk * ld, ld, d.D, d.H);
  }
}

void flash_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out,
                             Tensor& row_max, Tensor& row_sum, const ops::AttentionMask& mask,
                             double scale, std::int64_t block_size) {
  const char* op = "flash_attention_forward";
  const Dims d = check_qkv(op, q, k, v, scale);
  DTP_CHECK(block_size >= 1, op, ": block_size must be at least 1, got ", block_size);
  // block_size shapes the CPU loop; the GPU kernels use their own tiles
  // (flash::kRows, flash::kCols): the result is the same up to rounding.
  check_like(op, "out", out, q, q.shape());
  check_like(op, "row_max", row_max, q, Shape{d.B, d.H, d.Tq});
  check_like(op, "row_sum", row_sum, q, Shape{d.B, d.H, d.Tq});
  check_grid(op, d);
  if (d.B * d.H * d.Tq == 0) return;
  nn::use_device(q.device());
  const flash::KernelChoice choice = kernel_choice();
  nn::with_float(q.dtype(), [&](auto element) {
    using T = decltype(element);
    with_head_dim(op, d.D, [&](auto maxd) {
      constexpr int MAXD = decltype(maxd)::value;
      flash::forward_launches<T, MAXD>(choice, [&](auto kernel, int threads, std::size_t bytes) {
        launch(kernel, row_grid(d, d.Tq), threads, bytes, ptr<T>(q), ptr<T>(k), ptr<T>(v),
               ptr<T>(out), ptr<T>(row_max), ptr<T>(row_sum), d, to_mask(mask));
      });
    });
  });
}

void flash_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                              const Tensor& row_max, const Tensor& row_sum, const Tensor& dout,
                              Tensor& dq, Tensor& dk, Tensor& dv, const ops::AttentionMask& mask,
                              double scale) {
  const char* op = "flash_attention_backward";
  const Dims d = check_qkv(op, q, k, v, scale);
  check_like(op, "out", out, q, q.shape());
  check_like(op, "dout", dout, q, q.shape());
  check_like(op, "dq", dq, q, q.shape());
  check_like(op, "dk", dk, q, k.shape());
  check_like(op, "dv", dv, q, v.shape());
  check_like(op, "row_max", row_max, q, Shape{d.B, d.H, d.Tq});
  check_like(op, "row_sum", row_sum, q, Shape{d.B, d.H, d.Tq});
  check_grid(op, d);
  nn::use_device(q.device());
  if (d.B * d.H * d.Tq * d.Tk == 0 || d.D == 0) {
    if (dq.numel()) dq.fill(0);
    if (dk.numel()) dk.fill(0);
    if (dv.numel()) dv.fill(0);
    return;
  }
  Tensor delta =
      Tensor::empty({d.B, d.H, d.Tq}, DType::f32, q.device(), MemoryCategory::activations);
  const flash::KernelChoice choice = kernel_choice();
  nn::with_float(q.dtype(), [&](auto element) {
    using T = decltype(element);
    flash::row_dot_kernel<T><<<nn::grid_for(d.B * d.H * d.Tq), 256, 0, stream()>>>(
        ptr<T>(dout), ptr<T>(out), ptr<float>(delta), d);
    check_launch();
    with_head_dim(op, d.D, [&](auto maxd) {
      constexpr int MAXD = decltype(maxd)::value;
      // dQ: one block per 64 query rows; dK and dV: one per 64 key rows.
      flash::backward_launches<T, MAXD>(
          choice, [&](auto kernel, int threads, std::size_t bytes, auto blocks) {
            auto run = [&](std::int64_t rows, auto... outputs) {
              launch(kernel, row_grid(d, rows), threads, bytes, ptr<T>(q), ptr<T>(k), ptr<T>(v),
                     ptr<T>(dout), ptr<T>(row_max), ptr<T>(row_sum), ptr<float>(delta), outputs...,
                     d, to_mask(mask));
            };
            if constexpr (std::is_same_v<decltype(blocks), flash::KeyBlocks>)
              run(d.Tk, ptr<T>(dk), ptr<T>(dv));
            else
              run(d.Tq, ptr<T>(dq));
          });
    });
  });
}

void attention_merge(Tensor& out, Tensor& row_max, Tensor& row_sum, const Tensor& other_out,
                     const Tensor& other_max, const Tensor& other_sum) {
  const char* op = "attention_merge";
  nn::check_float(op, "out", out, out.device());
  DTP_CHECK(out.ndim() == 4, op, ": out must be [B, Tq, H, D], got ", out.describe());
  check_like(op, "other_out", other_out, out, out.shape());
  const Dims d{out.size(0), out.size(1), 0, out.size(2), out.size(3), 1.f};
  const Shape stat{d.B, d.H, d.Tq};
  check_like(op, "row_max", row_max, out, stat);
  check_like(op, "row_sum", row_sum, out, stat);
  check_like(op, "other_max", other_max, out, stat);
  check_like(op, "other_sum", other_sum, out, stat);
  const std::int64_t rows = d.B * d.H * d.Tq;
  if (rows == 0) return;
  nn::use_device(out.device());
  merge_kernel<<<nn::grid_for(rows), 256, 0, stream()>>>(
      ptr<float>(out), ptr<float>(row_max), ptr<float>(row_sum), ptr<float>(other_out),
      ptr<float>(other_max), ptr<float>(other_sum), d);
  check_launch();
}

}  // namespace dtp::cuda
