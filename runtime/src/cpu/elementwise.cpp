// Element-wise ops: seeded init, add/axpy, norms, finite checks, casts.
#include <cmath>
#include <numbers>
#include <type_traits>

#include "cpu/convert.h"
#include "cpu/exp.h"
#include "cpu/isa.h"
#include "cpu/nn_ops_common.h"
#include "cpu/widen.h"
#include "cuda/nn_kernels.h"
#include "dtp/nn_ops.h"
#include "dtp/parallel.h"

namespace dtp {

// --- Rng: splitmix64, portable and seedable -------------------------------------

std::uint64_t Rng::derive(std::uint64_t seed, std::uint64_t stream) {
  Rng mix(seed ^ (0x9E3779B97F4A7C15ull * (stream + 1)));
  mix.next();
  return mix.next();
}

std::uint64_t Rng::next() {
  std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double Rng::uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

std::int64_t Rng::below(std::int64_t n) {
  DTP_CHECK(n >= 1, "Rng::below: n must be at least 1, got ", n);
  return static_cast<std::int64_t>(next() % static_cast<std::uint64_t>(n));
}

double Rng::normal() {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  double u1 = uniform();
  while (u1 <= 0.0) u1 = uniform();
  const double u2 = uniform();
  const double radius = std::sqrt(-2.0 * std::log(u1));
  const double angle = 2.0 * std::numbers::pi * u2;
  spare_ = radius * std::sin(angle);
  has_spare_ = true;
  return radius * std::cos(angle);
}

namespace ops {

void fill_normal(Tensor& x, double mean, double std, Rng& rng) {
  if (x.device().is_cuda()) return cuda::fill_normal(x, mean, std, rng);
  detail::check_cpu("fill_normal", "x", x);
  DTP_CHECK(is_floating(x.dtype()), "fill_normal: x must be floating, got ", x.describe());
  detail::with_element(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    T* p = static_cast<T*>(x.raw());
    for (std::int64_t i = 0, n = x.numel(); i < n; ++i)
      p[i] = detail::from_double<T>(mean + std * rng.normal());
  });
}

void add(const Tensor& a, const Tensor& b, Tensor& out) {
  if (a.device().is_cuda()) return cuda::add(a, b, out);
  if (detail::is_half(a.dtype())) {
    detail::Widened f32("add", a.dtype());
    add(f32.in("a", a), f32.in("b", b), f32.out("out", out));
    return f32.store();
  }
  detail::check_float("add", "a", a);
  detail::check_float("add", "b", b);
  detail::check_float("add", "out", out);
  detail::check_dtype_is("add", "b", b, a.dtype());
  detail::check_dtype_is("add", "out", out, a.dtype());
  detail::check_shape("add", "b", b, a.shape());
  detail::check_shape("add", "out", out, a.shape());
  detail::with_float(a.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
    T* po = out.data<T>();
    for (std::int64_t i = 0, n = a.numel(); i < n; ++i) po[i] = pa[i] + pb[i];
  });
}

void axpy(Tensor& y, double alpha, const Tensor& x) {
  if (y.device().is_cuda()) return cuda::axpy(y, alpha, x);
  if (detail::is_half(y.dtype())) {
    detail::Widened f32("axpy", y.dtype());
    axpy(f32.out("y", y), alpha, f32.in("x", x));
    return f32.store();
  }
  detail::check_float("axpy", "y", y);
  detail::check_float("axpy", "x", x);
  detail::check_dtype_is("axpy", "x", x, y.dtype());
  detail::check_numel("axpy", "x", x, y.numel(), "as many as y");
  detail::with_float(y.dtype(), [&](auto zero) {
    using T = decltype(zero);
    T* __restrict py = y.data<T>();
    const T* __restrict px = x.data<T>();
    const T a = static_cast<T>(alpha);
    for (std::int64_t i = 0, n = y.numel(); i < n; ++i) py[i] += a * px[i];
  });
}

double sum_squares(const Tensor& x) {
  if (x.device().is_cuda()) return cuda::sum_squares(x);
  if (detail::is_half(x.dtype())) {
    detail::Widened f32("sum_squares", x.dtype());
    return sum_squares(f32.in("x", x));
  }
  detail::check_float("sum_squares", "x", x);
  double total = 0;
  detail::with_float(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* p = x.data<T>();
    for (std::int64_t i = 0, n = x.numel(); i < n; ++i) {
      const double v = static_cast<double>(p[i]);
      total += v * v;
    }
  });
  return total;
}

