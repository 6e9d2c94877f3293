// Internal: the vector instruction sets the CPU kernels are built for, and
// which of them this CPU runs.
//
// A kernel is written once, with GCC vector extensions, and compiled inside
// one entry function per set ([[gnu::target(...)]] where DTP_CPU_DISPATCH is
// defined); the caller picks the entry from fastest_isa(). Not GCC's
// target_clones: its ifunc resolver runs before ThreadSanitizer is ready and
// crashes it. No set enables FMA, so all of them give the same bits.
#pragma once

#include <vector>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define DTP_CPU_DISPATCH 1  // x86-64: AVX2 and AVX-512 entries exist
#endif

namespace dtp::cpu {

/// Vectors of 16 (baseline: SSE2, or NEON off x86), 32 and 64 bytes.
enum class VectorIsa { baseline, avx2, avx512 };

const char* to_string(VectorIsa isa);
/// Whether this CPU runs @p isa.
bool cpu_runs(VectorIsa isa);
/// The widest set this CPU runs (baseline off x86-64); decided once.
VectorIsa fastest_isa();
/// Every set this CPU runs, baseline first (the tests try each).
std::vector<VectorIsa> supported_isas();
/// Whether this CPU converts between f32 and f16 in hardware (AVX with F16C,
/// x86-64 only); decided once.
bool cpu_has_f16c();

}  // namespace dtp::cpu
