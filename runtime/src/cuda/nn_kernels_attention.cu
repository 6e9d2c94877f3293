// Causal multi-head attention on the GPU, in the [B, T, H, D] layout of the
// CPU ops (row i of head h in batch b starts at ((b T + i) H + h) D).
//
// Naive: the scores of one batch entry are H strided GEMMs through cuBLAS
// (a head's rows are H * D apart, consecutive heads D apart), a row kernel
// applies the mask and the softmax in place, and P V is another batched
// GEMM; the backward is four batched GEMMs and one row kernel.
//
// Flash: a tiled online-softmax kernel. A block of kTile threads owns kTile
// query rows (one per thread) of one (batch, head); key and value tiles of
// kTile rows are staged in shared memory and every thread folds a tile into
// its running (max, sum, output) exactly like ops::attention_merge. The
// backward recomputes the probabilities from the saved row max and sum: one
// kernel for dQ (a query row per 1-4 lanes, looping over key tiles) and one
// for dK and dV (a key row per 1-4 lanes, looping over query tiles), so no
// atomics.
// These kernels use CUDA cores (FFMA), not tensor cores: correct and
// memory-frugal first; an mma/wgmma version is the next step for speed.
// They are f32 kernels: ops:: widens bf16/f16 attention to f32 copies on the
// GPU and rounds the outputs back (cpu/widen.h), the contract of the CPU ops.
#include <cmath>
#include <limits>
#include <type_traits>

#include "cuda/nn_kernels_common.cuh"