namespace {
// True when every tensor is on the first one's GPU: one batched call serves them.
bool on_one_gpu(const std::vector<Tensor>& xs) {
  for (const Tensor& x : xs)
    if (!x.defined() || !x.device().is_cuda() || x.device() != xs[0].device()) return false;
  return !xs.empty();
}
}  // namespace

std::vector<double> sum_squares(const std::vector<Tensor>& xs) {
  if (on_one_gpu(xs)) return cuda::sum_squares(xs);
  std::vector<double> sums;
  for (const Tensor& x : xs) sums.push_back(sum_squares(x));
  return sums;
}

bool all_finite(const std::vector<Tensor>& xs) {
  if (on_one_gpu(xs)) return cuda::all_finite(xs);
  for (const Tensor& x : xs)
    if (!all_finite(x)) return false;
  return true;
}

bool all_finite(const Tensor& x) {
  if (x.device().is_cuda()) return cuda::all_finite(x);
  detail::check_cpu("all_finite", "x", x);
  bool finite = true;
  detail::with_element(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    if constexpr (std::is_same_v<T, std::int32_t>) {
      return;
    } else {
      const T* p = static_cast<const T*>(x.raw());
      for (std::int64_t i = 0, n = x.numel(); i < n; ++i) {
        if (!std::isfinite(detail::to_double(p[i]))) {
          finite = false;
          return;
        }
      }
    }
  });
  return finite;
}

void cast(const Tensor& src, Tensor& dst) {
  if (src.device().is_cuda()) return cuda::cast(src, dst);
  detail::check_cpu("cast", "src", src);
  detail::check_cpu("cast", "dst", dst);
  detail::check_numel("cast", "dst", dst, src.numel(), "as many as src");
  if (src.dtype() == dst.dtype()) {
    dst.copy_from(src);
    return;
  }
  // Every 16-bit op widens its inputs and rounds its outputs through here:
  // parts on every core, and f32 <-> bf16/f16 by the array conversions.
  detail::with_element(src.dtype(), [&](auto src_zero) {
    using S = decltype(src_zero);
    detail::with_element(dst.dtype(), [&](auto dst_zero) {
      using D = decltype(dst_zero);
      const S* s = static_cast<const S*>(src.raw());
      D* d = static_cast<D*>(dst.raw());
      constexpr bool f32_and_half = (std::is_same_v<S, float> && detail::is_half_type<D>) ||
                                    (detail::is_half_type<S> && std::is_same_v<D, float>);
      parallel_for(src.numel(), kElementsPerPart, [&](std::int64_t begin, std::int64_t end) {
        if constexpr (f32_and_half) {
          detail::convert(s + begin, d + begin, end - begin);
        } else {
          for (std::int64_t i = begin; i < end; ++i)
            d[i] = detail::from_double<D>(detail::to_double(s[i]));
        }
      });
    });
  });
}

// --- GELU, tanh approximation -----------------------------------------------------

