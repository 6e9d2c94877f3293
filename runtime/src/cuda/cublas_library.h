// cuBLAS, loaded on first use instead of linked.
//
// Linking libcublas makes every process relocate libcublasLt (over 500 MB)
// before main(): about 0.5 s and 26k page faults per start, paid by each
// checker, each rank and each `dtp train` even when no GPU is ever touched
// (the test suite starts well over a thousand processes). Loading it with
// dlopen the first time a matrix product runs on the GPU moves that cost to
// the programs that need it, once.
#pragma once

#include <cublas_v2.h>

namespace dtp::cuda {

/// The cuBLAS functions the runtime calls, resolved from the loaded library.
struct CublasLibrary {
  // (cublas_api.h overloads some of these names in C++, so the exported
  // signatures are spelled out)
  cublasStatus_t (*create)(cublasHandle_t*) = nullptr;
  cublasStatus_t (*destroy)(cublasHandle_t) = nullptr;
  cublasStatus_t (*set_stream)(cublasHandle_t, cudaStream_t) = nullptr;
  cublasStatus_t (*gemm_strided_batched_ex)(
      cublasHandle_t, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
      const void* alpha, const void* A, cudaDataType Atype, int lda, long long strideA,
      const void* B, cudaDataType Btype, int ldb, long long strideB, const void* beta, void* C,
      cudaDataType Ctype, int ldc, long long strideC, int batch_count,
      cublasComputeType_t compute_type, cublasGemmAlgo_t algo) = nullptr;
};

/// Loads cuBLAS (the library found at configure time, else the soname of the
/// headers' major version) on the first call; thread-safe. Throws dtp::Error
/// naming the library and what dlopen or dlsym said when it is missing.
const CublasLibrary& cublas_library();

}  // namespace dtp::cuda
