// The checkers of puzzles 10.1, 10.2 and 10.5: the checker's own block
// quantizer and its own reading of the contract's packed words, its replay
// of sign compression with error feedback, and the wire-byte formulas.
//
// Every expected value is computed here in the contract's order of
// operations, each one rounded to the checker's dtype. In f32 that is a
// double operation rounded to float, which gives the float operation's
// bits: double carries more than twice float's precision, so rounding twice
// never shows for +, -, * and /. So codes, scales and values are compared
// bit for bit in f64 and in f32 alike, on every device: the compressors
// compute on the host (the contract's file comment), so a GPU changes where
// the tensors live, not the arithmetic. The data of 10.2 and 10.5 is made
// on the rank's device (comm.device()) in data_dtype() and read back with
// to_vector(); 10.1 is host-only, so its data is made on the CPU.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "10_compression/compression.h"
#include "support/checker_precision.h"
#include "support/harness.h"

namespace dtp::testing::compression {

/// The dtype the chapter's data is made in: f64 on the CPU, f32 under
/// DTP_CHECK_DTYPE=f32 and on a GPU (checker_dtype() of checker_device(),
/// which is every rank's comm.device() too).
inline DType data_dtype() { return checker_dtype(); }

/// @p value rounded to @p dtype (f32 or f64).
inline double in_dtype(DType dtype, double value) {
  return dtype == DType::f32 ? static_cast<double>(static_cast<float>(value)) : value;
}

/// Equal bit for bit (so 0 and -0 differ, as replicas must not).
inline bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

/// All 17 significant digits: enough to tell any two doubles apart.
inline std::string text(double value) {
  std::ostringstream out;
  out.precision(17);
  out << value;
  return out.str();
}

inline std::int64_t blocks_of(std::int64_t count, std::int64_t block) {
  return (count + block - 1) / block;
}

/// Bytes of @p count values quantized to @p bits in blocks of @p block:
/// 4 bytes per packed word plus one scale of @p dtype per block.
inline std::int64_t wire_bytes(std::int64_t count, int bits, std::int64_t block, DType dtype) {
  return 4 * dtp::ch10::packed_words(count, bits) +
         blocks_of(count, block) * static_cast<std::int64_t>(dtype_size(dtype));
}
/// "4 * packed_words(203, 8) + 7 * 8".
inline std::string wire_formula(std::int64_t count, int bits, std::int64_t block, DType dtype) {
  std::ostringstream out;
  out << "4 * packed_words(" << count << ", " << bits << ") + " << blocks_of(count, block) << " * "
      << dtype_size(dtype);
  return out.str();
}

/// The message of a dtp::Error thrown by @p fn; "(no error)" when it returns,
/// and what else it threw otherwise (an unsolved stub is not a refusal).
inline std::string dtp_error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const dtp::Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("(not a dtp::Error: ") + e.what() + ")";
  }
  return "(no error)";
}
/// True when @p message (from dtp_error_of) is a dtp::Error's.
inline bool refused(const std::string& message) {
  return message != "(no error)" && message.rfind("(not a dtp::Error", 0) != 0;
}

// --- 10.1: the checker's own quantizer ------------------------------------------

/// What the contract's quantizer makes of some values: per block its scale,
/// per value its code and the value dequantized back.
struct Quantization {
  std::vector<double> scales;
  std::vector<std::int64_t> codes;
  std::vector<double> values;  // code * scale, in the dtype
  std::vector<double> ratios;  // x / scale, in the dtype, before rounding (0 for scale 0)
};

