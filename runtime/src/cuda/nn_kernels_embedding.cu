// Embedding lookup and learned positions. The backward of the lookup adds
// rows of dout into the table; several tokens may share an id. Atomics would
// add them in whatever order the threads run, different in the last bits
// from run to run, so the positions are first sorted by id (a stable radix
// sort: equal ids keep their position order) and one thread per (id,
// column) sums its rows in position order, in f32, and stores once. The
// positions' backward sums over the batch in a fixed order too (one thread
// per (position, channel)). Both give the same bits on every run.
#include <cub/device/device_radix_sort.cuh>

#include <climits>

#include "cuda/nn_kernels_common.cuh"

namespace dtp::cuda {

namespace {
using nn::check_launch;
using nn::grid_for;
using nn::ptr;
using nn::stream;

#define DTP_GRID_STRIDE(i, n)                                                                      \
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)

__global__ void first_bad_id_kernel(const std::int32_t* ids, std::int64_t n, std::int64_t V,
                                    int* first_bad) {
  DTP_GRID_STRIDE(i, n) {
    if (ids[i] < 0 || ids[i] >= V)
      atomicMin(first_bad, static_cast<int>(i < INT_MAX ? i : INT_MAX - 1));
  }
}

template <typename T>
__global__ void gather_kernel(const std::int32_t* ids, const T* table, T* out, std::int64_t n,
                              std::int64_t C) {
  DTP_GRID_STRIDE(i, n * C) {
    const std::int64_t row = i / C, c = i - row * C;
    out[i] = table[static_cast<std::int64_t>(ids[row]) * C + c];
  }
}

__global__ void iota_kernel(std::int32_t* out, std::int64_t n) {
  DTP_GRID_STRIDE(i, n) out[i] = static_cast<std::int32_t>(i);
}

// Thread (k, c) for the first of a run of equal sorted ids: table row
// id - first_id gets the run's rows of dout (their positions in order) added
// in column c. Ids outside [first_id, first_id + rows) are another table's.
template <typename T>
__global__ void add_runs_kernel(const std::int32_t* sorted_ids, const std::int32_t* positions,
                                const T* dout, T* table, std::int64_t n, std::int64_t C,
                                std::int64_t first_id, std::int64_t rows) {
  DTP_GRID_STRIDE(i, n * C) {
    const std::int64_t k = i / C, c = i - k * C;
    const std::int32_t id = sorted_ids[k];
    if (k > 0 && sorted_ids[k - 1] == id) continue;  // not the first of its run
    const std::int64_t local = static_cast<std::int64_t>(id) - first_id;
    if (local < 0 || local >= rows) continue;
    float sum = 0;
    for (std::int64_t j = k; j < n && sorted_ids[j] == id; ++j)
      sum += load(dout, static_cast<std::int64_t>(positions[j]) * C + c);
    store(table, local * C + c, load(table, local * C + c) + sum);
  }
}

template <typename T>
__global__ void add_positions_kernel(T* x, const T* pos, std::int64_t n, std::int64_t TC) {
  DTP_GRID_STRIDE(i, n) store(x, i, load(x, i) + load(pos, i % TC));
}

template <typename T>
__global__ void positions_backward_kernel(const T* dx, T* dpos, std::int64_t B, std::int64_t TC) {
  DTP_GRID_STRIDE(i, TC) {
    float acc = 0;
    for (std::int64_t b = 0; b < B; ++b) acc += load(dx, b * TC + i);
    store(dpos, i, load(dpos, i) + acc);
  }
}

void check_ids(const char* op, const Tensor& ids, Device device) {
  nn::check_same_gpu(op, "ids", ids, device);
  DTP_CHECK(ids.dtype() == DType::i32, op, ": ids must be i32 token ids, got ", ids.describe());
}

void check_positions(const char* op, const Tensor& x, const char* table_name, const Tensor& table,
                     std::int64_t start) {
  nn::check_float(op, "x", x, x.device());
  nn::check_float(op, table_name, table, x.device());
  detail::check_dtype_is(op, table_name, table, x.dtype());
  DTP_CHECK(x.ndim() == 3, op, ": x must be [B, T, C], got ", x.describe());
  DTP_CHECK(table.ndim() == 2 && table.size(1) == x.size(2), op, ": ", table_name, " must be [P, ",
            x.size(2), "], got ", table.describe());
  DTP_CHECK(start >= 0 && start + x.size(1) <= table.size(0), op, ": positions [", start, ", ",
            start + x.size(1), ") do not fit a table of ", table.size(0),
            " positions (the model's context length)");
}
}  // namespace

