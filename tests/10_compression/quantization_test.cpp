// Puzzle 10.1: block quantization. quantize_blocks against the checker's
// own quantizer, code by code, read from the packed words by the checker;
// dequantize_blocks on codes the checker packed itself; the round trip
// within half a scale; and the refusals the contract promises. 10.1 is
// host-only (the per-value math): its data is made on the CPU, and the
// suite has no GPU flavour (DTP_HOST_ONLY_SUITES in tests/CMakeLists.txt).
#include "compression_checks.h"

namespace dtp::testing::compression {
namespace {

/// 203 values (odd: no whole number of words for 4 or 8 bits) in segments
/// of 32, each a block when block = 32:
///   0 normal values; 1 small values and one outlier (1e6) that sets the
///   scale; 2 all equal; 3 all zero; 4 a largest magnitude that is negative
///   (-5, exactly representable); 5 exact ties (max_code sets scale 1, then
///   k + 1/2); 6 a short last block of 11, subnormal when @p subnormal_tail
///   (its scale is rounded, so x / scale passes max_code: the clamp's case),
///   normal values otherwise.
std::vector<double> adversarial_values(DType dtype, int bits, bool subnormal_tail = true) {
  Rng rng(1001);
  std::vector<double> x;
  for (int i = 0; i < 32; ++i) x.push_back(3 * rng.normal());
  for (int i = 0; i < 32; ++i) x.push_back(i == 8 ? 1e6 : 0.01 * rng.normal());
  for (int i = 0; i < 32; ++i) x.push_back(0.3);
  for (int i = 0; i < 32; ++i) x.push_back(0.0);
  for (int i = 0; i < 32; ++i) x.push_back(i == 2 ? -5.0 : i == 20 ? 3.0 : 2 * rng.uniform() - 1);
  const double top = dtp::ch10::max_code(bits);
  const std::vector<double> ties = {top,  0.5, -0.5, 1.5,  -1.5, 2.5,  -2.5, 3.5,
                                    -3.5, 4.5, 5.5,  -5.5, 6.5,  -6.5, 1.0,  -top};
  for (int i = 0; i < 32; ++i) x.push_back(ties[static_cast<std::size_t>(i % 16)]);
  // The smallest subnormal of the dtype: 1079 of them / 127 rounds to 8, and 1079 / 8 > 127.
  const double tiny = dtype == DType::f32 ? 0x1p-149 : 0x1p-1074;
  const std::vector<double> tail = {1079, -1079, 540, 7, -300, 1, 0, 2, -1079, 1000, 13};
  for (double t : tail) x.push_back(subnormal_tail ? t * tiny : t / 100);
  for (double& value : x) value = in_dtype(dtype, value);
  return x;
}

std::string call_text(const char* fn, std::size_t n, DType dtype, int bits, std::int64_t block) {
  std::ostringstream out;
  out << fn << "(" << n << " " << dtype_name(dtype) << " values, bits " << bits << ", block "
      << block << ")";
  return out.str();
}

TEST(Puzzle10_1_block_quantization, AdversarialBlocksBitForBit) {
  const DType dtype = data_dtype();
  for (int bits : {8, 4}) {
    const std::vector<double> x = adversarial_values(dtype, bits);
    for (std::int64_t block : {32, 7, 1, 64, 300}) {
      const std::string what = call_text("quantize_blocks", x.size(), dtype, bits, block);
      const dtp::ch10::QuantizedTensor q =
          dtp::ch10::quantize_blocks(Tensor::from_values(x, dtype), bits, block);
      const std::string failure = check_quantized(what, x, dtype, bits, block, q);
      if (!failure.empty()) ADD_FAILURE() << failure;
      if (!failure.empty()) return;
    }
  }
}

// Scale 1 (max_code is the block's largest value), so x / scale is x: every
// k + 1/2 is an exact tie, and ties go to the even neighbour.
TEST(Puzzle10_1_block_quantization, TiesRoundToEven) {
  const DType dtype = data_dtype();
  for (int bits : {8, 4}) {
    const std::vector<double> x = {static_cast<double>(dtp::ch10::max_code(bits)),
                                   0.5,
                                   1.5,
                                   2.5,
                                   -0.5,
                                   -1.5,
                                   -2.5,
                                   3.5,
                                   -4.5,
                                   6.5};
    const auto block = static_cast<std::int64_t>(x.size());
    const std::string what = call_text("quantize_blocks", x.size(), dtype, bits, block);
    const std::string failure =
        check_quantized(what, x, dtype, bits, block,
                        dtp::ch10::quantize_blocks(Tensor::from_values(x, dtype), bits, block));
    if (!failure.empty()) ADD_FAILURE() << failure;
  }
}

// Lengths around a word and a block: the last word partly used, the last
// block short, a single value.
TEST(Puzzle10_1_block_quantization, EveryLengthPacksExactly) {
  const DType dtype = data_dtype();
  for (int bits : {8, 4}) {
    for (std::int64_t n : {1, 3, 5, 9, 31, 33, 65, 100}) {
      Rng rng(static_cast<std::uint64_t>(7 * n + bits));
      std::vector<double> x;
      for (std::int64_t i = 0; i < n; ++i) x.push_back(in_dtype(dtype, rng.normal()));
      for (std::int64_t block : {8, 32}) {
        const std::string what = call_text("quantize_blocks", x.size(), dtype, bits, block);
        const std::string failure =
            check_quantized(what, x, dtype, bits, block,
                            dtp::ch10::quantize_blocks(Tensor::from_values(x, dtype), bits, block));
        if (!failure.empty()) ADD_FAILURE() << failure;
        if (!failure.empty()) return;
      }
    }
  }
}

// dequantize_blocks alone: codes the checker packed itself.
TEST(Puzzle10_1_block_quantization, DequantizeIsCodeTimesScale) {
  const DType dtype = data_dtype();
  for (int bits : {8, 4}) {
    const std::vector<double> x = adversarial_values(dtype, bits);
    for (std::int64_t block : {32, 7}) {
      const Quantization expected = quantize_like_the_contract(x, dtype, bits, block);
      dtp::ch10::QuantizedTensor q;
      q.codes = pack_like_the_contract(expected.codes, bits);
      q.scales = Tensor::from_values(expected.scales, dtype);
      q.bits = bits;
      q.block = block;
      q.numel = static_cast<std::int64_t>(x.size());
      Tensor out = Tensor::full(Shape{q.numel}, kUnwritten, dtype);
      dtp::ch10::dequantize_blocks(q, out);
      const std::string failure =
          check_dequantized(call_text("dequantize_blocks", x.size(), dtype, bits, block), x,
                            expected, dtype, bits, block, out.to_vector());
      if (!failure.empty()) ADD_FAILURE() << failure;
      if (!failure.empty()) return;
    }
  }
}

// The lesson's bound, on the round trip through both halves. Subnormal
// blocks are left out: their scale is itself rounded (see the clamp), and
// no bound in scale / 2 holds there.
TEST(Puzzle10_1_block_quantization, RoundTripWithinHalfAScale) {
  const DType dtype = data_dtype();
  for (int bits : {8, 4}) {
    const std::vector<double> x = adversarial_values(dtype, bits, false);
    for (std::int64_t block : {32, 7, 1, 300}) {
      const dtp::ch10::QuantizedTensor q =
          dtp::ch10::quantize_blocks(Tensor::from_values(x, dtype), bits, block);
      Tensor out = Tensor::full(Shape{q.numel}, kUnwritten, dtype);
      dtp::ch10::dequantize_blocks(q, out);
      const std::string failure = check_error_bound(
          "dequantize_blocks(" + call_text("quantize_blocks", x.size(), dtype, bits, block) + ")",
          x, quantize_like_the_contract(x, dtype, bits, block).scales, block, dtype,
          out.to_vector());
      if (!failure.empty()) ADD_FAILURE() << failure;
      if (!failure.empty()) return;
    }
  }
}

TEST(Puzzle10_1_block_quantization, NonFiniteValuesAreRefusedByIndex) {
  const DType dtype = data_dtype();
  const struct {
    std::int64_t index;
    double value;
  } cases[] = {{45, std::nan("")},
               {71, std::numeric_limits<double>::infinity()},
               {98, -std::numeric_limits<double>::infinity()}};
  for (const auto& bad : cases) {
    std::vector<double> x(150, 0.25);
    x[static_cast<std::size_t>(bad.index)] = bad.value;
    const Tensor t = Tensor::from_values(x, dtype);
    const std::string message = dtp_error_of([&] { dtp::ch10::quantize_blocks(t, 8, 32); });
    if (!refused(message) || message.find(std::to_string(bad.index)) == std::string::npos)
      ADD_FAILURE() << "quantize_blocks of 150 values with x[" << bad.index << "] = " << bad.value
                    << " must throw a dtp::Error naming index " << bad.index
                    << ", got: " << message;
  }
}

TEST(Puzzle10_1_block_quantization, BadBitsOrBlockAreRefused) {
  const DType dtype = data_dtype();
  const Tensor x = Tensor::from_values(std::vector<double>(40, 1.5), dtype);
  for (int bits : {3, 16, 0, 1}) {
    const std::string message = dtp_error_of([&] { dtp::ch10::quantize_blocks(x, bits, 32); });
    if (!refused(message))
      ADD_FAILURE() << "quantize_blocks with bits = " << bits
                    << " must throw a dtp::Error (4 or 8 only), got: " << message;
  }
  for (std::int64_t block : {0, -4}) {
    const std::string message = dtp_error_of([&] { dtp::ch10::quantize_blocks(x, 8, block); });
    if (!refused(message))
      ADD_FAILURE() << "quantize_blocks with block = " << block
                    << " must throw a dtp::Error (a block holds at least 1 value), got: "
                    << message;
  }
  // out of the wrong length: 39 values for 40 codes.
  const std::vector<double> values(40, 1.5);
  const Quantization expected = quantize_like_the_contract(values, dtype, 8, 32);
  dtp::ch10::QuantizedTensor q;
  q.codes = pack_like_the_contract(expected.codes, 8);
  q.scales = Tensor::from_values(expected.scales, dtype);
  q.bits = 8;
  q.block = 32;
  q.numel = 40;
  Tensor short_out = Tensor::zeros(Shape{39}, dtype);
  const std::string message = dtp_error_of([&] { dtp::ch10::dequantize_blocks(q, short_out); });
  if (!refused(message))
    ADD_FAILURE()
        << "dequantize_blocks of 40 values into an out of 39 must throw a dtp::Error, got: "
        << message;
}

}  // namespace
}  // namespace dtp::testing::compression