/// @p x (values of @p dtype) quantized as the contract says: scale = max |x|
/// / max_code, code = nearbyint(x / scale) clamped, each step in @p dtype.
inline Quantization quantize_like_the_contract(const std::vector<double>& x, DType dtype, int bits,
                                               std::int64_t block) {
  const auto n = static_cast<std::int64_t>(x.size());
  const double largest_code = dtp::ch10::max_code(bits);
  Quantization q;
  for (std::int64_t first = 0; first < n; first += block) {
    const std::int64_t end = std::min(first + block, n);
    double largest = 0;
    for (std::int64_t i = first; i < end; ++i)
      largest = std::max(largest, std::fabs(x[static_cast<std::size_t>(i)]));
    const double scale = in_dtype(dtype, largest / largest_code);
    q.scales.push_back(scale);
    for (std::int64_t i = first; i < end; ++i) {
      const double ratio =
          scale == 0 ? 0.0 : in_dtype(dtype, x[static_cast<std::size_t>(i)] / scale);
      // An integer code: nearbyint's -0 is the code 0, which comes back as +0.
      const auto code =
          static_cast<std::int64_t>(std::clamp(std::nearbyint(ratio), -largest_code, largest_code));
      q.ratios.push_back(ratio);
      q.codes.push_back(code);
      q.values.push_back(in_dtype(dtype, static_cast<double>(code) * scale));
    }
  }
  return q;
}

/// The words of a packed code tensor, as the checker reads them.
inline std::vector<std::uint32_t> words_of(const Tensor& codes) {
  std::vector<std::uint32_t> words(static_cast<std::size_t>(codes.numel()));
  if (!words.empty()) std::memcpy(words.data(), codes.data<std::int32_t>(), words.size() * 4);
  return words;
}

/// The @p bits-bit field of value @p i, unsigned: bits [(i b) mod 32, ... + b)
/// of word floor(i b / 32), counted from the least significant bit.
inline std::uint32_t field_of(const std::vector<std::uint32_t>& words, std::int64_t i, int bits) {
  const std::int64_t bit = i * bits;
  return (words[static_cast<std::size_t>(bit / 32)] >> (bit % 32)) & ((1u << bits) - 1);
}

/// Code @p i read the contract's way: a b-bit two's complement number.
inline std::int64_t code_of(const std::vector<std::uint32_t>& words, std::int64_t i, int bits) {
  const auto field = static_cast<std::int64_t>(field_of(words, i, bits));
  return field >= (std::int64_t{1} << (bits - 1)) ? field - (std::int64_t{1} << bits) : field;
}

/// The checker's own packing of @p codes, for handing dequantize_blocks
/// codes that quantize_blocks did not make.
inline Tensor pack_like_the_contract(const std::vector<std::int64_t>& codes, int bits) {
  const auto n = static_cast<std::int64_t>(codes.size());
  std::vector<std::uint32_t> words(static_cast<std::size_t>(dtp::ch10::packed_words(n, bits)));
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t bit = i * bits;
    const auto field =
        static_cast<std::uint32_t>(codes[static_cast<std::size_t>(i)]) & ((1u << bits) - 1);
    words[static_cast<std::size_t>(bit / 32)] |= field << (bit % 32);
  }
  Tensor t = Tensor::zeros(Shape{static_cast<std::int64_t>(words.size())}, DType::i32);
  if (!words.empty()) std::memcpy(t.data<std::int32_t>(), words.data(), words.size() * 4);
  return t;
}

/// What a wrong code looks like, in words ("" when nothing fits).
inline std::string code_mistake(double ratio, std::int64_t expected, std::int64_t got, int bits,
                                std::int64_t field_from_top) {
  const auto half = std::int64_t{1} << (bits - 1);
  if (got == static_cast<std::int64_t>(std::round(ratio)) &&
      std::fabs(ratio) - std::floor(std::fabs(ratio)) == 0.5)
    return "looks like round-half-away (std::round) instead of ties-to-even (std::nearbyint)";
  if (got == static_cast<std::int64_t>(std::trunc(ratio)))
    return "looks like truncation toward zero (a cast) instead of rounding to nearest";
  if (got == static_cast<std::int64_t>(std::floor(ratio)))
    return "looks like floor instead of rounding to nearest";
  if (((got - expected) % (2 * half) + 2 * half) % (2 * half) == half)
    return "looks like offset binary (code + 2^(b-1)) instead of two's complement";
  if (field_from_top == expected)
    return "the code sits at the mirrored place: value i belongs at bits [(i b) mod 32, ...), "
           "counted from the least significant bit of word floor(i b / 32)";
  if (std::fabs(ratio) > static_cast<double>(half - 1) + 0.5)
    return "x / scale rounds past max_code here: clamp the code to [-max_code, max_code]";
  return "";
}

