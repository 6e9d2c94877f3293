/// @file checkpoint.h
/// @brief Checkpoint files: named tensors and the settings of the run that
/// made them, written so that an interrupted save never leaves a broken file.
///
/// The format (version 1), in order:
///
///     DTPCKPT 1 <H>\n          the magic, the version and H, the header's bytes
///     <header: H bytes of JSON>\n
///     <data: every tensor's bytes, back to back, little-endian>
///
/// The header is one JSON object:
///
///     {"format":"dtp-checkpoint","version":1,"kind":"training","step":200,
///      "config":{...the run's settings, as the log's config line...},
///      "tensors":[{"name":"params/block.0.attn.q.weight","dtype":"f32",
///                  "shape":[64,64],"offset":0,"bytes":16384}, ...],
///      "data_bytes":1234567,"checksum":"fnv1a64:89ab..."}
///
/// The names say what a tensor is. A "model" checkpoint (save_parameters)
/// holds `params/<unit>.<name>` for every parameter. A "training" checkpoint
/// (Trainer::save) holds what the run trains and what it needs to go on:
/// - `params/<unit>.<name>` for the units that train (frozen ones come from
///   --load again);
/// - `extra/<name>` for tensors outside the units: LoRA's adapters
///   (`extra/block.<i>.lora`), mixed precision's f32 masters
///   (`extra/master/<unit>`) and loss scaler (`extra/loss_scaler`: scale,
///   good steps);
/// - `optimizer/<buffer>.<state>` (AdamW's m and v, SGD's momentum) and
///   `optimizer/steps`, the optimizer's own update count.
///
/// The strategies whose ranks hold shards or slices (zero, tp, pp, ep) write
/// the same layout: their rank 0 gathers every rank's part into the full
/// tensors (Trainer::save_gathered), so --load reads any run's file under
/// any strategy.
///
/// Its "config" also holds the strategy's own settings (`strategy_settings`:
/// --world, the ddp flags, the LoRA rank, ...), which a resumed run must share.
///
/// Offsets count from the first data byte; the tensors lie back to back in
/// the order the header lists them. The checksum is 64-bit FNV-1a over the
/// data bytes (the header is checked against itself: every tensor must start
/// where the one before it ended, and be as long as its shape and dtype
/// say). A reader refuses a file whose magic, version, header, sizes or
/// checksum do not hold, naming what is wrong; it never returns part of a
/// file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dtp/json.h"
#include "dtp/tensor.h"

namespace dtp {

/// A tensor and the name it has in a checkpoint.
struct NamedTensor {
  std::string name;  ///< e.g. "params/block.0.attn.q.weight"
  Tensor tensor;     ///< any device; stored from (and read into) host memory
};

/// What a checkpoint file holds.
struct Checkpoint {
  /// "training" (parameters, optimizer state, step) or "model" (parameters).
  std::string kind = "training";
  std::int64_t step = 0;             ///< optimizer steps done when it was saved
  JsonValue config;                  ///< the settings of the run that saved it
  std::vector<NamedTensor> tensors;  ///< in file order

  /// The tensor called @p name; throws naming it and the file's names.
  const Tensor& tensor(const std::string& name) const;
  /// True when the file has a tensor called @p name.
  bool has(const std::string& name) const;
};

/// "params/<unit>.<parameter>": the name a checkpoint gives a parameter.
std::string parameter_entry(const std::string& unit, const std::string& parameter);
/// "optimizer/<state>": the name a checkpoint gives an optimizer state
/// tensor (@p state as Optimizer::state() names it: "<buffer>.m", ...).
std::string optimizer_entry(const std::string& state);
/// "optimizer/<buffer>.<kind>": optimizer_entry() of buffer @p buffer's
/// state @p kind ("m", "v", "momentum"; see state_kinds()).
std::string optimizer_entry(const std::string& buffer, const std::string& kind);
/// "extra/<name>": the name a checkpoint gives a tensor outside the units
/// (Trainer::checkpoint_also).
std::string extra_entry(const std::string& name);

/// Writes @p checkpoint to @p path: first to "<path>.tmp", flushed to disk,
/// then renamed over @p path, so a reader sees the old file or the new one,
/// never half of one. Throws dtp::Error naming the path when it cannot.
void write_checkpoint(const std::string& path, const Checkpoint& checkpoint);

/// Reads a whole checkpoint into host tensors. Throws dtp::Error naming the
/// path and what is wrong: not a checkpoint, another version, a header that
/// does not parse, a truncated file, a tensor outside the data, or data
/// whose checksum differs (a corrupt file).
Checkpoint read_checkpoint(const std::string& path);

}  // namespace dtp
