// Runs CUDA kernels on the CPU, so their index arithmetic, masking and
// synchronization are tested on machines without a GPU.
//
// The emulation: a launch runs its blocks one after another; a block's
// threads are real threads (std::thread), __syncthreads() is a barrier of the
// block, __syncwarp() a barrier of the warp, __shfl_xor_sync an exchange
// through the warp, and dynamic shared memory a buffer per block filled with
// NaNs (as f32 and as 16-bit values), so a read of shared memory nobody
// wrote shows up in the results.
//
// bf16 and f16 values are 16-bit structs that round to nearest even (the
// CPU ops' rounding, dtype.h), like cuda_bf16.h's and cuda_fp16.h's _rn.
//
// mma.sync (m16n8k16, bf16/f16 into f32) is emulated with the per-lane
// fragment layout the PTX ISA documents: the lanes' registers are gathered
// into whole matrices, multiplied, and scattered back the same way.
//
// WMMA (nvcuda::wmma) is emulated without the hardware's per-lane layout,
// which NVIDIA leaves unspecified: here every lane's fragment holds the whole
// tile. Kernels that use fragments only through load/store/fill/mma and
// uniform element-wise loops (what the API promises) behave the same. A
// store waits for the whole warp (the lanes execute it together) and is then
// written by lane 0 alone, so a lane that reads another lane's stored values
// without a __syncwarp() first reads stale data, as on a GPU.
// Alignment rules of load/store (32-byte pointers, ldm a multiple of 16
// bytes), the element type of each load, and that every fragment access
// stays in shared memory are checked; a violation fails the launch.
//
// A block in which no barrier completes for 60 s (threads waiting at
// different kinds of barrier) ends the test with a diagnosis naming each
// waiting thread and its barrier, instead of hanging it.
//
// What this does not check: speed, register pressure, the shared-memory
// limit of a real GPU, and races between warps that a barrier hides here
// but not there. tools/gpu-suite.sh runs the same kernels on a GPU.
#pragma once

#define DTP_CUDA_EMULATION 1