/// What a wrong scale looks like, in words ("" when nothing fits).
inline std::string scale_mistake(const std::vector<double>& x, std::int64_t first, std::int64_t end,
                                 DType dtype, int bits, double expected, double got) {
  double largest = 0, most_positive = -std::numeric_limits<double>::infinity();
  for (std::int64_t i = first; i < end; ++i) {
    largest = std::max(largest, std::fabs(x[static_cast<std::size_t>(i)]));
    most_positive = std::max(most_positive, x[static_cast<std::size_t>(i)]);
  }
  const double half = static_cast<double>(std::int64_t{1} << (bits - 1));
  if (same_bits(got, in_dtype(dtype, largest / half)))
    return "divides by 2^(b-1) instead of max_code(b) = 2^(b-1) - 1";
  if (same_bits(got, largest) && expected != largest)
    return "the block's max |x| itself: divide it by max_code(bits)";
  if (got == 0 && largest != 0 && most_positive <= 0)
    return "0, but every value of this block is negative or 0: the max was taken over x (from "
           "0), not over |x|";
  if (same_bits(got, in_dtype(dtype, most_positive / dtp::ch10::max_code(bits))))
    return "the block's largest x, not its largest |x| (this block's largest magnitude is "
           "negative)";
  if (largest != 0 && same_bits(got, in_dtype(dtype, dtp::ch10::max_code(bits) / largest)))
    return "max_code / max |x|: the scale is max |x| / max_code";
  return "";
}

/// "" when @p got is @p x quantized as the contract says, with its codes
/// packed as it says (read here word by word); else the first mistake, by
/// element and block, with expected and got. @p what names the call.
inline std::string check_quantized(const std::string& what, const std::vector<double>& x,
                                   DType dtype, int bits, std::int64_t block,
                                   const dtp::ch10::QuantizedTensor& got) {
  const auto n = static_cast<std::int64_t>(x.size());
  const std::int64_t words = dtp::ch10::packed_words(n, bits), blocks = blocks_of(n, block);
  std::ostringstream out;
  out << what << ": ";
  if (got.bits != bits || got.block != block || got.numel != n) {
    out << "the QuantizedTensor says bits " << got.bits << ", block " << got.block << ", numel "
        << got.numel << "; expected bits " << bits << ", block " << block << ", numel " << n;
    return out.str();
  }
  if (!got.codes.defined() || got.codes.dtype() != DType::i32 || got.codes.numel() != words) {
    out << "codes must be " << words << " i32 words (packed_words(" << n << ", " << bits
        << ")), got " << (got.codes.defined() ? got.codes.describe() : "an undefined tensor");
    if (got.codes.defined() && got.codes.numel() == n && words != n)
      out << ": one code per word; pack " << 32 / bits << " codes into each word";
    return out.str();
  }
  if (!got.scales.defined() || got.scales.dtype() != dtype || got.scales.numel() != blocks) {
    out << "scales must be " << blocks << " " << dtype_name(dtype) << " values (one per block of "
        << block << "), got "
        << (got.scales.defined() ? got.scales.describe() : "an undefined tensor");
    return out.str();
  }
  if (got.wire_bytes() != wire_bytes(n, bits, block, dtype)) {
    out << "wire_bytes() is " << got.wire_bytes() << ", expected "
        << wire_formula(n, bits, block, dtype) << " = " << wire_bytes(n, bits, block, dtype);
    return out.str();
  }
  const Quantization expected = quantize_like_the_contract(x, dtype, bits, block);
  const std::vector<double> scales = got.scales.to_vector();
  for (std::int64_t b = 0; b < blocks; ++b) {
    const double want = expected.scales[static_cast<std::size_t>(b)];
    const double have = scales[static_cast<std::size_t>(b)];
    if (same_bits(want, have)) continue;
    const std::int64_t first = b * block, end = std::min(first + block, n);
    const std::string why = scale_mistake(x, first, end, dtype, bits, want, have);
    out << "block " << b << " (elements " << first << " to " << end - 1 << "): scale expected "
        << text(want) << " (max |x| = " << text(want * dtp::ch10::max_code(bits)) << " / "
        << dtp::ch10::max_code(bits) << "), got " << text(have) << (why.empty() ? "" : ": ") << why;
    return out.str();
  }
  const std::vector<std::uint32_t> packed = words_of(got.codes);
  std::int64_t wrong = 0, first_wrong = -1;
  for (std::int64_t i = 0; i < n; ++i)
    if (code_of(packed, i, bits) != expected.codes[static_cast<std::size_t>(i)] && wrong++ == 0)
      first_wrong = i;
  if (wrong == 0) return "";
  const std::int64_t i = first_wrong;
  const std::int64_t bit = i * bits;
  // The same field counted from the word's top bit down: a mirrored layout.
  const std::uint32_t top = packed[static_cast<std::size_t>(bit / 32)] >> (32 - bits - bit % 32);
  const auto top_field = static_cast<std::int64_t>(top & ((1u << bits) - 1));
  const std::int64_t from_top = top_field >= (std::int64_t{1} << (bits - 1))
                                    ? top_field - (std::int64_t{1} << bits)
                                    : top_field;
  const std::int64_t want = expected.codes[static_cast<std::size_t>(i)];
  const std::int64_t have = code_of(packed, i, bits);
  const std::string why =
      code_mistake(expected.ratios[static_cast<std::size_t>(i)], want, have, bits, from_top);
  out << wrong << " of " << n << " codes are wrong, first element " << i << " (block " << i / block
      << ", bits " << bit % 32 << " to " << bit % 32 + bits - 1 << " of word " << bit / 32
      << "): x = " << text(x[static_cast<std::size_t>(i)])
      << ", x / scale = " << text(expected.ratios[static_cast<std::size_t>(i)])
      << ", code expected " << want << ", got " << have << (why.empty() ? "" : ": ") << why;
  return out.str();
}

