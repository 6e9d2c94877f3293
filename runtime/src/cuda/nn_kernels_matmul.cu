// Matrix products through cuBLAS. cuBLAS is column-major; a row-major matrix
// is the column-major view of its transpose, so the row-major product
// C = op(A) op(B) is computed as the column-major C^T = op(B)^T op(A)^T:
// the operands swap places and keep their own transpose flags.
//
// f32 uses TF32 tensor cores (CUBLAS_COMPUTE_32F_FAST_TF32: inputs rounded to
// 10 mantissa bits, products accumulated in f32), unless DTP_TF32=0. bf16 and
// f16 use their tensor cores with f32 accumulation (CUBLAS_COMPUTE_32F), and
// cuBLAS rounds each output once when it stores it: the contract of the CPU
// ops on 16-bit tensors.
// One cuBLAS handle per thread and GPU, created on first use and pointed at
// the rank's current stream before every call; destroyed before that stream
// is (a handle may free its workspace on its stream), or when the thread ends.
// cuBLAS itself is loaded on the first product (cublas_library.h says why).
#include <cublas_v2.h>

#include <atomic>
#include <climits>
#include <cstdlib>
#include <map>

#include "cuda/cublas_library.h"
#include "cuda/nn_kernels_common.cuh"

namespace dtp::cuda {

namespace {

const char* cublas_status_name(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    default:
      return "unknown cuBLAS status";
  }
}

#define DTP_CUBLAS_CHECK(call)                                                                     \
  do {                                                                                             \
    cublasStatus_t dtp_cublas_status = (call);                                                     \
    if (dtp_cublas_status != CUBLAS_STATUS_SUCCESS)                                                \
      throw ::dtp::Error(std::string("cuBLAS error: ") + #call + " failed at " + __FILE__ + ":" +  \
                         std::to_string(__LINE__) + ": " + cublas_status_name(dtp_cublas_status)); \
  } while (0)

bool tf32_from_environment() {
  const char* value = std::getenv("DTP_TF32");
  return value == nullptr || std::string(value) != "0";
}

std::atomic<bool>& tf32_flag() {
  static std::atomic<bool> flag{tf32_from_environment()};
  return flag;
}

// The calling thread's handles, one per GPU, with the stream each was last
// pointed at.
struct Handles {
  struct Bound {
    cublasHandle_t handle = nullptr;
    cudaStream_t stream = nullptr;
  };
  std::map<int, Bound> by_device;
  ~Handles() {
    for (auto& entry : by_device) cublas_library().destroy(entry.second.handle);
  }
};
thread_local Handles handles;

// Called by destroy_stream() on this thread: the handles bound to that stream go first.
void release_handles_on(void* stream) {
  for (auto it = handles.by_device.begin(); it != handles.by_device.end();) {
    if (it->second.stream != static_cast<cudaStream_t>(stream)) {
      ++it;
      continue;
    }
    cublas_library().destroy(it->second.handle);
    it = handles.by_device.erase(it);
  }
}

cublasHandle_t handle_for_current_stream() {
  int device = 0;
  DTP_CUDA_CHECK(cudaGetDevice(&device));
  Handles::Bound& bound = handles.by_device[device];
  if (bound.handle == nullptr) {
    DTP_CUBLAS_CHECK(cublas_library().create(&bound.handle));
    on_stream_destroy(release_handles_on);
  }
  bound.stream = nn::stream();
  DTP_CUBLAS_CHECK(cublas_library().set_stream(bound.handle, bound.stream));
  return bound.handle;
}

cublasComputeType_t compute_type_f32() {
  return tf32_enabled() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

int as_int(const char* what, std::int64_t v) {
  DTP_CHECK(v >= 0 && v <= INT_MAX, "matmul: ", what, " = ", v, " does not fit cuBLAS's int");
  return static_cast<int>(v);
}

}  // namespace

bool tf32_enabled() { return tf32_flag().load(); }
void set_tf32_enabled(bool enabled) { tf32_flag().store(enabled); }

namespace {

// The row-major C = alpha op(A) op(B) + beta C of @p batch matrices of one
// element type, through cuBLAS.
void gemm_strided_batched(cudaDataType_t type, cublasComputeType_t compute, bool transpose_a,
                          bool transpose_b, std::int64_t M, std::int64_t N, std::int64_t K,
                          float alpha, const void* A, std::int64_t lda, std::int64_t stride_a,
                          const void* B, std::int64_t ldb, std::int64_t stride_b, float beta,
                          void* C, std::int64_t ldc, std::int64_t stride_c, std::int64_t batch) {
  if (M == 0 || N == 0 || batch == 0) return;
  cublasHandle_t handle = handle_for_current_stream();
  // Column-major: C^T [N, M] = op(B)^T [N, K] op(A)^T [K, M].
  DTP_CUBLAS_CHECK(cublas_library().gemm_strided_batched_ex(
      handle, transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N, transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N,
      as_int("N", N), as_int("M", M), as_int("K", K), &alpha, B, type, as_int("ldb", ldb), stride_b,
      A, type, as_int("lda", lda), stride_a, &beta, C, type, as_int("ldc", ldc), stride_c,
      as_int("batch", batch), compute, CUBLAS_GEMM_DEFAULT));
}

}  // namespace

void gemm_strided_batched_f32(bool transpose_a, bool transpose_b, std::int64_t M, std::int64_t N,
                              std::int64_t K, float alpha, const float* A, std::int64_t lda,
                              std::int64_t stride_a, const float* B, std::int64_t ldb,
                              std::int64_t stride_b, float beta, float* C, std::int64_t ldc,
                              std::int64_t stride_c, std::int64_t batch) {
  gemm_strided_batched(CUDA_R_32F, compute_type_f32(), transpose_a, transpose_b, M, N, K, alpha, A,
                       lda, stride_a, B, ldb, stride_b, beta, C, ldc, stride_c, batch);
}

void matmul(const Tensor& a, const Tensor& b, Tensor& out, bool transpose_a, bool transpose_b,
            double alpha, double beta) {
  const char* op = "matmul";
  nn::check_float(op, "a", a, a.device());
  nn::check_float(op, "b", b, a.device());
  nn::check_float(op, "out", out, a.device());
  detail::check_dtype_is(op, "b", b, a.dtype());
  detail::check_dtype_is(op, "out", out, a.dtype());
  const std::int64_t a_cols = detail::last_dim(op, "a", a), b_cols = detail::last_dim(op, "b", b),
                     o_cols = detail::last_dim(op, "out", out);
  const std::int64_t a_rows = nn::rows_of(a, a_cols), b_rows = nn::rows_of(b, b_cols),
                     o_rows = nn::rows_of(out, o_cols);
  const std::int64_t M = transpose_a ? a_cols : a_rows, K = transpose_a ? a_rows : a_cols;
  const std::int64_t Kb = transpose_b ? b_cols : b_rows, N = transpose_b ? b_rows : b_cols;
  DTP_CHECK(K == Kb, "matmul: inner dimensions differ: op(a) is [", M, ", ", K, "] (a is ",
            a.describe(), transpose_a ? ", transposed" : "", ") but op(b) is [", Kb, ", ", N,
            "] (b is ", b.describe(), transpose_b ? ", transposed" : "", ")");
  DTP_CHECK(o_rows == M && o_cols == N, "matmul: out must be a [", M, ", ", N,
            "] matrix (rows = all leading dims, columns = last dim), got ", out.describe());
  DTP_CHECK(!out.shares_storage_with(a) && !out.shares_storage_with(b),
            "matmul: out must not share storage with a or b");
  if (M == 0 || N == 0) return;
  nn::use_device(a.device());
  if (K == 0) {  // cuBLAS would leave C alone; the contract is C = beta C
    if (beta == 0.0)
      out.fill(0);
    else if (beta != 1.0)
      scale(out.raw(), out.dtype(), out.numel(), beta);
    return;
  }
  const bool wide = a.dtype() == DType::f32;
  const cudaDataType_t type = wide                       ? CUDA_R_32F
                              : a.dtype() == DType::bf16 ? CUDA_R_16BF
                                                         : CUDA_R_16F;
  // beta = 0: cuBLAS does not read C, so NaNs in out are ignored as promised.
  gemm_strided_batched(type, wide ? compute_type_f32() : CUBLAS_COMPUTE_32F, transpose_a,
                       transpose_b, M, N, K, static_cast<float>(alpha), a.raw(),
                       transpose_a ? M : K, 0, b.raw(), transpose_b ? K : N, 0,
                       static_cast<float>(beta), out.raw(), N, 0, 1);
}

}  // namespace dtp::cuda
