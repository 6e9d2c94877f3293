// Converting arrays between f32 and f16 or bf16: what every 16-bit op on the
// CPU pays to widen its inputs and round its outputs (cpu/widen.h).
//
// f16 has a 5-bit exponent, so its scalar conversion branches on subnormals
// and overflow; a 16-bit f16 model spent a third of its CPU time there. x86
// CPUs since 2012 convert 8 values in one instruction (F16C), rounding to
// nearest even with subnormals and overflow done right: the same bits as
// float_to_f16 and f16_to_float, except for a NaN's payload, which F16C
// keeps and the runtime drops. A block of 8 holding a NaN is therefore
// converted again one value at a time. bf16 is an f32's top half: its
// scalar loops are a few integer operations, which the compiler vectorizes.
#include "cpu/convert.h"

#include "cpu/isa.h"

#ifdef DTP_CPU_DISPATCH
#include <immintrin.h>
#endif

namespace dtp::detail {

namespace {

#ifdef DTP_CPU_DISPATCH
[[gnu::target("avx,f16c")]] void to_f16_f16c(const float* src, f16* dst, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(src + i);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
    if (_mm256_movemask_ps(_mm256_cmp_ps(x, x, _CMP_UNORD_Q)) != 0)
      for (std::int64_t j = i; j < i + 8; ++j) dst[j] = float_to_f16(src[j]);
  }
  for (; i < n; ++i) dst[i] = float_to_f16(src[i]);
}

[[gnu::target("avx,f16c")]] void to_f32_f16c(const f16* src, float* dst, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
    _mm256_storeu_ps(dst + i, x);
    if (_mm256_movemask_ps(_mm256_cmp_ps(x, x, _CMP_UNORD_Q)) != 0)
      for (std::int64_t j = i; j < i + 8; ++j) dst[j] = f16_to_float(src[j]);
  }
  for (; i < n; ++i) dst[i] = f16_to_float(src[i]);
}
#endif

}  // namespace

void convert(const float* src, f16* dst, std::int64_t n) {
#ifdef DTP_CPU_DISPATCH
  if (cpu::cpu_has_f16c()) return to_f16_f16c(src, dst, n);
#endif
  for (std::int64_t i = 0; i < n; ++i) dst[i] = float_to_f16(src[i]);
}

void convert(const f16* src, float* dst, std::int64_t n) {
#ifdef DTP_CPU_DISPATCH
  if (cpu::cpu_has_f16c()) return to_f32_f16c(src, dst, n);
#endif
  for (std::int64_t i = 0; i < n; ++i) dst[i] = f16_to_float(src[i]);
}

void convert(const float* src, bf16* dst, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) dst[i] = float_to_bf16(src[i]);
}

void convert(const bf16* src, float* dst, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) dst[i] = bf16_to_float(src[i]);
}

}  // namespace dtp::detail
