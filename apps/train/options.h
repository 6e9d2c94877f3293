// dtp-train's command line: every flag, its accepted range, and the checks
// that involve several flags. Every error is a UsageError that names the flag
// and what it accepts; main() prints it and exits with status 2.
#pragma once

#include <cstdint>
#include <set>
#include <string>

#include "02_ddp/ddp.h"
#include "03_zero_fsdp/zero.h"
#include "04_tensor_parallel/tensor_parallel.h"
#include "05_pipeline/pipeline.h"
#include "06_sequence_expert/sequence_expert.h"
#include "07_mixed_precision/mixed_precision.h"
#include "08_lora/lora.h"
#include "dtp/trainer.h"

namespace dtp::train_app {

/// A bad command line: the message names the flag and the accepted values.
struct UsageError {
  std::string message;
};

/// Everything the command line sets.
struct Options {
  TrainConfig config;
  ch02::DdpOptions ddp;
  ch03::ZeroOptions zero;      ///< --world sets its world and ddp's alike
  ch04::TensorParallelRunOptions tp;  ///< --tp, --dp, --sequence-parallel
  ch05::PipelineRunOptions pp;        ///< --pp, --dp, --microbatches, --schedule, --chunks, --fsdp
  ch06::SequenceParallelRunOptions sp;  ///< --sp, --sp-kind, --sp-ulysses
  ch06::ExpertParallelRunOptions ep;    ///< --world (with --strategy ep)
  ch07::MixedPrecisionRunOptions mp;    ///< --loss-scale, --reduce-dtype, --world (with --precision)
  std::string precision = "fp32";       ///< --precision: fp32, bf16 or fp16
  ch08::LoraRunOptions lora;            ///< --lora-rank, --lora-alpha, --lora-targets, --world
  bool lora_flags = false;              ///< --lora-rank, --lora-alpha or --lora-targets was given
  bool lora_alpha_given = false;        ///< --lora-alpha was given (default: 2 x rank)
  bool lora_rank_given = false;         ///< --lora-rank was given
  std::int64_t log_every = 0;  ///< 0: about ten lines per run
  std::string impl;            ///< "puzzles", "reference" or "" (this binary's)
  bool ddp_flags = false;      ///< a ddp-only flag was given (--bucket-mb, --accumulate, --ddp-mode)
  bool zero_flags = false;     ///< a zero-only flag was given (--stage, --prefetch, --offload)
  bool tp_flags = false;       ///< a tp-only flag was given (--tp, --sequence-parallel)
  bool pp_flags = false;       ///< a pp-only flag was given (--pp, --microbatches, --schedule, ...)
  bool sp_flags = false;       ///< an sp-only flag was given (--sp, --sp-kind, --sp-ulysses)
  bool dp_given = false;       ///< --dp was given (tp and pp take it)
  bool world_given = false;    ///< --world was given (under mpiexec it defaults to the processes)
  bool mp_flags = false;       ///< --loss-scale or --reduce-dtype was given (they need --precision)
  bool dtype_given = false;    ///< --dtype was given (--precision bf16|fp16 sets the dtype itself)
  std::set<std::string> given;  ///< every flag that takes a value and was given
};

/// The --help text.
extern const char* const kUsage;

/// Parses argv; throws UsageError. Prints --help and exits on -h/--help.
Options parse_arguments(int argc, char** argv);

/// The checks between flags and against the file system: strategy names,
/// ddp and zero settings, heads | d_model, the data file, writable outputs.
/// Throws UsageError.
void check_options(const Options& options);

/// The value of "--flag VALUE" or "--flag=VALUE" in argv, or "" (a quick look
/// for --impl before anything else runs).
std::string find_flag(int argc, char** argv, const std::string& flag);

}  // namespace dtp::train_app
