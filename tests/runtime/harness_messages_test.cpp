// The checker harness's messages decode pattern values in words, so a student
// reading "got 16777217" learns it is rank 1's element 0 alone. These tests
// pin the decoding for the mistakes students actually make.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "support/harness.h"

namespace {

using dtp::DType;
using dtp::testing::describe_pattern_value;
using dtp::testing::kUnwritten;
using dtp::testing::pattern_sum;
using dtp::testing::pattern_value;
using dtp::testing::pattern_values;
using dtp::testing::PatternKey;
using dtp::testing::PatternMeaning;
using dtp::testing::values_equal;

constexpr PatternKey kSumsOf2{2, DType::f64, PatternMeaning::sums};
constexpr PatternKey kSumsOf4{4, DType::f64, PatternMeaning::sums};
constexpr PatternKey kCopiesOf4{4, DType::f64, PatternMeaning::copies};

std::string message_of(const ::testing::AssertionResult& result) {
  EXPECT_FALSE(result) << "the comparison was expected to fail";
  return result.message();
}

TEST(HarnessMessages, OneRanksValueAloneInsteadOfTheSum) {
  // The example: 2 ranks, element 0; the sum is 16777218.
  std::vector<double> got = pattern_sum(2, 3);
  got[0] = pattern_value(1, 0, DType::f64);  // 16777217
  const std::string message =
      message_of(values_equal("all_reduce", 1, pattern_sum(2, 3), got, 0, kSumsOf2));
  EXPECT_NE(message.find("expected 16777218 = the sum over all 2 ranks of element 0"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("got 16777217 = rank 1's element 0 alone"), std::string::npos) << message;
}

TEST(HarnessMessages, PartialSumNamesTheRanksItHas) {
  const double partial = pattern_value(0, 5, DType::f64) + pattern_value(2, 5, DType::f64);
  EXPECT_EQ(describe_pattern_value(partial, kSumsOf4, 5),
            "the sum over ranks 0 and 2 only of element 5");
}

TEST(HarnessMessages, RankCountedTwice) {
  double twice = pattern_value(3, 7, DType::f64);
  for (int r = 0; r < 4; ++r) twice += pattern_value(r, 7, DType::f64);
  EXPECT_EQ(describe_pattern_value(twice, kSumsOf4, 7),
            "the sum over all 4 ranks of element 7 plus rank 3's value again (added twice)");
}

TEST(HarnessMessages, UnwrittenValueSaysBothCauses) {
  const std::string words = describe_pattern_value(kUnwritten, kCopiesOf4, 0);
  EXPECT_NE(words.find("never written"), std::string::npos) << words;
  EXPECT_NE(words.find("off by one"), std::string::npos) << words;
}

TEST(HarnessMessages, CopyFromTheWrongPlaceIsNamed) {
  // An all-gather that put rank 2's element 1 where rank 1's element 1 belongs.
  std::vector<double> expected = pattern_values(1, 3);
  std::vector<double> got = expected;
  got[1] = pattern_value(2, 1, DType::f64);
  const std::string message =
      message_of(values_equal("all_gather", 0, expected, got, 0, kCopiesOf4));
  EXPECT_NE(
      message.find("expected 16777218 = rank 1's element 1, got 33554434 = rank 2's element 1"),
      std::string::npos)
      << message;
}

TEST(HarnessMessages, NarrowDtypesSayTheIndexRepeats) {
  const PatternKey key{4, DType::f32, PatternMeaning::copies};
  EXPECT_EQ(describe_pattern_value(pattern_value(2, 5000, DType::f32), key, -1),
            "rank 2's element 904 (mod 4096)");
}

TEST(HarnessMessages, ValuesOutsideThePatternAreNotDecoded) {
  EXPECT_EQ(describe_pattern_value(0.5, kSumsOf4, 0), "");
  EXPECT_EQ(describe_pattern_value(1e12, kSumsOf4, 0), "");
  // Without a key nothing is decoded, not even -1 (the data may not be pattern data).
  const std::string message = message_of(values_equal("plain", 0, {1.0}, {-1.0}));
  EXPECT_EQ(message.find("never written"), std::string::npos) << message;
}

}  // namespace