/// "" when @p got holds @p expected's values bit for bit; else the first
/// wrong element, its block, expected and got, and what it looks like.
inline std::string check_dequantized(const std::string& what, const std::vector<double>& x,
                                     const Quantization& expected, DType dtype, int bits,
                                     std::int64_t block, const std::vector<double>& got) {
  std::int64_t wrong = 0, first = -1;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!same_bits(got[i], expected.values[i]) && wrong++ == 0)
      first = static_cast<std::int64_t>(i);
  if (wrong == 0) return "";
  const auto i = static_cast<std::size_t>(first);
  const std::int64_t b = first / block;
  const double code = static_cast<double>(expected.codes[i]);
  const double scale = expected.scales[static_cast<std::size_t>(b)];
  std::string why;
  if (got[i] == kUnwritten && expected.values[i] != kUnwritten)
    why = "the fill value: never written";
  else if (got[i] == x[i] && x[i] != expected.values[i])
    why = "the input value itself: dequantize from the codes, not from x";
  else if (got[i] == code && code != expected.values[i])
    why = "the code without its scale";
  else if (code < 0 && got[i] == in_dtype(dtype, (code + std::ldexp(1.0, bits)) * scale))
    why = "the code read as an unsigned field: sign-extend its b bits (two's complement)";
  else if (b > 0 && got[i] == code * expected.scales[static_cast<std::size_t>(b - 1)])
    why = "the code times the previous block's scale: value i belongs to block i / block";
  else if (static_cast<std::size_t>(b + 1) < expected.scales.size() &&
           got[i] == code * expected.scales[static_cast<std::size_t>(b + 1)])
    why = "the code times the next block's scale: value i belongs to block i / block";
  std::ostringstream out;
  out << what << ": " << wrong << " of " << got.size() << " values are wrong, first element "
      << first << " (block " << b << ", code " << expected.codes[i] << ", scale " << text(scale)
      << "): expected code * scale = " << text(expected.values[i]) << ", got " << text(got[i])
      << (why.empty() ? "" : ": ") << why;
  return out.str();
}

