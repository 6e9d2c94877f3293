// Data: the synthetic stream and text files are deterministic; the sampler
// gives each data-parallel rank its contiguous slice of the global batch.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <set>
#include <string>

#include "dtp/data.h"
#include "dtp/error.h"
#include "dtp/ops.h"

namespace dtp {
namespace {

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "dtp_nn_data_" + name;
}

TEST(NnData, SyntheticStreamIsDeterministicAndStructured) {
  SyntheticConfig config;
  config.length = 20000;
  TokenDataset a = TokenDataset::synthetic(config), b = TokenDataset::synthetic(config);
  EXPECT_EQ(a.tokens(), b.tokens());
  EXPECT_EQ(a.size(), 20000);
  EXPECT_EQ(a.vocab_size(), 64);
  for (std::int32_t t : a.tokens()) ASSERT_TRUE(t >= 0 && t < 64);
  config.seed = 2;
  EXPECT_NE(TokenDataset::synthetic(config).tokens(), a.tokens());
  // Phrases repeat: far fewer distinct 4-grams than a uniform stream would give.
  std::set<std::vector<std::int32_t>> four_grams;
  for (std::size_t i = 0; i + 4 <= a.tokens().size(); ++i)
    four_grams.insert({a.tokens().begin() + i, a.tokens().begin() + i + 4});
  EXPECT_LT(four_grams.size(), 5000u);  // a uniform stream: about 19,000
  config.patterns = 0;
  EXPECT_THROW(TokenDataset::synthetic(config), Error);
}

TEST(NnData, TextFilesAreByteTokensAndErrorsNameTheFile) {
  const std::string path = temp_path("text.txt");
  {
    std::ofstream out(path, std::ios::binary);
    out << "hello\xff";
  }
  TokenDataset text = TokenDataset::from_text_file(path);
  EXPECT_EQ(text.vocab_size(), 256);
  EXPECT_EQ(text.tokens(), (std::vector<std::int32_t>{'h', 'e', 'l', 'l', 'o', 255}));
  EXPECT_EQ(text.name(), path);
  try {
    BatchSampler sampler(text, 2, 8);
    FAIL() << "6 bytes cannot make a sequence of 8";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("needs 9"), std::string::npos) << e.what();
  }
  std::remove(path.c_str());
  const std::string missing = temp_path("does_not_exist.txt");
  try {
    TokenDataset::from_text_file(missing);
    FAIL() << "a missing file must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
  }
}

TEST(NnData, RanksGetContiguousSlicesOfTheSameGlobalBatch) {
  SyntheticConfig config;
  config.length = 5000;
  TokenDataset data = TokenDataset::synthetic(config);
  const std::int64_t global = 12, seq = 9;
  BatchSampler single(data, global, seq, 0, 1, 7);
  for (std::int64_t step : {0, 1, 5}) {
    Batch full = single.batch(step);
    ASSERT_EQ(full.inputs.shape(), (Shape{global, seq}));
    // Targets are the inputs shifted by one token.
    for (std::int64_t i = 0; i < global; ++i) {
      const std::int64_t start = single.sample_start(step, i);
      for (std::int64_t t = 0; t < seq; ++t) {
        EXPECT_EQ(full.inputs.item(i * seq + t), data.tokens()[start + t]);
        EXPECT_EQ(full.targets.item(i * seq + t), data.tokens()[start + t + 1]);
      }
    }
    for (int world : {2, 3, 4, 6}) {
      for (int rank = 0; rank < world; ++rank) {
        BatchSampler sampler(data, global, seq, rank, world, 7);
        Batch part = sampler.batch(step);
        ASSERT_EQ(part.inputs.shape(), (Shape{global / world, seq}));
        const std::int64_t offset = rank * (global / world) * seq;
        for (std::int64_t i = 0; i < part.inputs.numel(); ++i) {
          ASSERT_EQ(part.inputs.item(i), full.inputs.item(offset + i))
              << "world " << world << " rank " << rank << " step " << step << " element " << i;
          ASSERT_EQ(part.targets.item(i), full.targets.item(offset + i));
        }
      }
    }
  }
  // Steps differ; the same seed gives the same batches.
  EXPECT_FALSE(ops::equal(single.batch(0).inputs, single.batch(1).inputs));
  BatchSampler again(data, global, seq, 0, 1, 7);
  EXPECT_TRUE(ops::equal(again.batch(3).inputs, single.batch(3).inputs));
}

TEST(NnData, SamplerErrorsNameTheNumbers) {
  TokenDataset data = TokenDataset::from_tokens(std::vector<std::int32_t>(100, 1), 4, "ones");
  try {
    BatchSampler sampler(data, 10, 8, 0, 4);
    FAIL() << "a global batch of 10 over 4 ranks must be rejected";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("(10)"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("(4)"), std::string::npos) << e.what();
  }
  EXPECT_THROW(BatchSampler(data, 8, 8, 4, 4), Error);
  EXPECT_THROW(BatchSampler(data, 8, 0), Error);
  EXPECT_THROW(TokenDataset::from_tokens({0, 5}, 4, "bad"), Error);
}

}  // namespace
}  // namespace dtp
