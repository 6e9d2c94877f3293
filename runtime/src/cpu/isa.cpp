#include "cpu/isa.h"

namespace dtp::cpu {

const char* to_string(VectorIsa isa) {
  switch (isa) {
    case VectorIsa::avx512:
      return "avx512";
    case VectorIsa::avx2:
      return "avx2";
    case VectorIsa::baseline:
      return "baseline";
  }
  return "?";
}

bool cpu_runs(VectorIsa isa) {
#ifdef DTP_CPU_DISPATCH
  __builtin_cpu_init();
  switch (isa) {
    case VectorIsa::avx512:
      return __builtin_cpu_supports("avx512f");
    case VectorIsa::avx2:
      return __builtin_cpu_supports("avx2");
    case VectorIsa::baseline:
      return true;
  }
  return false;
#else
  return isa == VectorIsa::baseline;
#endif
}

std::vector<VectorIsa> supported_isas() {
  std::vector<VectorIsa> isas;
  for (VectorIsa isa : {VectorIsa::baseline, VectorIsa::avx2, VectorIsa::avx512})
    if (cpu_runs(isa)) isas.push_back(isa);
  return isas;
}

bool cpu_has_f16c() {
#ifdef DTP_CPU_DISPATCH
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
  }();
  return has;
#else
  return false;
#endif
}

VectorIsa fastest_isa() {
  static const VectorIsa fastest = supported_isas().back();
  return fastest;
}

}  // namespace dtp::cpu
