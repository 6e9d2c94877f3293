/// @file checkpointing.h
/// @brief `dtp train --checkpoint`: which blocks of a run recompute what in
/// their backward (chapter 09's activation policies), for every strategy
/// whose blocks are plain dtp::Block objects.
#pragma once

#include <string>
#include <vector>

#include "dtp/gpt.h"

namespace dtp::drivers {

/// A parsed `--checkpoint` value.
struct CheckpointChoice {
  enum class Kind { none, full, every, selective, offload };
  Kind kind = Kind::none;
  int every = 0;  ///< K of every:K
};

/// Parses none, full, every:K (K >= 1), selective or offload; throws cli::UsageError
/// naming the accepted forms.
CheckpointChoice parse_checkpoint(const std::string& text);

/// Chapter 09's policies as the program links them (puzzles or reference).
struct CheckpointPolicies {
  const ActivationPolicy* full = nullptr;                   ///< 9.1
  const ActivationPolicy* selective = nullptr;              ///< 9.3
  const ActivationPolicy* offload = nullptr;                ///< 9.4
  std::vector<bool> (*every)(int layers, int k) = nullptr;  ///< 9.2's checkpoint_every
};

/// The program's policies: chapter 09's driver file defines them, and
/// registered_strategies.cpp hands them over at startup (set_...) in the
/// programs that list the strategies, which link every chapter. Throws
/// dtp::Error in a program that has none.
const CheckpointPolicies& checkpoint_policies();
/// Makes @p policies the program's.
void set_checkpoint_policies(const CheckpointPolicies& policies);

/// Throws dtp::Error when @p text cannot apply to @p model (selective
/// recomputation with flash attention).
void check_checkpoint_fits(const std::string& text, const GPTConfig& model);

/// Installs @p text's policies on every block of @p model (a pipeline stage
/// runs some of them; every:K counts from block 0 of the whole model).
void install_checkpointing(const std::string& text, GPT& model);

/// "activation checkpointing: ..." for the run's header; empty for none.
std::string checkpoint_header(const std::string& text, int layers);

}  // namespace dtp::drivers