#include <array>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "dtp/dtype.h"  // the CPU's bf16 and f16 rounding (nearest even)

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __restrict__ __restrict

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  dim3() = default;
  dim3(unsigned x_, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

inline thread_local dim3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;

// A kernel's __shared__ arrays become function statics: blocks run one after
// another, so each block has them to itself (they are not refilled with
// NaNs between blocks, unlike dynamic shared memory).
#define __shared__ static

namespace dtp::emu {

/// How long a block may go without any barrier completing before its launch
/// ends the process with a diagnosis instead of hanging the test. Threads
/// that exit leave the barriers (as on a GPU); what hangs is threads waiting
/// at different kinds of barrier, e.g. some lanes of a warp at a warp-wide
/// step while the others are at __syncthreads. A test may shorten it.
inline std::chrono::milliseconds barrier_timeout{60000};

/// Counts completed barrier phases: the watchdog's sign of progress.
struct PhaseTick {
  std::atomic<std::uint64_t>* phases;
  void operator()() noexcept { phases->fetch_add(1, std::memory_order_relaxed); }
};
using Barrier = std::barrier<PhaseTick>;

/// What unwritten shared memory holds: a NaN read as an f32 and as each of
/// its 16-bit halves (bf16 0x7fc0 and f16 0x7fc0 are NaNs too).
inline float unwritten() {
  const std::uint32_t bits = 0x7fc07fc0u;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

/// The state one running block shares among its threads.
struct Block {
  explicit Block(unsigned threads, std::size_t shared_bytes)
      : barrier(threads, PhaseTick{&phases}),
        waiting_at(threads),
        storage(shared_bytes / sizeof(float) + 64, unwritten()),
        shared_bytes(shared_bytes) {
    // 128-byte alignment, like extern __shared__ __align__(128) on a GPU.
    const auto addr = reinterpret_cast<std::uintptr_t>(storage.data());
    shared = storage.data() + (128 - addr % 128) % 128 / sizeof(float);
    const unsigned warps = (threads + 31) / 32;
    for (unsigned w = 0; w < warps; ++w) {
      const unsigned lanes = w + 1 < warps ? 32 : threads - 32 * w;
      warp_barriers.push_back(std::make_unique<Barrier>(lanes, PhaseTick{&phases}));
      exchange.emplace_back();
      mma.emplace_back();
    }
  }
  std::atomic<std::uint64_t> phases{0};  // before the barriers, which count into it
  Barrier barrier;
  std::vector<std::unique_ptr<Barrier>> warp_barriers;
  std::vector<std::atomic<const char*>> waiting_at;  // per thread: the barrier it waits at, or null
  std::atomic<unsigned> finished{0};
  std::mutex finished_mutex;
  std::condition_variable finished_changed;
  std::vector<std::array<std::uint64_t, 32>> exchange;  // one slot per lane, for shuffles
  struct MmaRegisters {
    std::uint32_t a[32][4], b[32][2];
    float c[32][4];
  };
  std::vector<MmaRegisters> mma;  // one set per warp, for mma.sync
  std::vector<float> storage;     // dynamic shared memory, NaN until written
  std::size_t shared_bytes;
  float* shared;  // its 128-byte aligned start
  std::mutex error_mutex;
  std::string error;
};

inline thread_local Block* current = nullptr;

// A thread's place in its block, x fastest (as on a GPU): warps are 32
// consecutive places, whatever the block's shape.
inline thread_local unsigned linear_thread = 0;
inline unsigned warp_of_thread() { return linear_thread / 32; }
inline unsigned lane() { return linear_thread % 32; }

/// Records the first rule a kernel broke; launch() throws it.
inline void fail(const std::string& what) {
  std::lock_guard<std::mutex> lock(current->error_mutex);
  if (current->error.empty()) current->error = what;
}

inline void* dynamic_shared() { return current->shared; }

/// Waits at @p barrier, noting where for the watchdog's diagnosis.
inline void wait_at(Barrier& barrier, const char* where) {
  current->waiting_at[linear_thread].store(where, std::memory_order_relaxed);
  barrier.arrive_and_wait();
  current->waiting_at[linear_thread].store(nullptr, std::memory_order_relaxed);
}

/// __syncwarp(), and the warp-wide steps of shuffles and mma.sync.
inline void sync_warp() { wait_at(*current->warp_barriers[warp_of_thread()], "a warp-wide step"); }

/// Waits for the block's threads; ends the process with what each thread
/// waits at if no barrier completes for barrier_timeout (a hang otherwise).
inline void watch(Block& state, unsigned threads, dim3 block_index) {
  std::unique_lock<std::mutex> lock(state.finished_mutex);
  std::uint64_t seen = state.phases.load();
  auto last_progress = std::chrono::steady_clock::now();
  while (state.finished.load() < threads) {
    state.finished_changed.wait_for(lock, std::chrono::milliseconds(50));
    if (state.phases.load() != seen) {
      seen = state.phases.load();
      last_progress = std::chrono::steady_clock::now();
    } else if (state.finished.load() < threads &&
               std::chrono::steady_clock::now() - last_progress > barrier_timeout) {
      std::fprintf(stderr,
                   "CUDA emulator: block (%u, %u, %u): no barrier completed for %lld ms; threads "
                   "wait at different "
                   "kinds of barrier (a __syncwarp, shuffle or mma.sync that only some lanes of a "
                   "warp reach, while "
                   "the others are at __syncthreads):\n",
                   block_index.x, block_index.y, block_index.z,
                   static_cast<long long>(barrier_timeout.count()));
      for (unsigned t = 0; t < threads; ++t)
        if (const char* where = state.waiting_at[t].load())
          std::fprintf(stderr, "  thread %u waits at %s\n", t, where);
      std::abort();
    }
  }
}

template <typename T>
T shfl_xor(T value, int lane_mask) {
  static_assert(sizeof(T) <= sizeof(std::uint64_t));
  auto& slots = current->exchange[warp_of_thread()];
  std::uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  slots[lane()] = bits;
  sync_warp();
  const std::uint64_t other = slots[lane() ^ static_cast<unsigned>(lane_mask)];
  sync_warp();  // nobody overwrites a slot before every lane read it
  T out;
  std::memcpy(&out, &other, sizeof(T));
  return out;
}

/// The threads that play a block's GPU threads, started once and reused by
/// every block and launch: starting a thread costs about 0.3 ms on the
/// 2-core machines this runs on, so a fresh set per block of 256 threads
/// would take 77 ms. start(n, job) has workers 0..n-1 each call job(index) at the
/// same time; wait() returns once all of them have returned from it.
class WorkerPool {
 public:
  static WorkerPool& instance() {
    static WorkerPool pool;
    return pool;
  }
  ~WorkerPool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    start_.notify_all();
    for (std::thread& t : workers_) t.join();
  }
  void start(unsigned n, const std::function<void(unsigned)>& job) {
    std::lock_guard<std::mutex> lock(mutex_);
    while (workers_.size() < n) {
      const unsigned index = static_cast<unsigned>(workers_.size());
      workers_.emplace_back([this, index] { loop(index); });
    }
    job_ = &job;
    active_ = n;
    returned_ = 0;
    ++generation_;
    start_.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return returned_ == active_; });
    job_ = nullptr;
  }

 private:
  void loop(unsigned index) {
    std::uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      start_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      if (index >= active_) continue;
      const std::function<void(unsigned)>* job = job_;
      lock.unlock();
      (*job)(index);
      lock.lock();
      if (++returned_ == active_) done_.notify_one();
    }
  }
  std::mutex mutex_;
  std::condition_variable start_, done_;
  std::vector<std::thread> workers_;
  const std::function<void(unsigned)>* job_ = nullptr;
  std::uint64_t generation_ = 0;
  unsigned active_ = 0, returned_ = 0;
  bool stop_ = false;
};