void nn::add_rows_by_id(const Tensor& ids, const Tensor& dout, std::int64_t first_id,
                        Tensor& table) {
  const std::int64_t n = ids.numel(), C = table.size(1);
  if (n == 0 || C == 0) return;
  DTP_CHECK(n <= INT32_MAX, "embedding backward: ", n,
            " ids do not fit the sort's 32-bit positions");
  const Device device = table.device();
  auto i32 = [&](std::int64_t count) {
    return Tensor::empty({count}, DType::i32, device, MemoryCategory::other);
  };
  Tensor positions = i32(n), sorted_ids = i32(n), sorted_positions = i32(n);
  iota_kernel<<<grid_for(n), 256, 0, stream()>>>(ptr<std::int32_t>(positions), n);
  check_launch();
  std::size_t scratch_bytes = 0;
  DTP_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      nullptr, scratch_bytes, ptr<std::int32_t>(ids), ptr<std::int32_t>(sorted_ids),
      ptr<std::int32_t>(positions), ptr<std::int32_t>(sorted_positions), n, 0, 32, stream()));
  Tensor scratch = i32(static_cast<std::int64_t>((scratch_bytes + 3) / 4) + 1);
  DTP_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      scratch.raw(), scratch_bytes, ptr<std::int32_t>(ids), ptr<std::int32_t>(sorted_ids),
      ptr<std::int32_t>(positions), ptr<std::int32_t>(sorted_positions), n, 0, 32, stream()));
  nn::with_float(table.dtype(), [&](auto zero) {
    using T = decltype(zero);
    add_runs_kernel<<<grid_for(n * C), 256, 0, stream()>>>(
        ptr<std::int32_t>(sorted_ids), ptr<std::int32_t>(sorted_positions), ptr<T>(dout),
        ptr<T>(table), n, C, first_id, table.size(0));
  });
  check_launch();
}

/// Fails naming the first id outside [0, V) (waits for the stream).
void check_token_ids(const char* op, const char* what, const Tensor& ids, std::int64_t V) {
  const std::int64_t n = ids.numel();
  if (n == 0) return;
  Tensor first_bad = Tensor::full({1}, INT_MAX, DType::i32, ids.device());
  first_bad_id_kernel<<<grid_for(n), 256, 0, stream()>>>(ptr<std::int32_t>(ids), n, V,
                                                         ptr<int>(first_bad));
  check_launch();
  const auto bad = static_cast<std::int64_t>(first_bad.item(0));
  DTP_CHECK(bad == INT_MAX, op, ": ", what, " ", static_cast<std::int64_t>(ids.item(bad)),
            " at position ", bad, " is outside the vocabulary [0, ", V, ")");
}

void embedding_forward(const Tensor& ids, const Tensor& table, Tensor& out) {
  const char* op = "embedding_forward";
  nn::check_float(op, "table", table, table.device());
  check_ids(op, ids, table.device());
  nn::check_float(op, "out", out, table.device());
  detail::check_dtype_is(op, "out", out, table.dtype());
  DTP_CHECK(table.ndim() == 2, op, ": table must be [V, C], got ", table.describe());
  const std::int64_t V = table.size(0), C = table.size(1), N = ids.numel();
  DTP_CHECK(out.numel() == N * C && detail::last_dim(op, "out", out) == C, op,
            ": out must be [..., ", C, "] with ", N, " rows (one per id), got ", out.describe());
  if (N == 0 || C == 0) return;
  nn::use_device(table.device());
  check_token_ids(op, "token id", ids, V);
  nn::with_float(table.dtype(), [&](auto zero) {
    using T = decltype(zero);
    gather_kernel<<<grid_for(N * C), 256, 0, stream()>>>(ptr<std::int32_t>(ids), ptr<T>(table),
                                                         ptr<T>(out), N, C);
  });
  check_launch();
}

void embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dtable) {
  const char* op = "embedding_backward";
  nn::check_float(op, "dtable", dtable, dtable.device());
  check_ids(op, ids, dtable.device());
  nn::check_float(op, "dout", dout, dtable.device());
  detail::check_dtype_is(op, "dout", dout, dtable.dtype());
  DTP_CHECK(dtable.ndim() == 2, op, ": dtable must be [V, C], got ", dtable.describe());
  const std::int64_t V = dtable.size(0), C = dtable.size(1), N = ids.numel();
  DTP_CHECK(dout.numel() == N * C && detail::last_dim(op, "dout", dout) == C, op,
            ": dout must be [..., ", C, "] with ", N, " rows (one per id), got ", dout.describe());
  if (N == 0 || C == 0) return;
  nn::use_device(dtable.device());
  nn::add_rows_by_id(ids, dout, 0,
                     dtable);  // ids outside [0, V) were rejected by the forward, and are skipped
}

void add_positions(Tensor& x, const Tensor& positions, std::int64_t start) {
  check_positions("add_positions", x, "positions", positions, start);
  const std::int64_t C = x.size(2), TC = x.size(1) * C, n = x.numel();
  if (n == 0) return;
  nn::use_device(x.device());
  nn::with_float(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    add_positions_kernel<<<grid_for(n), 256, 0, stream()>>>(ptr<T>(x),
                                                            ptr<T>(positions) + start * C, n, TC);
  });
  check_launch();
}

void positions_backward(const Tensor& dx, Tensor& dpositions, std::int64_t start) {
  check_positions("positions_backward", dx, "dpositions", dpositions, start);
  const std::int64_t B = dx.size(0), C = dx.size(2), TC = dx.size(1) * C;
  if (TC == 0) return;
  nn::use_device(dx.device());
  nn::with_float(dx.dtype(), [&](auto zero) {
    using T = decltype(zero);
    positions_backward_kernel<<<grid_for(TC), 256, 0, stream()>>>(
        ptr<T>(dx), ptr<T>(dpositions) + start * C, B, TC);
  });
  check_launch();
}

}  // namespace dtp::cuda
