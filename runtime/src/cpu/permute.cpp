// ops::permute: a copy that reorders the four axes of a tensor. Sequence
// parallelism needs it where the data must move between "my positions, all
// heads" and "all positions, my heads": an all-to-all sends contiguous
// blocks, so the per-peer blocks are made contiguous first.
#include <cstring>

#include "cpu/nn_ops_common.h"
#include "cuda/nn_kernels.h"
#include "dtp/nn_ops.h"

namespace dtp::ops {
namespace {

void check_permute(const Tensor& in, const std::array<int, 4>& order, const Tensor& out) {
  const char* op = "permute";
  DTP_CHECK(in.defined() && out.defined(), op, ": in or out is an undefined tensor");
  DTP_CHECK(in.ndim() == 4 && out.ndim() == 4, op,
            ": in and out must be 4-D (view them first), got ", in.describe(), " and ",
            out.describe());
  DTP_CHECK(in.dtype() == out.dtype() && in.device() == out.device(), op, ": in is ", in.describe(),
            " but out is ", out.describe(), "; dtype and device must match");
  bool seen[4] = {false, false, false, false};
  for (int i = 0; i < 4; ++i) {
    DTP_CHECK(order[i] >= 0 && order[i] < 4 && !seen[order[i]], op,
              ": order must be a permutation of 0, 1, 2, 3, got ", order[0], ", ", order[1], ", ",
              order[2], ", ", order[3]);
    seen[order[i]] = true;
  }
  for (int i = 0; i < 4; ++i)
    DTP_CHECK(out.size(i) == in.size(order[i]), op, ": out's axis ", i, " is in's axis ", order[i],
              " (size ", in.size(order[i]), "), but out is ", out.describe());
  DTP_CHECK(!in.shares_storage_with(out), op, ": in and out must not share storage");
}

}  // namespace

void permute(const Tensor& in, const std::array<int, 4>& order, Tensor& out) {
  check_permute(in, order, out);
  if (in.device().is_cuda()) return cuda::permute(in, order, out);
  // Walk out in order; in's stride along out's axis i is in_stride[order[i]].
  std::int64_t in_stride[4];
  in_stride[3] = 1;
  for (int d = 2; d >= 0; --d) in_stride[d] = in_stride[d + 1] * in.size(d + 1);
  const std::int64_t s0 = in_stride[order[0]], s1 = in_stride[order[1]], s2 = in_stride[order[2]],
                     s3 = in_stride[order[3]];
  const std::size_t bytes = in.element_size();
  const char* src = static_cast<const char*>(in.raw());
  char* dst = static_cast<char*>(out.raw());
  const std::int64_t n0 = out.size(0), n1 = out.size(1), n2 = out.size(2), n3 = out.size(3);
  std::int64_t at = 0;
  for (std::int64_t a = 0; a < n0; ++a)
    for (std::int64_t b = 0; b < n1; ++b)
      for (std::int64_t c = 0; c < n2; ++c) {
        const std::int64_t base = a * s0 + b * s1 + c * s2;
        if (s3 == 1) {  // the innermost axis stays innermost: one run of n3 elements
          std::memcpy(dst + at * bytes, src + base * bytes, static_cast<std::size_t>(n3) * bytes);
          at += n3;
        } else {
          for (std::int64_t d = 0; d < n3; ++d, ++at)
            std::memcpy(dst + at * bytes, src + (base + d * s3) * bytes, bytes);
        }
      }
}

}  // namespace dtp::ops
