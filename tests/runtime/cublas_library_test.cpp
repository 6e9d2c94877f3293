// cuBLAS is dlopen'ed on the first GPU matrix product (runtime/src/cuda/
// cublas_library.h). Loading it and finding its functions needs no GPU, so a
// CUDA build checks it here on any machine: a wrong soname or symbol name
// would otherwise surface only on a GPU.
#include <gtest/gtest.h>

#if DTP_HAVE_CUDA
#include "cuda/cublas_library.h"

TEST(CublasLibrary, LoadsAndResolvesEveryFunction) {
  const dtp::cuda::CublasLibrary& cublas = dtp::cuda::cublas_library();
  EXPECT_NE(cublas.create, nullptr) << "cublasCreate_v2";
  EXPECT_NE(cublas.destroy, nullptr) << "cublasDestroy_v2";
  EXPECT_NE(cublas.set_stream, nullptr) << "cublasSetStream_v2";
  EXPECT_NE(cublas.gemm_strided_batched_ex, nullptr) << "cublasGemmStridedBatchedEx";
  EXPECT_EQ(&cublas, &dtp::cuda::cublas_library()) << "loaded once, the same table after";
}
#endif
