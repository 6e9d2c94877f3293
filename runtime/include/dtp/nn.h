/// @file nn.h
/// @brief A small GPT with explicit forward and backward: the model that
/// chapters 02-08 parallelize. This header gathers its parts:
/// dtp/gpt_config.h (its shape), dtp/unit.h (units and their flat
/// buffers), dtp/layers.h, dtp/moe.h and dtp/gpt.h (the units and the model).
///
/// The model is a list of **units**: the embedding, one unit per transformer
/// block, and the head (final LayerNorm, LM head, cross-entropy). Each unit
/// keeps its parameters in one flat buffer and its gradients in another; every
/// named parameter is a view into them. So a DDP bucket, a ZeRO shard or an
/// FSDP unit is just a slice or a whole buffer.
///
/// Layers hold no activations. Their forward fills a `...Saved` struct with
/// exactly what the backward needs (charged to MemoryCategory::activations);
/// the caller keeps it and hands it back to backward, which releases it. That
/// way a pipeline schedule can keep several micro-batches in flight, and
/// activation checkpointing can drop and recompute them.
///
/// Conventions: activations are [B, T, C]; parameter gradients accumulate (+=)
/// until zero_grad(); activation gradients are transient and charged to
/// MemoryCategory::other.
#pragma once

#include "dtp/gpt.h"
#include "dtp/gpt_config.h"
#include "dtp/layers.h"
#include "dtp/moe.h"
#include "dtp/unit.h"
