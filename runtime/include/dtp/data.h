/// @file data.h
/// @brief Token data: a seeded synthetic stream with structure a small model
/// learns in seconds, byte-level tokens of any text file, and a sampler that
/// gives each data-parallel rank its slice of the global batch.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dtp/device.h"
#include "dtp/tensor.h"

namespace dtp {

/// The synthetic stream: a bank of `patterns` random phrases (lengths in
/// [min_length, max_length], tokens uniform over the vocabulary) is drawn from
/// the seed; the stream is those phrases in random order, each token replaced
/// by a random one with probability `noise`. A model first learns which tokens
/// are frequent, then bigrams, then (with attention) which phrase it is in.
/// The loss floor is roughly ln(patterns) / mean phrase length.
struct SyntheticConfig {
  int vocab_size = 64;            ///< token ids in [0, vocab_size)
  std::int64_t length = 1 << 20;  ///< tokens in the stream
  int patterns = 32;              ///< phrases in the bank
  int min_length = 4;             ///< shortest phrase
  int max_length = 12;            ///< longest phrase
  double noise = 0.0;             ///< probability that a token is replaced by a random one
  std::uint64_t seed = 1;         ///< same seed, same stream
};

/// A read-only sequence of token ids in [0, vocab_size). Copies share the tokens.
class TokenDataset {
 public:
  /// The synthetic stream described by @p config (same config, same tokens).
  static TokenDataset synthetic(const SyntheticConfig& config);
  /// Every byte of the file is a token (vocabulary 256). Throws dtp::Error
  /// naming the file when it cannot be read or is empty.
  static TokenDataset from_text_file(const std::string& path);
  /// Wraps given tokens (each must be in [0, vocab_size)).
  static TokenDataset from_tokens(std::vector<std::int32_t> tokens, int vocab_size,
                                  std::string name);

  /// Token ids are in [0, vocab_size()).
  int vocab_size() const { return vocab_size_; }
  /// Number of tokens.
  std::int64_t size() const { return static_cast<std::int64_t>(tokens_->size()); }
  /// All tokens.
  const std::vector<std::int32_t>& tokens() const { return *tokens_; }
  /// "synthetic (seed 1, 32 patterns)" or the file path.
  const std::string& name() const { return name_; }

 private:
  std::shared_ptr<const std::vector<std::int32_t>> tokens_;
  int vocab_size_ = 0;
  std::string name_;
};

/// Inputs and next-token targets, both i32 [batch, seq].
struct Batch {
  Tensor inputs;   ///< tokens [batch, seq]
  Tensor targets;  ///< the next token of each input [batch, seq]
};

/// Cuts batches of windows out of a dataset. Sample g (0 <= g < global_batch)
/// of step s starts at a position drawn from (seed, s, g) alone, so the global
/// batch is the same for every world size; rank r of w gets the contiguous
/// samples [r * global_batch / w, (r + 1) * global_batch / w).
class BatchSampler {
 public:
  /// Throws dtp::Error when global_batch does not divide by world (naming
  /// both), when rank is outside [0, world), or when the dataset is shorter
  /// than one sequence plus its last target (naming the dataset).
  BatchSampler(TokenDataset data, std::int64_t global_batch, std::int64_t seq, int rank = 0,
               int world = 1, std::uint64_t seed = 0);
  /// Sequences per step over all ranks.
  std::int64_t global_batch() const { return global_batch_; }
  /// Sequences per step on this rank: global_batch / world.
  std::int64_t local_batch() const { return global_batch_ / world_; }
  /// Tokens per sequence.
  std::int64_t seq() const { return seq_; }
  /// This rank.
  int rank() const { return rank_; }
  /// Number of data-parallel ranks.
  int world() const { return world_; }
  /// Index of this rank's first sample in the global batch.
  std::int64_t first_sample() const { return rank_ * local_batch(); }
  /// Where sample @p global_index of step @p step starts in the dataset.
  std::int64_t sample_start(std::int64_t step, std::int64_t global_index) const;
  /// This rank's slice of step @p step's global batch.
  Batch batch(std::int64_t step, Device device = Device::cpu()) const;
  /// Samples [first, first + count) of step @p step's global batch (checkers
  /// compare a rank's slice with the single-device batch through this).
  Batch samples(std::int64_t step, std::int64_t first, std::int64_t count,
                Device device = Device::cpu()) const;
  /// The dataset batches are cut from.
  const TokenDataset& data() const { return data_; }

 private:
  TokenDataset data_;
  std::int64_t global_batch_;
  std::int64_t seq_;
  int rank_;
  int world_;
  std::uint64_t seed_;
};

}  // namespace dtp