namespace dtp::cuda {

namespace {
using nn::check_launch;
using nn::ptr;
using nn::stream;

constexpr int kTile = 32;  // query rows per block and key rows per tile
constexpr float kNegInf = -INFINITY;

struct Dims {
  std::int64_t B, Tq, Tk, H, D;
  float scale;
};

struct Mask {
  bool causal;
  std::int64_t q_start, k_start;
  // Keys [0, visible(i)) are visible to query row i.
  __host__ __device__ std::int64_t visible(std::int64_t i, std::int64_t Tk) const {
    if (!causal) return Tk;
    const std::int64_t n = q_start + i - k_start + 1;
    return n < 0 ? 0 : (n > Tk ? Tk : n);
  }
};

Mask to_mask(const ops::AttentionMask& m) { return {m.causal, m.q_start, m.k_start}; }

Dims check_qkv(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, double scale) {
  nn::check_float(op, "q", q, q.device());
  nn::check_float(op, "k", k, q.device());
  nn::check_float(op, "v", v, q.device());
  detail::check_dtype_is(op, "k", k, q.dtype());
  detail::check_dtype_is(op, "v", v, q.dtype());
  DTP_CHECK(q.ndim() == 4, op, ": q must be [B, T, H, D] (view a [B, T, C] activation as ",
            "[B, T, heads, C / heads]), got ", q.describe());
  DTP_CHECK(k.ndim() == 4 && k.size(0) == q.size(0) && k.size(2) == q.size(2) && k.size(3) == q.size(3),
            op, ": k must be [", q.size(0), ", Tk, ", q.size(2), ", ", q.size(3), "] to match q ",
            q.describe(), ", got ", k.describe());
  detail::check_shape(op, "v", v, k.shape());
  Dims d{q.size(0), q.size(1), k.size(1), q.size(2), q.size(3), static_cast<float>(scale)};
  if (scale <= 0) d.scale = d.D > 0 ? static_cast<float>(1.0 / std::sqrt(static_cast<double>(d.D))) : 1.f;
  return d;
}

void check_like(const char* op, const char* name, const Tensor& t, const Tensor& q, const Shape& shape) {
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
  for (std::int64_t c = threadIdx.x; c < Tk; c += blockDim.x) row[c] = c < nk ? expf(row[c] - ms.m) * inv : 0.f;
}

// dS = scale * P * (dP - rowsum(P * dP)), in place over dP.
__global__ void softmax_grad_kernel(const float* p, float* dp, std::int64_t Tk, float scale) {
  __shared__ float shared[32];
  const float* prow = p + blockIdx.x * Tk;
  float* drow = dp + blockIdx.x * Tk;
  float dot = 0;
  for (std::int64_t c = threadIdx.x; c < Tk; c += blockDim.x) dot += prow[c] * drow[c];
  dot = nn::block_sum(dot, shared);
  for (std::int64_t c = threadIdx.x; c < Tk; c += blockDim.x) drow[c] = scale * prow[c] * (drow[c] - dot);
}

// --- flash ----------------------------------------------------------------------

// Copies rows [r0, r0 + kTile) of a head (rows `stride` apart, D wide) into
// shared memory rows `pitch` apart, MAXD wide, zero-filling past D and past
// the last row.
template <int MAXD>
__device__ __forceinline__ void load_tile(float* dst, int pitch, const float* src, std::int64_t stride,
                                          std::int64_t r0, std::int64_t rows, int D) {
  for (int idx = threadIdx.x; idx < kTile * MAXD; idx += blockDim.x) {
    const int r = idx / MAXD, c = idx % MAXD;
    dst[r * pitch + c] = (r0 + r < rows && c < D) ? src[(r0 + r) * stride + c] : 0.f;
  }
}

template <int MAXD>
__device__ __forceinline__ float dot_row(const float* a, const float* b) {
  float s = 0;
#pragma unroll
  for (int c = 0; c < MAXD; ++c) s += a[c] * b[c];
  return s;
}

template <int MAXD>
__global__ void __launch_bounds__(kTile) flash_forward_kernel(const float* q, const float* k, const float* v,
                                                              float* out, float* row_max, float* row_sum,
                                                              Dims d, Mask mask) {
  extern __shared__ float smem[];
  float* qs = smem;                    // [kTile][MAXD + 1]: each thread's own query row
  float* ks = qs + kTile * (MAXD + 1);  // [kTile][MAXD]: the key tile
  float* vs = ks + kTile * MAXD;        // [kTile][MAXD]: the value tile
  const std::int64_t b = blockIdx.z, h = blockIdx.y, i0 = static_cast<std::int64_t>(blockIdx.x) * kTile;
  const int t = threadIdx.x;
  const std::int64_t i = i0 + t, stride = d.H * d.D;
  const int D = static_cast<int>(d.D);
  const float* qb = q + (b * d.Tq * d.H + h) * d.D;
  const float* kb = k + (b * d.Tk * d.H + h) * d.D;
  const float* vb = v + (b * d.Tk * d.H + h) * d.D;
  load_tile<MAXD>(qs, MAXD + 1, qb, stride, i0, d.Tq, D);
  const std::int64_t nk = i < d.Tq ? mask.visible(i, d.Tk) : 0;
  const std::int64_t last_row = (i0 + kTile < d.Tq ? i0 + kTile : d.Tq) - 1;
  const std::int64_t block_nk = mask.visible(last_row, d.Tk);  // visibility grows with i
  const float* my_q = qs + t * (MAXD + 1);

  float acc[MAXD];
#pragma unroll
  for (int c = 0; c < MAXD; ++c) acc[c] = 0.f;
  float m = kNegInf, l = 0.f;
  for (std::int64_t j0 = 0; j0 < block_nk; j0 += kTile) {
    __syncthreads();  // the previous tile is consumed (and qs is loaded)
    load_tile<MAXD>(ks, MAXD, kb, stride, j0, d.Tk, D);
    load_tile<MAXD>(vs, MAXD, vb, stride, j0, d.Tk, D);
    __syncthreads();
    float s[kTile];
    float tile_max = kNegInf;
#pragma unroll
    for (int jj = 0; jj < kTile; ++jj) {
      s[jj] = j0 + jj < nk ? d.scale * dot_row<MAXD>(my_q, ks + jj * MAXD) : kNegInf;
      tile_max = fmaxf(tile_max, s[jj]);
    }
    if (tile_max == kNegInf) continue;  // this row sees no key of the tile
    const float m_new = fmaxf(m, tile_max);
    const float correction = expf(m - m_new);  // 0 while m is -inf
    l *= correction;
#pragma unroll
    for (int c = 0; c < MAXD; ++c) acc[c] *= correction;
#pragma unroll
    for (int jj = 0; jj < kTile; ++jj) {
      const float p = expf(s[jj] - m_new);  // 0 for hidden keys
      l += p;
#pragma unroll
      for (int c = 0; c < MAXD; ++c) acc[c] += p * vs[jj * MAXD + c];
    }
    m = m_new;
  }
  if (i >= d.Tq) return;
  const std::int64_t stat = (b * d.H + h) * d.Tq + i;
  row_max[stat] = m;
  row_sum[stat] = l;
  const float inv = l > 0.f ? 1.f / l : 0.f;
  float* o = out + ((b * d.Tq + i) * d.H + h) * d.D;
#pragma unroll
  for (int c = 0; c < MAXD; ++c)
    if (c < D) o[c] = acc[c] * inv;
}

// delta[b, h, i] = dO_i . O_i (= rowsum(P * dP)).
__global__ void row_dot_kernel(const float* dout, const float* out, float* delta, Dims d) {
  const std::int64_t rows = d.B * d.H * d.Tq;
  for (std::int64_t r = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; r < rows;
       r += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t i = r % d.Tq, bh = r / d.Tq, h = bh % d.H, b = bh / d.H;
    const std::int64_t o = ((b * d.Tq + i) * d.H + h) * d.D;
    float s = 0;
    for (std::int64_t c = 0; c < d.D; ++c) s += dout[o + c] * out[o + c];
    delta[r] = s;
  }
}

// The backward kernels split the head dimension over lanes: kLanes<MAXD>
// consecutive threads share a row, each holding MAXD / lanes of its
// accumulators (dQ, or dK and dV), and their partial dot products meet by
// warp shuffles. One thread per row held all MAXD (2 x 128 floats in dK/dV)
// and spilled to local memory.
template <int MAXD>
constexpr int kLanes = MAXD > 32 ? MAXD / 32 : 1;
template <int MAXD>
constexpr int kColumnsPerLane = MAXD / kLanes<MAXD>;

// The dot product of a row's two MAXD-vectors, from each lane's share of
// columns [first, first + kColumnsPerLane): every lane of the row gets the sum.
// The shuffles name only the row's own lanes: rows of one warp leave their
// loops at different points (causal rows see different numbers of keys).
template <int MAXD>
__device__ __forceinline__ float lane_dot(const float* a, const float* b, int first) {
  float s = 0;
#pragma unroll
  for (int c = 0; c < kColumnsPerLane<MAXD>; ++c) s += a[first + c] * b[first + c];
  if constexpr (kLanes<MAXD> > 1) {
    const unsigned row_lanes = ((1u << kLanes<MAXD>) - 1u) << ((threadIdx.x % 32) / kLanes<MAXD> * kLanes<MAXD>);
#pragma unroll
    for (int offset = kLanes<MAXD> / 2; offset > 0; offset /= 2) s += __shfl_xor_sync(row_lanes, s, offset);
  }
  return s;
}

template <int MAXD>
__global__ void __launch_bounds__(kTile * kLanes<MAXD>) flash_backward_dq_kernel(
    const float* q, const float* k, const float* v, const float* dout, const float* row_max, const float* row_sum,
    const float* delta, float* dq, Dims d, Mask mask) {
  constexpr int W = kColumnsPerLane<MAXD>;
  extern __shared__ float smem[];
  float* qs = smem;                       // own query rows [kTile][MAXD + 1]
  float* dos = qs + kTile * (MAXD + 1);   // own dO rows    [kTile][MAXD + 1]
  float* ks = dos + kTile * (MAXD + 1);   // key tile       [kTile][MAXD]
  float* vs = ks + kTile * MAXD;          // value tile     [kTile][MAXD]
  const std::int64_t b = blockIdx.z, h = blockIdx.y, i0 = static_cast<std::int64_t>(blockIdx.x) * kTile;
  const int t = threadIdx.x / kLanes<MAXD>, first = (threadIdx.x % kLanes<MAXD>) * W, D = static_cast<int>(d.D);
  const std::int64_t i = i0 + t, stride = d.H * d.D;
  const std::int64_t qoff = (b * d.Tq * d.H + h) * d.D, koff = (b * d.Tk * d.H + h) * d.D;
  load_tile<MAXD>(qs, MAXD + 1, q + qoff, stride, i0, d.Tq, D);
  load_tile<MAXD>(dos, MAXD + 1, dout + qoff, stride, i0, d.Tq, D);
  const std::int64_t stat = (b * d.H + h) * d.Tq + i;
  const bool live = i < d.Tq && row_sum[i < d.Tq ? stat : 0] > 0.f;
  const float m = live ? row_max[stat] : 0.f, inv_l = live ? 1.f / row_sum[stat] : 0.f;
  const float dl = live ? delta[stat] : 0.f;
  const std::int64_t nk = live ? mask.visible(i, d.Tk) : 0;
  const std::int64_t last_row = (i0 + kTile < d.Tq ? i0 + kTile : d.Tq) - 1;
  const std::int64_t block_nk = mask.visible(last_row, d.Tk);
  const float* my_q = qs + t * (MAXD + 1);
  const float* my_do = dos + t * (MAXD + 1);
  float acc[W];
#pragma unroll
  for (int c = 0; c < W; ++c) acc[c] = 0.f;
  for (std::int64_t j0 = 0; j0 < block_nk; j0 += kTile) {
    __syncthreads();
    load_tile<MAXD>(ks, MAXD, k + koff, stride, j0, d.Tk, D);
    load_tile<MAXD>(vs, MAXD, v + koff, stride, j0, d.Tk, D);
    __syncthreads();
    // The lanes of a row share nk, so they leave the loop together (the shuffles need every lane).
    for (int jj = 0; jj < kTile && j0 + jj < nk; ++jj) {
      const float* kj = ks + jj * MAXD;
      const float p = expf(d.scale * lane_dot<MAXD>(my_q, kj, first) - m) * inv_l;
      const float dp = lane_dot<MAXD>(my_do, vs + jj * MAXD, first);
      const float ds = d.scale * p * (dp - dl);
#pragma unroll
      for (int c = 0; c < W; ++c) acc[c] += ds * kj[first + c];
    }
  }
  if (i >= d.Tq) return;
  float* o = dq + ((b * d.Tq + i) * d.H + h) * d.D;
#pragma unroll
  for (int c = 0; c < W; ++c)
    if (first + c < D) o[first + c] = acc[c];
}

template <int MAXD>
__global__ void __launch_bounds__(kTile * kLanes<MAXD>) flash_backward_dkv_kernel(
    const float* q, const float* k, const float* v, const float* dout, const float* row_max, const float* row_sum,
    const float* delta, float* dk, float* dv, Dims d, Mask mask) {
  constexpr int W = kColumnsPerLane<MAXD>;
  extern __shared__ float smem[];
  float* ks = smem;                       // own key rows   [kTile][MAXD + 1]
  float* vs = ks + kTile * (MAXD + 1);    // own value rows [kTile][MAXD + 1]
  float* qs = vs + kTile * (MAXD + 1);    // query tile     [kTile][MAXD]
  float* dos = qs + kTile * MAXD;         // dO tile        [kTile][MAXD]
  float* stats = dos + kTile * MAXD;      // [3][kTile]: row max, 1 / row sum, delta
  const std::int64_t b = blockIdx.z, h = blockIdx.y, j0 = static_cast<std::int64_t>(blockIdx.x) * kTile;
  const int t = threadIdx.x / kLanes<MAXD>, first = (threadIdx.x % kLanes<MAXD>) * W, D = static_cast<int>(d.D);
  const std::int64_t j = j0 + t, stride = d.H * d.D;
  const std::int64_t qoff = (b * d.Tq * d.H + h) * d.D, koff = (b * d.Tk * d.H + h) * d.D;
  load_tile<MAXD>(ks, MAXD + 1, k + koff, stride, j0, d.Tk, D);
  load_tile<MAXD>(vs, MAXD + 1, v + koff, stride, j0, d.Tk, D);
  // The first query row that sees key j0 (visibility only grows with i).
  std::int64_t i_first = 0;
  if (mask.causal) {
    i_first = j0 + mask.k_start - mask.q_start;
    if (i_first < 0) i_first = 0;
  }
  const float* my_k = ks + t * (MAXD + 1);
  const float* my_v = vs + t * (MAXD + 1);
  float gk[W], gv[W];
#pragma unroll
  for (int c = 0; c < W; ++c) gk[c] = gv[c] = 0.f;
  for (std::int64_t i0 = i_first; i0 < d.Tq; i0 += kTile) {
    __syncthreads();
    load_tile<MAXD>(qs, MAXD, q + qoff, stride, i0, d.Tq, D);
    load_tile<MAXD>(dos, MAXD, dout + qoff, stride, i0, d.Tq, D);
    if (threadIdx.x < kTile) {
      const std::int64_t i = i0 + threadIdx.x, stat = (b * d.H + h) * d.Tq + i;
      const bool live = i < d.Tq && row_sum[i < d.Tq ? stat : 0] > 0.f;
      stats[threadIdx.x] = live ? row_max[stat] : 0.f;
      stats[kTile + threadIdx.x] = live ? 1.f / row_sum[stat] : 0.f;  // 0: the row saw no key
      stats[2 * kTile + threadIdx.x] = live ? delta[stat] : 0.f;
    }
    __syncthreads();
    if (j >= d.Tk) continue;  // every lane of the row: the shuffles below stay among live rows' lanes
    for (int ii = 0; ii < kTile; ++ii) {
      const std::int64_t i = i0 + ii;
      if (i >= d.Tq) break;
      const float inv_l = stats[kTile + ii];
      if (inv_l == 0.f || j >= mask.visible(i, d.Tk)) continue;
      const float* qi = qs + ii * MAXD;
      const float* doi = dos + ii * MAXD;
      const float p = expf(d.scale * lane_dot<MAXD>(qi, my_k, first) - stats[ii]) * inv_l;
      const float dp = lane_dot<MAXD>(doi, my_v, first);
      const float ds = d.scale * p * (dp - stats[2 * kTile + ii]);
#pragma unroll
      for (int c = 0; c < W; ++c) {
        gv[c] += p * doi[first + c];
        gk[c] += ds * qi[first + c];
      }
    }
  }
  if (j >= d.Tk) return;
  const std::int64_t o = ((b * d.Tk + j) * d.H + h) * d.D;
#pragma unroll
  for (int c = 0; c < W; ++c)
    if (first + c < D) {
      dk[o + first + c] = gk[c];
      dv[o + first + c] = gv[c];
    }
}

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
  if (D <= 16) fn(std::integral_constant<int, 16>{});
  else if (D <= 32) fn(std::integral_constant<int, 32>{});
  else if (D <= 64) fn(std::integral_constant<int, 64>{});
  else if (D <= 128) fn(std::integral_constant<int, 128>{});
  else throw Error(std::string(op) + ": the CUDA flash kernels support head dims up to 128, got " + std::to_string(D));
}

template <typename Kernel>
void allow_shared(Kernel kernel, std::size_t bytes) {
  DTP_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

dim3 query_grid(const Dims& d, std::int64_t T) {
  return dim3(static_cast<unsigned>((T + kTile - 1) / kTile), static_cast<unsigned>(d.H), static_cast<unsigned>(d.B));
}

void check_grid(const char* op, const Dims& d) {
  DTP_CHECK(d.H <= 65535 && d.B <= 65535, op, ": at most 65535 heads and batch entries on CUDA, got ",
            d.H, " and ", d.B);
}
}  // namespace

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& probs,
                       const ops::AttentionMask& mask, double scale) {
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
    gemm_strided_batched_f32(false, true, d.Tq, d.Tk, d.D, d.scale, ptr<float>(q) + b * d.Tq * ld, ld, d.D,
                             ptr<float>(k) + b * d.Tk * ld, ld, d.D, 0.f, ptr<float>(probs) + b * d.H * TqTk,
                             d.Tk, TqTk, d.H);
  }
  masked_softmax_kernel<<<static_cast<unsigned>(d.B * d.H * d.Tq), 128, 0, stream()>>>(ptr<float>(probs), d.Tq,
                                                                                      d.Tk, to_mask(mask));
  check_launch();
  for (std::int64_t b = 0; b < d.B; ++b) {
    // O_h = P_h V_h.
    gemm_strided_batched_f32(false, false, d.Tq, d.D, d.Tk, 1.f, ptr<float>(probs) + b * d.H * TqTk, d.Tk, TqTk,
                             ptr<float>(v) + b * d.Tk * ld, ld, d.D, 0.f, ptr<float>(out) + b * d.Tq * ld, ld,
                             d.D, d.H);
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
    gemm_strided_batched_f32(false, true, d.Tq, d.Tk, d.D, 1.f, dO, ld, d.D, ptr<float>(v) + b * d.Tk * ld, ld,
                             d.D, 0.f, dP, d.Tk, TqTk, d.H);
    gemm_strided_batched_f32(true, false, d.Tk, d.D, d.Tq, 1.f, P, d.Tk, TqTk, dO, ld, d.D, 0.f,
                             ptr<float>(dv) + b * d.Tk * ld, ld, d.D, d.H);
  }
  softmax_grad_kernel<<<static_cast<unsigned>(d.B * d.H * d.Tq), 128, 0, stream()>>>(ptr<float>(probs),
                                                                                    ptr<float>(dp), d.Tk, d.scale);
  check_launch();
  for (std::int64_t b = 0; b < d.B; ++b) {
    const float* dS = ptr<float>(dp) + b * d.H * TqTk;
    // dQ_h = dS_h K_h; dK_h = dS_h^T Q_h.
    gemm_strided_batched_f32(false, false, d.Tq, d.D, d.Tk, 1.f, dS, d.Tk, TqTk, ptr<float>(k) + b * d.Tk * ld, ld,
                             d.D, 0.f, ptr<float>(dq) + b * d.Tq * ld, ld, d.D, d.H);
    gemm_strided_batched_f32(true, false, d.Tk, d.D, d.Tq, 1.f, dS, d.Tk, TqTk, ptr<float>(q) + b * d.Tq * ld, ld,
                             d.D, 0.f, ptr<float>(dk) + b * d.Tk * ld, ld, d.D, d.H);
  }
}