/// "" when every |x_i - out_i| is within the lesson's bound scale / 2, plus
/// the rounding of x / scale (u |x_i|) and of code * scale (u |out_i|), u the
/// unit roundoff of @p dtype; else the first element past it.
inline std::string check_error_bound(const std::string& what, const std::vector<double>& x,
                                     const std::vector<double>& scales, std::int64_t block,
                                     DType dtype, const std::vector<double>& got) {
  const double u = unit_roundoff(dtype);
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double scale = scales[i / static_cast<std::size_t>(block)];
    const double bound = scale / 2 + u * (std::fabs(x[i]) + std::fabs(got[i]));
    if (std::fabs(x[i] - got[i]) <= bound) continue;
    std::ostringstream out;
    out << what << ": element " << i << " (block " << i / static_cast<std::size_t>(block)
        << "): x = " << text(x[i]) << " came back as " << text(got[i]) << ", off by "
        << text(std::fabs(x[i] - got[i])) << ", more than scale / 2 = " << text(scale / 2)
        << " (+ rounding " << text(bound - scale / 2) << ")";
    return out.str();
  }
  return "";
}

// --- 10.2: the checker's replay of sign compression with error feedback ----------

/// Variants of the replay: the contract's (none), and the mistakes whose
/// results the checkers recognize.
enum class SignMistake {
  none,
  residual_not_carried,  // v = x: the residual never added back
  residual_from_x,       // residual = x - c instead of v - c
  sign_zero_negative,    // sign(0) = -1
  sign_zero_zero,        // sign(0) = 0
  scale_not_mean,        // s = sum |v|, not divided by numel
  not_divided,           // x = c_0 + ... + c_{N-1}, not divided by N
  uncompressed,          // x = the exact mean of the v's
};

inline const char* describe(SignMistake mistake) {
  switch (mistake) {
    case SignMistake::residual_not_carried:
      return "looks like the residual was not carried: v must be x + residual";
    case SignMistake::residual_from_x:
      return "looks like residual = x - c: it must be v - c (x + the old residual - c)";
    case SignMistake::sign_zero_negative:
      return "looks like sign(0) = -1: the contract's sign(0) is +1 (bit 1)";
    case SignMistake::sign_zero_zero:
      return "looks like sign(0) = 0: the contract's sign(0) is +1 (bit 1)";
    case SignMistake::scale_not_mean:
      return "looks like s = sum |v_i| not divided by numel: s is the mean";
    case SignMistake::not_divided:
      return "looks like the c's were summed without dividing by N";
    case SignMistake::uncompressed:
      return "the exact mean of the v's: the vectors were not compressed to s sign(v)";
    case SignMistake::none:
      break;
  }
  return "";
}

/// One step of every rank: inputs[rank] in, the output (the same on every
/// rank) and every rank's residual after.
struct SignStep {
  std::vector<double> output;
  std::vector<std::vector<double>> residuals;  // [rank]
  std::vector<std::vector<double>> v;          // [rank], x + the old residual
};

/// The contract's recurrence over @p inputs [step][rank][element], in its
/// order of operations, each rounded to @p dtype (or the @p mistake's).
inline std::vector<SignStep> replay_sign_all_reduce(
    const std::vector<std::vector<std::vector<double>>>& inputs, DType dtype,
    SignMistake mistake = SignMistake::none) {
  const auto world = inputs.empty() ? std::size_t{0} : inputs[0].size();
  const std::size_t n = world == 0 ? 0 : inputs[0][0].size();
  std::vector<std::vector<double>> residual(world, std::vector<double>(n, 0.0));
  std::vector<SignStep> steps;
  for (const auto& step_inputs : inputs) {
    SignStep step;
    std::vector<std::vector<double>> c(world, std::vector<double>(n));
    for (std::size_t r = 0; r < world; ++r) {
      const std::vector<double>& x = step_inputs[r];
      std::vector<double> v(n);
      double total = 0;
      for (std::size_t i = 0; i < n; ++i) {
        v[i] = mistake == SignMistake::residual_not_carried
                   ? x[i]
                   : in_dtype(dtype, x[i] + residual[r][i]);
        total = in_dtype(dtype, total + std::fabs(v[i]));
      }
      const double s =
          mistake == SignMistake::scale_not_mean ? total : in_dtype(dtype, total / double(n));
      for (std::size_t i = 0; i < n; ++i) {
        double sign = v[i] >= 0 ? 1.0 : -1.0;
        if (v[i] == 0 && mistake == SignMistake::sign_zero_negative) sign = -1.0;
        if (v[i] == 0 && mistake == SignMistake::sign_zero_zero) sign = 0.0;
        c[r][i] = mistake == SignMistake::uncompressed ? v[i] : sign * s;
        residual[r][i] = mistake == SignMistake::uncompressed ? 0.0
                         : mistake == SignMistake::residual_from_x
                             ? in_dtype(dtype, x[i] - c[r][i])
                             : in_dtype(dtype, v[i] - c[r][i]);
      }
      step.v.push_back(v);
    }
    step.output.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      double sum = 0;
      for (std::size_t r = 0; r < world; ++r) sum = in_dtype(dtype, sum + c[r][i]);
      step.output[i] =
          mistake == SignMistake::not_divided ? sum : in_dtype(dtype, sum / double(world));
    }
    step.residuals = residual;
    steps.push_back(step);
  }
  return steps;
}

