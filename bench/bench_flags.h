// The command-line options the benchmark programs share, on CLI11 (through
// dtp_cli.h). Only the files that build a program's CLI::App include it:
// CLI11's header costs about 5 s of compile time in every file that does.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "dtp/trainer.h"
#include "dtp_cli.h"
#include "number_text.h"

namespace dtp::bench {

/// A link's cost given as "ALPHA_US,GBPS" (--nvlink, --infiniband).
struct LinkCost {
  double alpha_s;        ///< per message
  double bandwidth_Bps;  ///< per direction per GPU
};

/// Parses @p text as "ALPHA_US,GBPS": two decimal numbers, alpha >= 0 and
/// GB/s > 0. Anything else is a CLI::ValidationError naming @p flag.
inline LinkCost parse_link(const std::string& flag, const std::string& text) {
  auto bad = [&] {
    return CLI::ValidationError(
        flag, "takes ALPHA_US,GBPS (two numbers), alpha >= 0 and GB/s > 0, got '" + text + "'");
  };
  const std::size_t comma = text.find(',');
  if (comma == std::string::npos) throw bad();
  auto number = [&](const std::string& part) {
    const std::optional<double> value = dtp::cli::parse_real_text(part);  // decimal and finite
    if (!value) throw bad();
    return *value;
  };
  const double alpha_us = number(text.substr(0, comma)), gbps = number(text.substr(comma + 1));
  if (alpha_us < 0 || gbps <= 0) throw bad();
  return {alpha_us * 1e-6, gbps * 1e9};
}

/// The model's shape: --layers, --d-model and --heads, read into @p model.
inline void add_shape_options(CLI::App& app, dtp::GPTConfig& model) {
  app.add_option("--layers", model.layers, "transformer blocks")
      ->check(dtp::cli::Range(1, 256))
      ->capture_default_str();
  app.add_option("--d-model", model.d_model, "width C (must divide by --heads)")
      ->check(dtp::cli::Range(1, 1 << 16))
      ->capture_default_str();
  app.add_option("--heads", model.heads, "attention heads")
      ->check(dtp::cli::Range(1, 1 << 16))
      ->capture_default_str();
  dtp::cli::require_heads_divide_width(app, model.d_model, model.heads);
}

/// A training benchmark's data and precision: --seq, --vocab and --dtype
/// (f32 or f64, said as @p dtype_help), read into @p config.
inline void add_training_shape_options(CLI::App& app, dtp::TrainConfig& config,
                                       const std::string& dtype_help) {
  add_shape_options(app, config.model);
  app.add_option("--seq", config.seq, "tokens per sequence")
      ->check(dtp::cli::Range(std::int64_t{1}, std::int64_t{1} << 16))
      ->capture_default_str();
  app.add_option("--vocab", config.model.vocab_size, "vocabulary size")
      ->check(dtp::cli::Range(2, 1 << 24))
      ->capture_default_str();
  app.add_option_function<std::string>(
         "--dtype",
         [&config](const std::string& name) { config.model.dtype = dtp::parse_dtype(name); },
         dtype_help)
      ->check(CLI::IsMember({"f32", "f64"}))
      ->default_str(dtp::dtype_name(config.model.dtype));
}

/// The timed and untimed steps of a measurement: --steps and --warmup.
inline void add_step_options(CLI::App& app, std::int64_t& steps, std::int64_t& warmup) {
  app.add_option("--steps", steps, "timed steps per run")
      ->check(dtp::cli::Range(std::int64_t{1}, std::int64_t{1000000}))
      ->capture_default_str();
  app.add_option("--warmup", warmup, "untimed steps before them")
      ->check(dtp::cli::Range(std::int64_t{0}, std::int64_t{1000000}))
      ->capture_default_str();
}

/// The model and batch-shape flags the training benchmarks share: the shape,
/// --seq, --optimizer and --dtype, read into @p config.
inline void add_model_options(CLI::App& app, dtp::TrainConfig& config) {
  add_shape_options(app, config.model);
  app.add_option("--seq", config.seq, "tokens per sequence")
      ->check(dtp::cli::Range(std::int64_t{1}, std::int64_t{1} << 16))
      ->capture_default_str();
  app.add_option("--optimizer", config.optimizer,
                 "adamw (2 states per parameter) or sgd (momentum: 1 state)")
      ->check(CLI::IsMember({"adamw", "sgd"}))
      ->capture_default_str();
  app.add_option_function<std::string>(
         "--dtype",
         [&config](const std::string& name) { config.model.dtype = dtp::parse_dtype(name); },
         "f32 or f64")
      ->check(CLI::IsMember({"f32", "f64"}))
      ->default_str(dtp::dtype_name(config.model.dtype));
}

}  // namespace dtp::bench