/// Runs kernel() as a block of block.x * block.y * block.z threads for every block of grid.
inline void launch(dim3 grid, dim3 block, std::size_t shared_bytes,
                   const std::function<void()>& kernel) {
  const unsigned threads_per_block = block.x * block.y * block.z;
  if (threads_per_block == 0 || threads_per_block > 1024)
    throw std::invalid_argument("a block of " + std::to_string(threads_per_block) +
                                " threads (CUDA allows 1 to 1024)");
  gridDim = grid;
  blockDim = block;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        Block state(threads_per_block, shared_bytes);
        const std::function<void(unsigned)> thread_of_block = [&](unsigned t) {
          linear_thread = t;
          threadIdx = dim3(t % block.x, t / block.x % block.y, t / (block.x * block.y));
          blockIdx = dim3(x, y, z);
          current = &state;
          kernel();
          // A thread that exits no longer holds up the barriers (as on a GPU).
          state.warp_barriers[warp_of_thread()]->arrive_and_drop();
          state.barrier.arrive_and_drop();
          current = nullptr;
          std::lock_guard<std::mutex> lock(state.finished_mutex);
          state.finished.fetch_add(1);
          state.finished_changed.notify_one();
        };
        WorkerPool::instance().start(threads_per_block, thread_of_block);
        watch(state, threads_per_block, dim3(x, y, z));
        WorkerPool::instance().wait();
        if (!state.error.empty())
          throw std::runtime_error("block (" + std::to_string(x) + ", " + std::to_string(y) + ", " +
                                   std::to_string(z) + "): " + state.error);
      }
}

/// Fails (and returns false) unless [p, p + bytes) lies inside the block's shared memory.
inline bool check_in_shared(const void* p, std::size_t bytes, const char* what) {
  const auto base = reinterpret_cast<std::uintptr_t>(current->shared),
             c = reinterpret_cast<std::uintptr_t>(p);
  const std::size_t size = current->shared_bytes;
  if (c >= base && c + bytes <= base + size) return true;
  fail(std::string(what) + " reaches outside the block's " + std::to_string(size) +
       " bytes of shared memory");
  return false;
}

}  // namespace dtp::emu

// cuda_bf16.h and cuda_fp16.h, the subset the kernels use: 16-bit storage
// that converts to float, and rounding to nearest even from float.
struct __nv_bfloat16 {
  std::uint16_t bits;
  operator float() const { return dtp::bf16_to_float(dtp::bf16{bits}); }
};
struct __half {
  std::uint16_t bits;
  operator float() const { return dtp::f16_to_float(dtp::f16{bits}); }
};
inline __nv_bfloat16 __float2bfloat16_rn(float x) { return {dtp::float_to_bf16(x).bits}; }
inline __half __float2half_rn(float x) { return {dtp::float_to_f16(x).bits}; }
inline std::uint16_t __bfloat16_as_ushort(__nv_bfloat16 x) { return x.bits; }
inline std::uint16_t __half_as_ushort(__half x) { return x.bits; }

