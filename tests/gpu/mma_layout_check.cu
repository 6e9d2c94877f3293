// The GPU side of the mma.sync layout check: copies the inputs in, launches
// mma_layout_kernel on one block, copies S and O out.
#include "gpu/mma_layout_check.h"

#include <cuda_runtime.h>

#include <string>

#include "dtp/error.h"
#include "gpu/mma_layout_kernel.cuh"

namespace dtp::testing {
namespace {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw Error(std::string("mma layout check: ") + what + ": " + cudaGetErrorString(status));
}

template <typename T>
void run(const std::vector<float>& a, const std::vector<float>& keys,
         const std::vector<float>& values, std::vector<float>& scores, std::vector<float>& out) {
  auto to16 = [](const std::vector<float>& v) {
    std::vector<T> r;
    for (float x : v) r.push_back(static_cast<T>(x));  // small integers: exact in bf16 and f16
    return r;
  };
  const std::vector<T> host[3] = {to16(a), to16(keys), to16(values)};
  T* in[3] = {};
  float* result[2] = {};
  const std::size_t result_count = static_cast<std::size_t>(kLayoutRows) * kLayoutWidth;
  for (int i = 0; i < 3; ++i) {
    check(cudaMalloc(&in[i], host[i].size() * sizeof(T)), "cudaMalloc");
    check(cudaMemcpy(in[i], host[i].data(), host[i].size() * sizeof(T), cudaMemcpyHostToDevice),
          "copy in");
  }
  for (float*& r : result) check(cudaMalloc(&r, result_count * sizeof(float)), "cudaMalloc");
  const std::size_t bytes = cuda::flash::shared_bytes<cuda::flash::MmaShared<T, kLayoutWidth>>();
  mma_layout_kernel<T>
      <<<1, cuda::flash::kThreads, bytes>>>(in[0], in[1], in[2], result[0], result[1]);
  check(cudaGetLastError(), "launch");
  check(cudaDeviceSynchronize(), "kernel");
  scores.resize(result_count);
  out.resize(result_count);
  check(cudaMemcpy(scores.data(), result[0], result_count * sizeof(float), cudaMemcpyDeviceToHost),
        "copy out");
  check(cudaMemcpy(out.data(), result[1], result_count * sizeof(float), cudaMemcpyDeviceToHost),
        "copy out");
  for (T* p : in) cudaFree(p);
  for (float* p : result) cudaFree(p);
}

}  // namespace

void run_mma_layout_check(bool bf16, const std::vector<float>& a, const std::vector<float>& keys,
                          const std::vector<float>& values, std::vector<float>& scores,
                          std::vector<float>& out) {
  if (bf16)
    run<__nv_bfloat16>(a, keys, values, scores, out);
  else
    run<__half>(a, keys, values, scores, out);
}

}  // namespace dtp::testing