void flash_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& row_max,
                             Tensor& row_sum, const ops::AttentionMask& mask, double scale,
                             std::int64_t block_size) {
  const char* op = "flash_attention_forward";
  const Dims d = check_qkv(op, q, k, v, scale);
  DTP_CHECK(block_size >= 1, op, ": block_size must be at least 1, got ", block_size);
  // block_size shapes the CPU loop; the GPU kernel uses its own tile (kTile):
  // the result is the same up to rounding.
  check_like(op, "out", out, q, q.shape());
  check_like(op, "row_max", row_max, q, Shape{d.B, d.H, d.Tq});
  check_like(op, "row_sum", row_sum, q, Shape{d.B, d.H, d.Tq});
  check_grid(op, d);
  if (d.B * d.H * d.Tq == 0) return;
  nn::use_device(q.device());
  with_head_dim(op, d.D, [&](auto maxd) {
    constexpr int MAXD = decltype(maxd)::value;
    const std::size_t bytes = sizeof(float) * (kTile * (MAXD + 1) + 2 * kTile * MAXD);
    allow_shared(flash_forward_kernel<MAXD>, bytes);
    flash_forward_kernel<MAXD><<<query_grid(d, d.Tq), kTile, bytes, stream()>>>(
        ptr<float>(q), ptr<float>(k), ptr<float>(v), ptr<float>(out), ptr<float>(row_max), ptr<float>(row_sum), d,
        to_mask(mask));
  });
  check_launch();
}

