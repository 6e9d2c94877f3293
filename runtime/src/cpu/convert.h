// Internal: arrays converted between f32 and the 16-bit types, with the same
// bits as the scalar casts of dtp/dtype.h (round to nearest even; a NaN
// becomes the quiet NaN with its sign and no payload).
#pragma once

#include <cstdint>

#include "dtp/dtype.h"

namespace dtp::detail {

/// dst[i] = the 16-bit value nearest to src[i], for i < n.
void convert(const float* src, f16* dst, std::int64_t n);
void convert(const float* src, bf16* dst, std::int64_t n);
/// dst[i] = the f32 equal to src[i] (exact), for i < n.
void convert(const f16* src, float* dst, std::int64_t n);
void convert(const bf16* src, float* dst, std::int64_t n);

}  // namespace dtp::detail