namespace {
constexpr double kGeluScale = 0.7978845608028654;  // sqrt(2 / pi)
constexpr double kGeluCubic = 0.044715;

// GELU and its derivative for one value (V = T, with std::exp) or eight floats
// (V = Float8, with the vector exp of cpu/exp.h): one formula for both, so
// the f32 vector loops and the f64 loops do the same arithmetic.
// tanh goes through one exp, several times faster than std::tanh here; its
// error is absolute (not relative) near 0, which is what GELU needs.
template <typename S, typename V, typename Exp>
[[gnu::always_inline]] inline V gelu_tanh(V v, Exp exp) {
  const S s = static_cast<S>(kGeluScale), c = static_cast<S>(kGeluCubic);
  const V u = s * (v + c * v * v * v);
  return S(1) - S(2) / (S(1) + exp(S(2) * u));
}

template <typename S, typename V, typename Exp>
[[gnu::always_inline]] inline V gelu_value(V v, Exp exp) {
  return S(0.5) * v * (S(1) + gelu_tanh<S>(v, exp));
}

/// dy * gelu'(v).
template <typename S, typename V, typename Exp>
[[gnu::always_inline]] inline V gelu_gradient(V v, V dy, Exp exp) {
  const S s = static_cast<S>(kGeluScale), c = static_cast<S>(kGeluCubic);
  const V t = gelu_tanh<S>(v, exp);
  const V dt = (S(1) - t * t) * s * (S(1) + S(3) * c * v * v);
  return dy * (S(0.5) * (S(1) + t) + S(0.5) * v * dt);
}

template <typename T>
T scalar_exp(T x) {
  return std::exp(x);
}

// f32 GELU, forward (dy null: out = gelu(x)) or backward (out = dy * gelu'(x)),
// eight elements at a time.
// The lambdas are always inlined too: one compiled out of line would be
// built for the SSE2 baseline, and gelu_f32_avx2 would pass it its 32-byte
// vectors in AVX registers where it reads them from memory (GCC's -Wpsabi
// note). A unity build did exactly that to the tail's call in map8.
[[gnu::always_inline]] inline void gelu_f32(const float* x, const float* dy, float* out,
                                            std::int64_t n) {
  using detail::Float8;
  auto exp8 = [](Float8 u) __attribute__((always_inline)) { return detail::exp8(u); };
  if (dy == nullptr)
    return detail::map8(
        x, nullptr, out, n, [&](Float8 v, Float8) __attribute__((always_inline)) {
          return gelu_value<float>(v, exp8);
        });
  detail::map8(
      x, dy, out, n, [&](Float8 v, Float8 g) __attribute__((always_inline)) {
        return gelu_gradient<float>(v, g, exp8);
      });
}

// Built for AVX2 where the CPU has it: eight floats are one register there
// (on the SSE2 baseline the vector's integer steps are slow). Same bits.
#ifdef DTP_CPU_DISPATCH
[[gnu::target("avx2")]] void gelu_f32_avx2(const float* x, const float* dy, float* out,
                                           std::int64_t n) {
  gelu_f32(x, dy, out, n);
}
#endif

void gelu_f32_any(const float* x, const float* dy, float* out, std::int64_t n) {
#ifdef DTP_CPU_DISPATCH
  if (cpu::fastest_isa() != cpu::VectorIsa::baseline) return gelu_f32_avx2(x, dy, out, n);
#endif
  gelu_f32(x, dy, out, n);
}
}  // namespace

void gelu_forward(const Tensor& x, Tensor& y) {
  if (x.device().is_cuda()) return cuda::gelu_forward(x, y);
  if (detail::is_half(x.dtype())) {
    detail::Widened f32("gelu_forward", x.dtype());
    gelu_forward(f32.in("x", x), f32.out("y", y));
    return f32.store();
  }
  detail::check_float("gelu_forward", "x", x);
  detail::check_float("gelu_forward", "y", y);
  detail::check_dtype_is("gelu_forward", "y", y, x.dtype());
  detail::check_shape("gelu_forward", "y", y, x.shape());
  detail::with_float(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* px = x.data<T>();
    T* py = y.data<T>();
    parallel_for(x.numel(), kElementsPerPart, [&](std::int64_t begin, std::int64_t end) {
      if constexpr (std::is_same_v<T, float>) {
        gelu_f32_any(px + begin, nullptr, py + begin, end - begin);
      } else {
        for (std::int64_t i = begin; i < end; ++i) py[i] = gelu_value<T>(px[i], scalar_exp<T>);
      }
    });
  });
}

void gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) {
  if (x.device().is_cuda()) return cuda::gelu_backward(x, dy, dx);
  if (detail::is_half(x.dtype())) {
    detail::Widened f32("gelu_backward", x.dtype());
    gelu_backward(f32.in("x", x), f32.in("dy", dy), f32.out("dx", dx));
    return f32.store();
  }
  detail::check_float("gelu_backward", "x", x);
  detail::check_float("gelu_backward", "dy", dy);
  detail::check_float("gelu_backward", "dx", dx);
  detail::check_dtype_is("gelu_backward", "dy", dy, x.dtype());
  detail::check_dtype_is("gelu_backward", "dx", dx, x.dtype());
  detail::check_shape("gelu_backward", "dy", dy, x.shape());
  detail::check_shape("gelu_backward", "dx", dx, x.shape());
  detail::with_float(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* px = x.data<T>();
    const T* pdy = dy.data<T>();
    T* pdx = dx.data<T>();
    parallel_for(x.numel(), kElementsPerPart, [&](std::int64_t begin, std::int64_t end) {
      if constexpr (std::is_same_v<T, float>) {
        gelu_f32_any(px + begin, pdy + begin, pdx + begin, end - begin);
      } else {
        for (std::int64_t i = begin; i < end; ++i)
          pdx[i] = gelu_gradient<T>(px[i], pdy[i], scalar_exp<T>);
      }
    });
  });
}

}  // namespace ops
}  // namespace dtp