/// Every mistake the replay knows, for decoding a wrong result.
inline std::vector<SignMistake> sign_mistakes() {
  return {SignMistake::residual_not_carried, SignMistake::residual_from_x,
          SignMistake::sign_zero_negative,   SignMistake::sign_zero_zero,
          SignMistake::scale_not_mean,       SignMistake::not_divided,
          SignMistake::uncompressed};
}

// --- running ranks ----------------------------------------------------------------

/// Runs @p body on @p world ranks; each rank returns "" or what it found
/// wrong. The first rank's failure is reported (with how many other ranks
/// failed too), then @p what, the run. A throw (an unsolved stub included)
/// is a failure naming @p what.
inline void run_and_check(const std::string& what, int world,
                          const std::function<std::string(Comm&)>& body) {
  std::vector<std::string> failures(static_cast<std::size_t>(world));
  try {
    run_ranks(world,
              [&](Comm& comm) { failures[static_cast<std::size_t>(comm.rank())] = body(comm); });
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << " threw: " << e.what();
    return;
  }
  const auto failed = std::count_if(failures.begin(), failures.end(),
                                    [](const std::string& f) { return !f.empty(); });
  for (const std::string& failure : failures) {
    if (failure.empty()) continue;
    ADD_FAILURE() << failure
                  << (failed > 1 ? " (and " + std::to_string(failed - 1) + " more rank(s))" : "")
                  << "\n    [" << what << "]";
    return;
  }
}

/// True when a sweep may stop after a failure: ranks are threads of this
/// process (under mpi every process must make the same runs).
inline bool stop_sweep() {
  return ::testing::Test::HasFailure() && World::from_env(1).backend == Backend::thread;
}

/// The world sizes the chapter's checkers sweep: 1 to 4 (fewer under mpi
/// when mpiexec started fewer processes, and under nccl when there are
/// fewer GPUs).
inline std::vector<int> chapter_worlds() {
  std::vector<int> worlds;
  for (int n : all_world_sizes())
    if (n <= 4) worlds.push_back(n);
  return worlds;
}

/// Library collectives between two snapshots of a rank's stats, "all_gather
/// x2, all_reduce x1" (empty: none).
inline std::map<std::string, std::int64_t> calls_between(const CommStats& before,
                                                         const CommStats& after) {
  std::map<std::string, std::int64_t> calls;
  for (const auto& [kind, count] : after.collective_calls) {
    const auto earlier = before.collective_calls.find(kind);
    const std::int64_t added =
        count - (earlier == before.collective_calls.end() ? 0 : earlier->second);
    if (added != 0) calls[kind] = added;
  }
  return calls;
}
inline std::string calls_text(const std::map<std::string, std::int64_t>& calls) {
  if (calls.empty()) return "no collective";
  std::string out;
  for (const auto& [kind, count] : calls)
    out += (out.empty() ? "" : ", ") + kind + " x" + std::to_string(count);
  return out;
}

}  // namespace dtp::testing::compression
