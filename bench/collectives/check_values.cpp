#include "check_values.h"

#include <cmath>
#include <type_traits>

namespace dtp::bench::collectives {
namespace {

/// Sum of pattern(r, g) over the n ranks.
double pattern_sum(int n, std::int64_t g) {
  return n * (n - 1) / 2.0 + n * static_cast<double>(g % 61);
}

}  // namespace

double pattern(int rank, std::int64_t g) { return rank + static_cast<double>(g % 61); }

double pattern_reduced(dtp::ReduceOp op, int n, std::int64_t g) {
  switch (op) {
    case dtp::ReduceOp::sum:
      return pattern_sum(n, g);
    case dtp::ReduceOp::avg:
      return pattern_sum(n, g) / n;
    case dtp::ReduceOp::max:
      return pattern(n - 1, g);
    case dtp::ReduceOp::min:
      return pattern(0, g);
  }
  return 0;
}

double check_tolerance(dtp::ReduceOp op, dtp::DType dtype) {
  if (op != dtp::ReduceOp::avg) return 0;
  return dtype == dtp::DType::f32 ? 1e-6 : 1e-14;
}

dtp::Tensor to_host(const dtp::Tensor& t) {
  if (t.device().is_cpu()) return t;
  dtp::Tensor host = dtp::Tensor::empty(t.shape(), t.dtype(), dtp::Device::cpu());
  host.copy_from(t);
  return host;
}

void fill_with(dtp::Tensor& t, const std::function<double(std::int64_t)>& value) {
  dtp::Tensor host =
      t.device().is_cpu() ? t : dtp::Tensor::empty(t.shape(), t.dtype(), dtp::Device::cpu());
  auto fill = [&](auto* p) {
    using T = std::remove_pointer_t<decltype(p)>;
    for (std::int64_t g = 0, n = host.numel(); g < n; ++g) p[g] = static_cast<T>(value(g));
  };
  if (host.dtype() == dtp::DType::f32)
    fill(host.data<float>());
  else
    fill(host.data<double>());
  if (!t.device().is_cpu()) t.copy_from(host);
}

std::int64_t count_wrong(const dtp::Tensor& t, std::int64_t begin, std::int64_t end,
                         const std::function<double(std::int64_t)>& expected, double tolerance) {
  dtp::Tensor host = to_host(t);
  std::int64_t wrong = 0;
  auto scan = [&](const auto* p) {
    for (std::int64_t g = begin; g < end; ++g) {
      const double want = expected(g);
      if (std::abs(static_cast<double>(p[g]) - want) > tolerance * std::abs(want)) ++wrong;
    }
  };
  if (host.dtype() == dtp::DType::f32)
    scan(host.data<float>());
  else
    scan(host.data<double>());
  return wrong;
}

}  // namespace dtp::bench::collectives