void flash_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                              const Tensor& row_max, const Tensor& row_sum, const Tensor& dout, Tensor& dq,
                              Tensor& dk, Tensor& dv, const ops::AttentionMask& mask, double scale) {
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
  Tensor delta = Tensor::empty({d.B, d.H, d.Tq}, DType::f32, q.device(), MemoryCategory::activations);
  row_dot_kernel<<<nn::grid_for(d.B * d.H * d.Tq), 256, 0, stream()>>>(ptr<float>(dout), ptr<float>(out),
                                                                      ptr<float>(delta), d);
  check_launch();
  with_head_dim(op, d.D, [&](auto maxd) {
    constexpr int MAXD = decltype(maxd)::value;
    const std::size_t dq_bytes = sizeof(float) * (2 * kTile * (MAXD + 1) + 2 * kTile * MAXD);
    allow_shared(flash_backward_dq_kernel<MAXD>, dq_bytes);
    flash_backward_dq_kernel<MAXD><<<query_grid(d, d.Tq), kTile * kLanes<MAXD>, dq_bytes, stream()>>>(
        ptr<float>(q), ptr<float>(k), ptr<float>(v), ptr<float>(dout), ptr<float>(row_max), ptr<float>(row_sum),
        ptr<float>(delta), ptr<float>(dq), d, to_mask(mask));
    check_launch();
    const std::size_t dkv_bytes = sizeof(float) * (2 * kTile * (MAXD + 1) + 2 * kTile * MAXD + 3 * kTile);
    allow_shared(flash_backward_dkv_kernel<MAXD>, dkv_bytes);
    flash_backward_dkv_kernel<MAXD><<<query_grid(d, d.Tk), kTile * kLanes<MAXD>, dkv_bytes, stream()>>>(
        ptr<float>(q), ptr<float>(k), ptr<float>(v), ptr<float>(dout), ptr<float>(row_max), ptr<float>(row_sum),
        ptr<float>(delta), ptr<float>(dk), ptr<float>(dv), d, to_mask(mask));
    check_launch();
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
  merge_kernel<<<nn::grid_for(rows), 256, 0, stream()>>>(ptr<float>(out), ptr<float>(row_max), ptr<float>(row_sum),
                                                        ptr<float>(other_out), ptr<float>(other_max),
                                                        ptr<float>(other_sum), d);
  check_launch();
}

}  // namespace dtp::cuda
