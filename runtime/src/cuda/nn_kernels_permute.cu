// ops::permute on the GPU: one thread per output element, moving elements
// of 1, 2, 4 or 8 bytes as unsigned integers so any dtype goes through the
// same kernel. Reads are strided and writes coalesced; a layout copy before
// an all-to-all is bandwidth-bound either way (2 x bytes over HBM).
#include "cuda/nn_kernels_common.cuh"

namespace dtp::cuda {

namespace {

struct PermuteShape {
  std::int64_t out[4];        // out's sizes
  std::int64_t in_stride[4];  // in's stride along out's axis i
};

template <typename Word>
__global__ void permute_kernel(const Word* in, Word* out, PermuteShape s, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::int64_t rest = i, from = 0;
    for (int d = 3; d >= 0; --d) {
      const std::int64_t index = rest % s.out[d];
      rest /= s.out[d];
      from += index * s.in_stride[d];
    }
    out[i] = in[from];
  }
}

template <typename Word>
void launch(const Tensor& in, Tensor& out, const PermuteShape& shape) {
  const std::int64_t n = out.numel();
  if (n == 0) return;
  permute_kernel<Word>
      <<<nn::grid_for(n), 256, 0, nn::stream()>>>(nn::ptr<Word>(in), nn::ptr<Word>(out), shape, n);
  nn::check_launch();
}

}  // namespace

void permute(const Tensor& in, const std::array<int, 4>& order, Tensor& out) {
  nn::check_gpu("permute", "in", in);
  nn::check_same_gpu("permute", "out", out, in.device());
  nn::use_device(in.device());
  std::int64_t stride[4];
  stride[3] = 1;
  for (int d = 2; d >= 0; --d) stride[d] = stride[d + 1] * in.size(d + 1);
  PermuteShape shape;
  for (int i = 0; i < 4; ++i) {
    shape.out[i] = out.size(i);
    shape.in_stride[i] = stride[order[i]];
  }
  switch (in.element_size()) {
    case 1:
      return launch<std::uint8_t>(in, out, shape);
    case 2:
      return launch<std::uint16_t>(in, out, shape);
    case 4:
      return launch<std::uint32_t>(in, out, shape);
    case 8:
      return launch<std::uint64_t>(in, out, shape);
    default:
      throw Error("permute: unsupported element size");
  }
}

}  // namespace dtp::cuda
