#include "dtp/dtype.h"

#include "dtp/error.h"

namespace dtp {

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f64:
      return 8;
    case DType::f32:
      return 4;
    case DType::bf16:
      return 2;
    case DType::f16:
      return 2;
    case DType::i32:
      return 4;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f64:
      return "f64";
    case DType::f32:
      return "f32";
    case DType::bf16:
      return "bf16";
    case DType::f16:
      return "f16";
    case DType::i32:
      return "i32";
  }
  return "?";
}

DType parse_dtype(const std::string& name) {
  for (DType d : {DType::f64, DType::f32, DType::bf16, DType::f16, DType::i32}) {
    if (name == dtype_name(d)) return d;
  }
  DTP_CHECK(false, "unknown dtype '", name, "': expected one of f64, f32, bf16, f16, i32");
  return DType::f32;
}

bool is_floating(DType dtype) { return dtype != DType::i32; }

}  // namespace dtp
