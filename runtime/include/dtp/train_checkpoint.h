/// @file train_checkpoint.h
/// @brief Parameters in and out of checkpoint files: --load's copy into a
/// model (fine-tuning), and a model's parameters written as a "model"
/// checkpoint (a merged LoRA model). Whole training runs are saved and
/// resumed through Trainer::save and Trainer::resume (dtp/trainer.h).
#pragma once

#include <string>

#include "dtp/checkpoint.h"
#include "dtp/nn.h"
#include "dtp/trainer.h"

namespace dtp {

/// Copies the parameters of a checkpoint into @p model ("params/<unit>.<name>"
/// for each of the model's parameters): fine-tuning from pretrained weights,
/// with no optimizer state and no steps. A file of another float dtype is
/// cast to the model's (f32 to bf16 rounds to nearest even), as PyTorch's
/// load_state_dict does. Throws dtp::Error naming @p path, the first
/// parameter the file lacks or holds with another shape (or not as floats),
/// and the model settings that differ.
void load_parameters(GPT& model, const Checkpoint& checkpoint, const std::string& path);
/// --load: load_parameters() from config.load_path when it is set, nothing
/// otherwise. A strategy that cuts or shards the model calls it before it
/// does: every rank reads the whole file and keeps its part.
void load_parameters(GPT& model, const TrainConfig& config);

/// Writes a "model" checkpoint to @p path: @p model's parameters
/// ("params/<unit>.<name>"), with @p config as its settings; what
/// load_parameters() reads (a merged LoRA model, weights for inference).
void save_parameters(const std::string& path, GPT& model, const TrainConfig& config);

}  // namespace dtp
