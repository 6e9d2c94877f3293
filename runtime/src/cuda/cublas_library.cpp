#include "cuda/cublas_library.h"

#include <dlfcn.h>

#include <string>

#include "dtp/error.h"

namespace dtp::cuda {
namespace {

// The soname of the cuBLAS these headers declare (libcublas.so.13).
std::string header_soname() { return "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR); }

void* open_library() {
  std::string tried;
  // DTP_CUBLAS_PATH: the library CMake found (runtime/CMakeLists.txt), so a
  // toolkit outside the loader's search path still loads.
  for (const std::string& name : {std::string(DTP_CUBLAS_PATH), header_soname()}) {
    if (name.empty()) continue;
    if (void* library = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL)) return library;
    tried += "\n  " + name + ": " + dlerror();
  }
  throw Error("cannot load cuBLAS, needed for matrix products on the GPU; tried:" + tried +
              "\n(install the CUDA toolkit's cuBLAS, or add its folder to LD_LIBRARY_PATH)");
}

template <typename Function>
void resolve(void* library, const char* symbol, Function& function) {
  function = reinterpret_cast<Function>(dlsym(library, symbol));
  if (function == nullptr)
    throw Error(std::string("cuBLAS was loaded but has no ") + symbol + " (a cuBLAS older than " +
                header_soname() + "?)");
}

CublasLibrary load() {
  void* library = open_library();  // never closed: handles may outlive main()
  CublasLibrary cublas;
  resolve(library, "cublasCreate_v2", cublas.create);
  resolve(library, "cublasDestroy_v2", cublas.destroy);
  resolve(library, "cublasSetStream_v2", cublas.set_stream);
  resolve(library, "cublasGemmStridedBatchedEx", cublas.gemm_strided_batched_ex);
  return cublas;
}

}  // namespace

const CublasLibrary& cublas_library() {
  static const CublasLibrary cublas = load();
  return cublas;
}

}  // namespace dtp::cuda
