// Token datasets and the batch sampler.
#include "dtp/data.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "dtp/error.h"
#include "dtp/nn_ops.h"

namespace dtp {

TokenDataset TokenDataset::synthetic(const SyntheticConfig& c) {
  DTP_CHECK(c.vocab_size >= 2, "synthetic data: vocab_size must be at least 2, got ", c.vocab_size);
  DTP_CHECK(c.patterns >= 1, "synthetic data: patterns must be at least 1, got ", c.patterns);
  DTP_CHECK(c.min_length >= 1 && c.max_length >= c.min_length,
            "synthetic data: need 1 <= min_length <= max_length, got ", c.min_length, " and ",
            c.max_length);
  DTP_CHECK(c.length >= 2, "synthetic data: length must be at least 2, got ", c.length);
  DTP_CHECK(c.noise >= 0 && c.noise <= 1, "synthetic data: noise must be in [0, 1], got ", c.noise);
  Rng bank_rng(Rng::derive(c.seed, 0));
  std::vector<std::vector<std::int32_t>> bank(static_cast<std::size_t>(c.patterns));
  for (auto& phrase : bank) {
    const std::int64_t length = c.min_length + bank_rng.below(c.max_length - c.min_length + 1);
    for (std::int64_t i = 0; i < length; ++i)
      phrase.push_back(static_cast<std::int32_t>(bank_rng.below(c.vocab_size)));
  }
  Rng stream_rng(Rng::derive(c.seed, 1));
  std::vector<std::int32_t> tokens;
  tokens.reserve(static_cast<std::size_t>(c.length));
  while (static_cast<std::int64_t>(tokens.size()) < c.length) {
    const auto& phrase = bank[static_cast<std::size_t>(stream_rng.below(c.patterns))];
    for (std::int32_t token : phrase) {
      if (static_cast<std::int64_t>(tokens.size()) == c.length) break;
      if (c.noise > 0 && stream_rng.uniform() < c.noise)
        token = static_cast<std::int32_t>(stream_rng.below(c.vocab_size));
      tokens.push_back(token);
    }
  }
  return from_tokens(std::move(tokens), c.vocab_size,
                     "synthetic (seed " + std::to_string(c.seed) + ", " +
                         std::to_string(c.patterns) + " patterns)");
}

TokenDataset TokenDataset::from_text_file(const std::string& path) {
  std::error_code error;
  DTP_CHECK(!std::filesystem::is_directory(path, error), "data file '", path,
            "' is a directory; give a text file");
  std::ifstream in(path, std::ios::binary);
  DTP_CHECK(in.good(), "cannot read data file '", path, "': ", std::strerror(errno));
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  DTP_CHECK(!in.bad(), "error while reading data file '", path, "'");
  DTP_CHECK(!bytes.empty(), "data file '", path, "' is empty");
  std::vector<std::int32_t> tokens(bytes.size());
  for (std::size_t i = 0; i < bytes.size(); ++i)
    tokens[i] = static_cast<std::int32_t>(static_cast<unsigned char>(bytes[i]));
  return from_tokens(std::move(tokens), 256, path);
}

TokenDataset TokenDataset::from_tokens(std::vector<std::int32_t> tokens, int vocab_size,
                                       std::string name) {
  DTP_CHECK(vocab_size >= 1, "dataset '", name, "': vocab_size must be at least 1, got ",
            vocab_size);
  for (std::size_t i = 0; i < tokens.size(); ++i)
    DTP_CHECK(tokens[i] >= 0 && tokens[i] < vocab_size, "dataset '", name, "': token ", tokens[i],
              " at position ", i, " is outside [0, ", vocab_size, ")");
  TokenDataset out;
  out.tokens_ = std::make_shared<const std::vector<std::int32_t>>(std::move(tokens));
  out.vocab_size_ = vocab_size;
  out.name_ = std::move(name);
  return out;
}

BatchSampler::BatchSampler(TokenDataset data, std::int64_t global_batch, std::int64_t seq, int rank,
                           int world, std::uint64_t seed)
    : data_(std::move(data)),
      global_batch_(global_batch),
      seq_(seq),
      rank_(rank),
      world_(world),
      seed_(seed) {
  DTP_CHECK(global_batch >= 1, "sampler: the global batch must be at least 1, got ", global_batch);
  DTP_CHECK(seq >= 1, "sampler: the sequence length must be at least 1, got ", seq);
  DTP_CHECK(world >= 1, "sampler: world size must be at least 1, got ", world);
  DTP_CHECK(rank >= 0 && rank < world, "sampler: rank ", rank, " is outside [0, ", world, ")");
  DTP_CHECK(global_batch % world == 0, "sampler: the global batch (", global_batch,
            ") does not divide by the world size (", world,
            "); every data-parallel rank needs the same number of samples");
  std::int64_t tokens_per_step = 0;
  DTP_CHECK(!__builtin_mul_overflow(global_batch, seq, &tokens_per_step),
            "sampler: batch x seq = ", global_batch, " x ", seq,
            " tokens per step overflows a 64-bit count");
  // size - 1 >= seq, not size >= seq + 1: seq + 1 overflows for the largest seq.
  DTP_CHECK(data_.size() - 1 >= seq, "data '", data_.name(), "' has ", data_.size(),
            " tokens, but one sequence of ", seq, " needs ", seq + 1,
            " (its inputs plus the last target)");
}

std::int64_t BatchSampler::sample_start(std::int64_t step, std::int64_t global_index) const {
  Rng rng(Rng::derive(Rng::derive(seed_, static_cast<std::uint64_t>(step)),
                      static_cast<std::uint64_t>(global_index)));
  return rng.below(data_.size() - seq_);  // the window and its last target fit
}

Batch BatchSampler::samples(std::int64_t step, std::int64_t first, std::int64_t count,
                            Device device) const {
  DTP_CHECK(first >= 0 && count >= 0 && first + count <= global_batch_, "sampler: samples [", first,
            ", ", first + count, ") are outside the global batch of ", global_batch_);
  // Cut on the host, then moved to the device in one copy each.
  Batch batch{Tensor::empty({count, seq_}, DType::i32), Tensor::empty({count, seq_}, DType::i32)};
  std::int32_t* inputs = batch.inputs.data<std::int32_t>();
  std::int32_t* targets = batch.targets.data<std::int32_t>();
  const std::int32_t* tokens = data_.tokens().data();
  for (std::int64_t i = 0; i < count; ++i) {
    const std::int64_t start = sample_start(step, first + i);
    std::memcpy(inputs + i * seq_, tokens + start, static_cast<std::size_t>(seq_) * 4);
    std::memcpy(targets + i * seq_, tokens + start + 1, static_cast<std::size_t>(seq_) * 4);
  }
  if (!device.is_cpu()) batch = {batch.inputs.to(device), batch.targets.to(device)};
  return batch;
}

Batch BatchSampler::batch(std::int64_t step, Device device) const {
  return samples(step, first_sample(), local_batch(), device);
}

}  // namespace dtp