namespace dtp::emu {

/// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}: d += a b for the warp.
/// Every lane deposits its registers; each rebuilds the whole A (16 x 16),
/// B (16 x 8) and C (16 x 8) by the PTX ISA's fragment layout (lane L: row
/// g = L / 4 and g + 8, columns 2t and 2t + 1 with t = L % 4, low half first)
/// and keeps its own elements of D.
template <typename T>
void mma_m16n8k16(float (&d)[4], const std::uint32_t (&a)[4], const std::uint32_t (&b)[2]) {
  Block::MmaRegisters& x = current->mma[warp_of_thread()];
  const unsigned me = lane();
  std::memcpy(x.a[me], a, sizeof a);
  std::memcpy(x.b[me], b, sizeof b);
  std::memcpy(x.c[me], d, sizeof d);
  sync_warp();
  auto value = [](std::uint32_t reg, int j) {
    const T half{static_cast<std::uint16_t>(j == 0 ? reg & 0xffffu : reg >> 16)};
    return static_cast<float>(half);
  };
  float A[16][16], B[16][8], C[16][8];
  for (int L = 0; L < 32; ++L) {
    const int g = L / 4, t = L % 4;
    for (int j = 0; j < 2; ++j) {
      A[g][2 * t + j] = value(x.a[L][0], j);
      A[g + 8][2 * t + j] = value(x.a[L][1], j);
      A[g][8 + 2 * t + j] = value(x.a[L][2], j);
      A[g + 8][8 + 2 * t + j] = value(x.a[L][3], j);
      B[2 * t + j][g] = value(x.b[L][0], j);
      B[8 + 2 * t + j][g] = value(x.b[L][1], j);
      C[g][2 * t + j] = x.c[L][j];
      C[g + 8][2 * t + j] = x.c[L][2 + j];
    }
  }
  sync_warp();  // every lane has read the deposits before any lane's next mma overwrites them
  const int g = static_cast<int>(me) / 4, t = static_cast<int>(me) % 4;
  for (int h = 0; h < 2; ++h)
    for (int j = 0; j < 2; ++j) {
      const int row = g + 8 * h, col = 2 * t + j;
      float sum = C[row][col];
      for (int k = 0; k < 16; ++k) sum += A[row][k] * B[k][col];
      d[2 * h + j] = sum;
    }
}

}  // namespace dtp::emu

// Math the kernels call that the host's <cmath> names differently.
inline float rsqrtf(float x) { return 1.f / std::sqrt(x); }
using std::isfinite;

inline void __syncthreads() { dtp::emu::wait_at(dtp::emu::current->barrier, "__syncthreads()"); }
inline void __syncwarp(unsigned = 0xffffffffu) { dtp::emu::sync_warp(); }
template <typename T>
T __shfl_xor_sync(unsigned mask, T value, int lane_mask) {
  if (mask != 0xffffffffu)
    dtp::emu::fail("__shfl_xor_sync: the emulator supports full-warp masks only");
  return dtp::emu::shfl_xor(value, lane_mask);
}

#define DTP_DYNAMIC_SHARED(type, name) type* name = static_cast<type*>(::dtp::emu::dynamic_shared())

// --- nvcuda::wmma, the subset the kernels use -----------------------------------
namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
namespace precision {
struct tf32 {};
}  // namespace precision
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
  static constexpr int rows = std::is_same_v<Use, matrix_b> ? K : M;
  static constexpr int cols = std::is_same_v<Use, matrix_a> ? K : N;
  static constexpr int num_elements = rows * cols;  // the whole tile in every lane (see the top)
  float x[rows * cols];
};

