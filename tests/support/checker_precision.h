// The dtype the checkers build their models and data in, and tolerances
// stated for both dtypes a checker may run in.
//
// On the CPU the checkers run in f64 by default: a distributed run then
// differs from the single-device run of the same batch by a few ulps of
// 2^-53, so tolerances can be far below any real mistake. In f32 the unit
// roundoff is 2^-24 (about 6e-8), and a sum of n terms added in another
// order moves by up to about n x 2^-24 of the sum of their magnitudes, so
// every value check states its f32 tolerance separately, with where that
// number comes from. The checkers run in f32 where DTP_CHECK_DTYPE=f32 asks
// for it (the `f32` CTest flavour) and on a GPU, whose model kernels are f32.
// Exact checks (communication counts and bytes, bucket plans, replicas that
// must be bitwise the same on every rank) hold in both dtypes unchanged.
#pragma once

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "dtp/dtp.h"
#include "support/harness.h"

namespace dtp::testing {

/// The dtype the checkers build models and data in on @p device (a rank's
/// comm.device(); checker_device() without ranks): f32 on a GPU; on the CPU
/// the value of DTP_CHECK_DTYPE, f64 when it is unset. Any value other than
/// f32 or f64, or f64 on a GPU, is a dtp::Error that names the accepted ones.
inline DType checker_dtype(Device device = checker_device()) {
  const char* asked = std::getenv("DTP_CHECK_DTYPE");
  const std::string name = asked != nullptr ? asked : "";
  DTP_CHECK(name.empty() || name == "f32" || name == "f64", "DTP_CHECK_DTYPE='", name,
            "' is not a dtype the checkers run in: the accepted values are f32 and f64 (unset: "
            "f64 on the CPU, f32 on a GPU)");
  if (device.is_cuda()) {
    DTP_CHECK(name != "f64", "DTP_CHECK_DTYPE=f64 on ", device.str(),
              ": the checkers run in f32 on a GPU (its model kernels are f32); the accepted "
              "values there are f32 or unset");
    return DType::f32;
  }
  return name == "f32" ? DType::f32 : DType::f64;
}

/// A tolerance of one check, stated for both checker dtypes: @p f64 when
/// @p dtype is f64, @p f32 when it is f32. Both are required, so a check
/// cannot forget its f32 number; write where each comes from next to it.
inline double tolerance(DType dtype, double f64, double f32) {
  DTP_CHECK(dtype == DType::f64 || dtype == DType::f32,
            "tolerance: the checkers run in f64 or f32, got ", dtype_name(dtype));
  return dtype == DType::f64 ? f64 : f32;
}

/// The unit roundoff of @p dtype, the largest relative error of rounding one
/// value to it: 2^-53 for f64, 2^-24 (about 6e-8) for f32.
inline double unit_roundoff(DType dtype) { return tolerance(dtype, 0x1p-53, 0x1p-24); }

/// |got - expected| <= absolute + relative x |expected|, element by element.
struct Closeness {
  double absolute = 0;
  double relative = 0;

  bool holds(double expected, double got) const {
    return std::fabs(expected - got) <= absolute + relative * std::fabs(expected);
  }
  /// "|diff| <= 1e-10 + 1e-8 |expected|", for failure messages.
  std::string str() const {
    auto text = [](double value) {
      char digits[32];
      std::snprintf(digits, sizeof digits, "%g", value);
      std::string out = digits;
      if (const auto e = out.find("e-0"); e != std::string::npos) out.erase(e + 2, 1);
      return out;
    };
    return "|diff| <= " + text(absolute) + " + " + text(relative) + " |expected|";
  }
};

/// tolerance() for an absolute and relative pair: @p f64 or @p f32 by @p dtype.
inline Closeness tolerance(DType dtype, Closeness f64, Closeness f32) {
  return Closeness{tolerance(dtype, f64.absolute, f32.absolute),
                   tolerance(dtype, f64.relative, f32.relative)};
}

}  // namespace dtp::testing