/// Rounds to TF32 (10 mantissa bits), to nearest with ties away from zero.
inline float __float_to_tf32(float in) {
  if (!std::isfinite(in)) return in;
  std::uint32_t bits;
  std::memcpy(&bits, &in, 4);
  bits = (bits + 0x1000u) & ~0x1fffu;
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

namespace detail {
// The alignment rules of load/store_matrix_sync: a 32-byte aligned pointer,
// ldm a multiple of 16 bytes; and here, the whole span inside shared memory.
// Returns false for a span outside shared memory: the access must not happen.
template <typename E>
bool check_pointer(const E* p, unsigned ldm, std::size_t bytes, const char* op) {
  if (reinterpret_cast<std::uintptr_t>(p) % 32 != 0)
    dtp::emu::fail(std::string(op) + ": pointer not 32-byte aligned");
  if (ldm * sizeof(E) % 16 != 0)
    dtp::emu::fail(std::string(op) + ": ldm " + std::to_string(ldm) +
                   " is not a multiple of 16 bytes");
  return dtp::emu::check_in_shared(p, bytes, op);
}
template <typename Frag, typename E>
std::size_t span_bytes(unsigned ldm, bool row_major) {
  const int major = row_major ? Frag::rows : Frag::cols,
            minor = row_major ? Frag::cols : Frag::rows;
  return sizeof(E) * ((major - 1) * static_cast<std::size_t>(ldm) + minor);
}
template <typename Frag, typename E>
void load(Frag& f, const E* p, unsigned ldm, bool row_major) {
  if (!check_pointer(p, ldm, span_bytes<Frag, E>(ldm, row_major), "load_matrix_sync")) {
    for (float& e : f.x) e = std::nanf("");
    return;
  }
  for (int r = 0; r < Frag::rows; ++r)
    for (int c = 0; c < Frag::cols; ++c)
      f.x[r * Frag::cols + c] = static_cast<float>(row_major ? p[r * ldm + c] : p[c * ldm + r]);
}
// The element type a fragment of precision T loads: float for tf32, T otherwise.
template <typename T>
using Element = std::conditional_t<std::is_same_v<T, precision::tf32>, float, T>;
}  // namespace detail

template <typename Use, int M, int N, int K, typename T, typename E>
void load_matrix_sync(fragment<Use, M, N, K, T, row_major>& f, const E* p, unsigned ldm) {
  static_assert(std::is_same_v<E, detail::Element<T>>,
                "the pointer's type must be the fragment's element type");
  detail::load(f, p, ldm, true);
}
template <typename Use, int M, int N, int K, typename T, typename E>
void load_matrix_sync(fragment<Use, M, N, K, T, col_major>& f, const E* p, unsigned ldm) {
  static_assert(std::is_same_v<E, detail::Element<T>>,
                "the pointer's type must be the fragment's element type");
  detail::load(f, p, ldm, false);
}
template <int M, int N, int K>
void load_matrix_sync(fragment<accumulator, M, N, K, float>& f, const float* p, unsigned ldm,
                      layout_t layout) {
  detail::load(f, p, ldm, layout == mem_row_major);
}
template <int M, int N, int K>
void store_matrix_sync(float* p, const fragment<accumulator, M, N, K, float>& f, unsigned ldm,
                       layout_t layout) {
  using Frag = fragment<accumulator, M, N, K, float>;
  const bool row = layout == mem_row_major;
  const bool inside =
      detail::check_pointer(p, ldm, detail::span_bytes<Frag, float>(ldm, row), "store_matrix_sync");
  // The warp executes a store together, as on a GPU: no lane is still loading
  // the tile (an accumulator's load and store give each lane the same
  // elements there). Then lane 0 alone writes: readers in other lanes still
  // need a __syncwarp().
  dtp::emu::sync_warp();
  if (dtp::emu::lane() != 0 || !inside) return;
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < N; ++c) (row ? p[r * ldm + c] : p[c * ldm + r]) = f.x[r * N + c];
}
template <typename Use, int M, int N, int K, typename T, typename L>
void fill_fragment(fragment<Use, M, N, K, T, L>& f, float value) {
  for (float& e : f.x) e = value;
}
/// d = a b + c with f32 accumulation in k order (the hardware's order is unspecified).
template <int M, int N, int K, typename T, typename LA, typename LB>
void mma_sync(fragment<accumulator, M, N, K, float>& d, const fragment<matrix_a, M, N, K, T, LA>& a,
              const fragment<matrix_b, M, N, K, T, LB>& b,
              const fragment<accumulator, M, N, K, float>& c) {
  float out[M * N];
  for (int r = 0; r < M; ++r)
    for (int n = 0; n < N; ++n) {
      float s = c.x[r * N + n];
      for (int k = 0; k < K; ++k) s += a.x[r * K + k] * b.x[k * N + n];
      out[r * N + n] = s;
    }
  std::memcpy(d.x, out, sizeof out);
}

}  // namespace nvcuda::wmma
