// dtp-train: train the small GPT; shows progress and a summary.
//   dtp train --device cpu --steps 300 --batch 16 --seq 64 [--data FILE]
//             [--trace out.json] [--json log.jsonl] [--strategy single|ddp]
//   dtp train --strategy ddp --world 4 [--impl puzzles|reference]
//             [--ddp-mode naive|flat|bucketed] [--bucket-mb X] [--accumulate K]
//   dtp train --strategy zero --world 4 --stage 1|2|3 [--prefetch] [--offload]
//   dtp train --strategy tp --tp 2 [--dp 2] [--sequence-parallel]
//   dtp train --strategy pp --pp 4 --microbatches 8 --schedule 1f1b|afab|interleaved|zb-h1 [--dp 2] [--fsdp]
//   dtp train --strategy sp --sp 4 --sp-kind ulysses|ring|zigzag|hybrid [--sp-ulysses 2]
//   dtp train --strategy ep --moe-experts 8 --top-k 2 --world 4
// Built twice from this source (apps/CMakeLists.txt): bin/dtp-train runs the
// puzzles, bin/dtp-train-reference the reference. The defaults reach a
// clearly lower loss on the synthetic data within a minute on two CPU cores.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#if defined(__GLIBC__)
#endif

#include "02_ddp/ddp.h"
#include "03_zero_fsdp/zero.h"
#include "04_tensor_parallel/tensor_parallel.h"
#include "dtp/error.h"
#include "dtp/launch.h"
#include "dtp/trainer.h"
#include "train/options.h"
#include "train/processes.h"
#include "train/progress.h"

namespace {

using namespace dtp::train_app;

constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;
constexpr int kExitUnsolved = 3;

// "puzzle 2.2 flat_ddp is not solved yet" when the run stopped at a stub.
// A rank's NotSolved reaches here wrapped in RankFailure; on other MPI
// processes only its message arrives.
std::string unsolved_puzzle(const std::exception& error) {
  const std::exception* original = &error;
  std::exception_ptr inner;
  if (const auto* failure = dynamic_cast<const dtp::RankFailure*>(&error)) {
    inner = failure->original();
    try {
      std::rethrow_exception(inner);
    } catch (const std::exception& e) {
      original = &e;
      if (dynamic_cast<const dtp::NotSolved*>(original)) return e.what();
    } catch (...) {
    }
  }
  if (dynamic_cast<const dtp::NotSolved*>(original)) return original->what();
  const std::string text = error.what();
  const auto at = text.find("puzzle ");
  const auto end = text.find(" is not solved yet");
  if (at != std::string::npos && end != std::string::npos && end > at)
    return text.substr(at, end - at) + " is not solved yet";
  return "";
}

void print_header(const Options& o, const ProcessRole& role) {
  const dtp::TrainConfig& config = o.config;
  const dtp::GPTConfig model = config.resolved_model();
  const bool has_puzzles = config.strategy != "single";
  std::printf("dtp train: strategy %s, %s%s\n", config.strategy.c_str(), config.model.device.str().c_str(),
              has_puzzles ? (std::string(", ") + this_impl() +
                             (std::string(this_impl()) == "puzzles" ? " (your code in puzzles/)" : ""))
                                .c_str()
                          : "");
  if (config.strategy == "ddp") {
    const char* modes[] = {"naive", "flat", "bucketed"};
    const dtp::ch02::DdpOptions& ddp = o.ddp;
    std::string bucket;
    if (ddp.mode == dtp::ch02::DdpMode::bucketed && ddp.accumulate == 1) {
      char text[64];
      if (ddp.bucket_bytes == dtp::ch02::kAutoBucketBytes)
        std::snprintf(text, sizeof text, ", buckets of ~1/%lld of the gradients",
                      static_cast<long long>(dtp::ch02::kDefaultBucketCount));
      else
        std::snprintf(text, sizeof text, ", bucket %.3f MiB", static_cast<double>(ddp.bucket_bytes) / 1048576.0);
      bucket = text;
    }
    std::printf("ddp: %d ranks (%s backend), %s%s, accumulate %lld: %lld sequences per rank per "
                "micro-step\n",
                ddp.world, role.mpi ? "mpi" : "thread", modes[static_cast<int>(ddp.mode)], bucket.c_str(),
                static_cast<long long>(ddp.accumulate),
                static_cast<long long>(config.batch / (ddp.world * ddp.accumulate)));
  }
  if (config.strategy == "mixed") {
    const dtp::ch07::MixedPrecisionRunOptions& mp = o.mp;
    const std::string scale = dtp::ch07::loss_scale_for(mp, config.model.dtype).str();
    std::printf("mixed: the model in %s with f32 master weights (2 + 2 + 12 bytes per parameter), loss scale %s%s",
                dtp::dtype_name(config.model.dtype), scale.c_str(),
                scale == "dynamic" ? " (from 2^16, halved on an overflow, doubled after 2000 good steps)" : "");
    if (mp.world > 1)
      std::printf("; %d ranks (%s backend), gradients averaged in %s", mp.world, role.mpi ? "mpi" : "thread",
                  dtp::dtype_name(mp.reduce_dtype));
    std::printf("\n");
  }
  if (config.strategy == "lora") {
    const dtp::ch08::LoraRunOptions& lora = o.lora;
    std::string targets;
    for (const std::string& t : lora.lora.targets) targets += (targets.empty() ? "" : ",") + t;
    const dtp::GPTConfig model = config.resolved_model();
    const std::int64_t trainable = dtp::ch08::lora_parameter_count(model, lora.lora);
    std::printf("lora: rank %d, alpha %g (scale %g) on %s of every block: %lld trainable parameters (%.2f%% of %lld), "
                "the base frozen%s; %d rank(s) (%s backend)\n",
                lora.lora.rank, lora.lora.alpha, lora.lora.scale(), targets.c_str(), static_cast<long long>(trainable),
                100.0 * static_cast<double>(trainable) / static_cast<double>(model.parameter_count()),
                static_cast<long long>(model.parameter_count()),
                config.load_path.empty() ? " (no --load: from the model's own initialization)"
                                         : (", from " + config.load_path).c_str(),
                lora.world, role.mpi ? "mpi" : "thread");
  }
  if (config.strategy == "zero") {
    const dtp::ch03::ZeroOptions& zero = o.zero;
    const char* sharded[] = {"", "optimizer state", "gradients and optimizer state",
                             "parameters, gradients and optimizer state"};
    std::printf("zero: %d ranks (%s backend), stage %d%s (%s, puzzle %s): %s sharded%s; %lld sequences per "
                "rank\n",
                zero.world, role.mpi ? "mpi" : "thread", zero.stage,
                zero.prefetch ? " with prefetch" : zero.offload ? " with offload" : "",
                dtp::ch03::zero_stage_name(zero).c_str(), dtp::ch03::zero_puzzle(zero).c_str(),
                sharded[zero.stage], zero.offload ? ", in host memory" : "",
                static_cast<long long>(config.batch / zero.world));
    std::printf("zero: after each kept step, per rank: peak MiB per category during the step (a DDP rank's "
                "in parentheses) and the MiB its collectives moved\n");
  }
  if (config.strategy == "tp") {
    const dtp::ch04::TensorParallelRunOptions& tp = o.tp;
    std::printf("tp: %d x %d = %d ranks (%s backend): tensor-parallel groups of %d consecutive ranks, %d data-parallel "
                "group(s)%s; %lld sequences per data-parallel rank\n",
                tp.dp, tp.tp, tp.dp * tp.tp, role.mpi ? "mpi" : "thread", tp.tp, tp.dp,
                tp.sequence_parallel ? ", sequence parallel" : "", static_cast<long long>(config.batch / tp.dp));
  }
  if (config.strategy == "pp") {
    const dtp::ch05::PipelineOptions& pp = o.pp.pipeline;
    const bool interleaved = pp.schedule == dtp::ch05::ScheduleKind::interleaved;
    std::printf("pp: %d stages x %d replica(s) = %d ranks (%s backend), schedule %s%s, %d micro-batches of %lld "
                "sequences%s; units split by %s\n",
                pp.pp, pp.dp, pp.pp * pp.dp, role.mpi ? "mpi" : "thread", dtp::ch05::schedule_kind_name(pp.schedule),
                interleaved ? (" with " + std::to_string(pp.chunks) + " chunks per rank").c_str() : "",
                pp.microbatches, static_cast<long long>(config.batch / pp.dp / pp.microbatches),
                pp.fsdp ? ", each stage FSDP-sharded over its replicas" : "",
                pp.balance_by_time ? "measured time" : "parameters");
    std::printf("pp: the lesson's bubble for these settings: %.1f%%\n",
                100.0 * dtp::ch05::bubble_formula(pp.schedule, pp.pp, pp.microbatches, pp.chunks));
  }
  if (config.strategy == "sp") {
    const dtp::ch06::SequenceParallelRunOptions& sp = o.sp;
    const bool zigzag = sp.kind == dtp::ch06::SequenceParallelKind::zigzag;
    std::string hybrid;
    if (sp.kind == dtp::ch06::SequenceParallelKind::hybrid)
      hybrid = " (Ulysses in groups of " + std::to_string(sp.ulysses) + ", ring across " +
               std::to_string(sp.sp / std::max(1, sp.ulysses)) + " groups)";
    std::printf("sp: %d ranks (%s backend), %s attention%s: each holds %lld of every sequence's %lld positions%s, "
                "the whole model and the whole batch\n",
                sp.sp, role.mpi ? "mpi" : "thread", dtp::ch06::sequence_parallel_kind_name(sp.kind), hybrid.c_str(),
                static_cast<long long>(config.seq / sp.sp), static_cast<long long>(config.seq),
                zigzag ? " (two chunks)" : "");
  }
  if (config.strategy == "ep") {
    const int m = o.ep.world;
    std::printf("ep: %d ranks (%s backend), each holds %d of every block's %d experts and %lld sequences of the "
                "batch; tokens routed per rank (like --moe-groups %d on one device)\n",
                m, role.mpi ? "mpi" : "thread", config.model.experts / std::max(1, m), config.model.experts,
                static_cast<long long>(config.batch / std::max(1, m)), m);
  }
  std::printf("model: %s (%lld parameters)\n", model.describe().c_str(),
              static_cast<long long>(model.parameter_count()));
  std::printf("data: %s; batch %lld x seq %lld = %lld tokens per step\n",
              config.data_path.empty() ? "synthetic phrases" : config.data_path.c_str(),
              static_cast<long long>(config.batch), static_cast<long long>(config.seq),
              static_cast<long long>(config.batch * config.seq));
  std::printf("optimizer: %s, lr %.2e, warm-up %lld steps, cosine to %.2e, clip %.2f, seed %llu\n",
              config.optimizer.c_str(), config.lr, static_cast<long long>(config.warmup),
              config.lr * config.min_lr_ratio, config.grad_clip,
              static_cast<unsigned long long>(config.seed));
  // What the run reads and writes beside the data: says which steps it trains.
  std::string checkpoint;
  if (!config.load_path.empty())
    checkpoint += "starting from " + config.load_path + "'s parameters" +
                  (config.strategy == "lora" ? " (the frozen base)"
                   : config.strategy == "mixed"
                       ? " (the f32 masters take them as they are, the model their rounding)"
                       : " (a new run: fresh optimizer, step 0)");
  if (!config.resume_path.empty())
    checkpoint += (checkpoint.empty() ? "" : "; ") + std::string("continuing ") + config.resume_path +
                  " from the step it saved (its settings checked)";
  if (config.stop_after > 0)
    checkpoint += (checkpoint.empty() ? "" : "; ") + std::string("stopping after step ") +
                  std::to_string(config.stop_after) + " of " + std::to_string(config.steps);
  if (!config.save_path.empty()) {
    const bool sharded = config.strategy == "zero" || config.strategy == "tp" || config.strategy == "pp" ||
                         config.strategy == "ep";
    checkpoint += (checkpoint.empty() ? "" : "; ") + std::string("saving to ") + config.save_path + " at the end" +
                  (config.strategy == "lora" ? " (the adapters and their optimizer state)"
                   : sharded                 ? " (rank 0 gathers every rank's shards into one file)"
                                             : "");
  }
  if (!checkpoint.empty()) std::printf("checkpoint: %s\n", checkpoint.c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  ProcessRole role;
  try {
    // Before anything else: --impl may name the sibling binary.
    run_impl(find_flag(argc, argv, "--impl"), argv);
    options = parse_arguments(argc, argv);
    // The log's config line records how to run this again.
    options.config.command_line.assign(argv, argv + argc);
    options.config.git_revision = DTP_GIT_REV;
    // For the name check; registered again below, with their reporting callbacks.
    dtp::ch02::register_ddp_strategy(options.ddp);
    dtp::ch03::register_zero_strategy(options.zero);
    dtp::ch04::register_tensor_parallel_strategy(options.tp);
    dtp::ch05::register_pipeline_strategy(options.pp);
    dtp::ch06::register_sequence_parallel_strategy(options.sp);
    dtp::ch06::register_expert_parallel_strategy(options.ep);
    dtp::ch07::register_mixed_precision_strategy(options.mp);
    dtp::ch08::register_lora_strategy(options.lora);
    role = join_processes(options);
    if (role.reports) check_options(options);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "dtp-train: error: %s\n", e.message.c_str());
    return kExitUsage;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dtp-train: error: %s\n", e.what());
    return kExitUsage;
  }

  const dtp::TrainConfig& config = options.config;
  Progress progress(config.steps, options.log_every, role.reports && isatty(STDOUT_FILENO));
  // A ddp kept line is followed by one line per rank: what it communicated.
  options.ddp.on_comm = [&](std::int64_t step, const std::vector<dtp::ch02::RankCommStep>& ranks) {
    if (!role.reports || !progress.keeps(step)) return;
    for (const auto& r : ranks)
      std::printf("    rank %d: loss %.4f  %lld all-reduce(s)  %.3f MiB  exposed comm %.2f ms\n", r.rank,
                  r.loss, static_cast<long long>(r.all_reduces),
                  static_cast<double>(r.bytes) / (1024.0 * 1024.0), r.exposed_seconds * 1e3);
    std::fflush(stdout);
  };
  // A zero kept line is followed by one line per rank: what it held and moved.
  options.zero.on_memory = [&](std::int64_t step, const std::vector<dtp::ch03::RankMemoryStep>& ranks) {
    if (!role.reports || !progress.keeps(step)) return;
    const auto mib = [](std::int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); };
    for (const auto& r : ranks) {
      // On a GPU, offloaded optimizer state sits in host memory: show it apart.
      char host[48] = "";
      if (r.host_optimizer_peak > 0) std::snprintf(host, sizeof host, " + host %.3f", mib(r.host_optimizer_peak));
      std::printf("    rank %d: params %.3f MiB (DDP %.3f)  grads %.3f MiB (DDP %.3f)  optimizer %.3f MiB%s "
                  "(DDP %.3f)  moved %.3f MiB\n",
                  r.rank, mib(r.params_peak), mib(r.ddp_params), mib(r.grads_peak), mib(r.ddp_grads),
                  mib(r.optimizer_peak), host, mib(r.ddp_optimizer), mib(r.bytes_moved));
    }
    // Once: where a stage holds more than DDP, say why (the lesson's section 2).
    static bool explained = false;
    const auto& first = ranks.front();
    if (!explained && first.params_peak > first.ddp_params) {
      std::printf("    note: the parameter peak is above DDP's: the shards plus the whole units being gathered (two "
                  "with prefetch) outweigh one model when a unit is a large share of it (here %lld blocks); with "
                  "more blocks each unit is a smaller share (try --layers 8)\n",
                  static_cast<long long>(config.model.layers));
      explained = true;
    }
    if (!explained && first.grads_peak > first.ddp_grads) {
      std::printf("    note: ZeRO-1 holds more gradient bytes than DDP: the full gradient stays and the reduce-scatter "
                  "writes a separate gradient shard (what ZeRO-2 saves)\n");
      explained = true;
    }
    std::fflush(stdout);
  };
  // A tp kept line is followed by one line per rank: what it held and moved.
  options.tp.on_ranks = [&](std::int64_t step, const std::vector<dtp::ch04::RankTensorParallelStep>& ranks) {
    if (!role.reports || !progress.keeps(step)) return;
    const auto mib = [](std::int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); };
    for (const auto& r : ranks)
      std::printf("    rank %d (tp %d, dp %d): params %.3f MiB  activation peak %.3f MiB  moved %.3f MiB\n", r.rank,
                  r.tp_rank, r.dp_rank, mib(r.params_bytes), mib(r.activation_peak), mib(r.bytes_moved));
    std::fflush(stdout);
  };
  // A pp kept line is followed by the step's bubble, a line per rank and,
  // once, the Gantt chart of pipeline 0 as it ran.
  options.pp.on_step = [&](std::int64_t step, const dtp::ch05::PipelineStepTiming& timing) {
    if (!role.reports || !progress.keeps(step)) return;
    std::printf("    bubble: clock %.1f%% (makespan %.6g), wall %.1f%% (%.2f ms)\n", 100.0 * timing.clock_bubble,
                timing.clock_makespan, 100.0 * timing.wall_bubble, timing.wall_makespan * 1e3);
    const auto mib = [](std::int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); };
    for (const auto& r : timing.ranks)
      std::printf("    rank %d (stage %d, dp %d: %s): params %.3f MiB  activation peak %.3f MiB (%d micro-batch(es) "
                  "alive)  busy %.2f ms\n",
                  r.rank, r.stage, r.dp_rank, r.units.c_str(), mib(r.params_bytes), mib(r.activation_peak),
                  r.peak_alive, r.wall_busy * 1e3);
    static bool charted = false;
    if (!charted) {
      std::printf("%s", dtp::ch05::executed_gantt_chart(options.pp.pipeline, timing).c_str());
      charted = true;
    }
    std::fflush(stdout);
  };
  dtp::ch02::register_ddp_strategy(options.ddp);
  dtp::ch03::register_zero_strategy(options.zero);
  dtp::ch04::register_tensor_parallel_strategy(options.tp);
  // An sp kept line is followed by one line per rank: its positions and work.
  options.sp.on_ranks = [&](std::int64_t step, const std::vector<dtp::ch06::RankSequenceParallelStep>& ranks) {
    if (!role.reports || !progress.keeps(step)) return;
    const auto mib = [](std::int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); };
    for (const auto& r : ranks) {
      std::string positions;
      for (const dtp::PositionRange& p : r.positions)
        positions += (positions.empty() ? "" : " ") + ("[" + std::to_string(p.start) + ", " + std::to_string(p.end()) + ")");
      char blocks[48] = "";
      if (options.sp.kind != dtp::ch06::SequenceParallelKind::ulysses)
        std::snprintf(blocks, sizeof blocks, "  attention blocks %lld", static_cast<long long>(r.attention_blocks));
      std::printf("    rank %d (positions %s): activation peak %.3f MiB  moved %.3f MiB%s\n", r.rank,
                  positions.c_str(), mib(r.activation_peak), mib(r.bytes_moved), blocks);
    }
    std::fflush(stdout);
  };
  // An ep kept line is followed by one line per rank: its experts and tokens.
  options.ep.on_ranks = [&](std::int64_t step, const std::vector<dtp::ch06::RankExpertParallelStep>& ranks) {
    if (!role.reports || !progress.keeps(step)) return;
    for (const auto& r : ranks)
      std::printf("    rank %d (experts %d-%d): %lld tokens, %lld choices dropped (all blocks), moved %.3f MiB\n",
                  r.rank, r.first_expert, r.first_expert + r.experts - 1, static_cast<long long>(r.tokens),
                  static_cast<long long>(r.dropped), static_cast<double>(r.bytes_moved) / (1024.0 * 1024.0));
    std::fflush(stdout);
  };
  dtp::ch05::register_pipeline_strategy(options.pp);
  dtp::ch06::register_sequence_parallel_strategy(options.sp);
  dtp::ch06::register_expert_parallel_strategy(options.ep);
  dtp::ch07::register_mixed_precision_strategy(options.mp);
  // A lora kept line is followed by what the step all-reduced (8.4).
  options.lora.on_step = [&](std::int64_t step, std::int64_t bytes, std::int64_t trainable) {
    if (!role.reports || !progress.keeps(step) || options.lora.world == 1) return;
    std::printf("    all-reduced %lld bytes: the %lld adapter gradients x %zu bytes\n", static_cast<long long>(bytes),
                static_cast<long long>(trainable), dtp::dtype_size(config.model.dtype));
    std::fflush(stdout);
  };
  dtp::ch08::register_lora_strategy(options.lora);
  try {
    if (role.reports) print_header(options, role);
    dtp::TrainResult result;
    try {
      result = dtp::train(config, [&](const dtp::StepRecord& record) {
        if (role.reports) progress.show(record);
      });
    } catch (const std::exception&) {
      // A failed run keeps its trace too, every process's part of it.
      try {
        merge_trace_parts(config.trace_path, role);
      } catch (const std::exception&) {
      }
      throw;
    }
    merge_trace_parts(config.trace_path, role);
    if (role.reports) {
      std::printf("%s\n", dtp::format_summary(result).c_str());
      if (!config.trace_path.empty()) std::printf("trace: %s\n", config.trace_path.c_str());
      if (!config.json_path.empty()) std::printf("log: %s\n", config.json_path.c_str());
    }
  } catch (const std::exception& e) {
    progress.break_line();
    const std::string puzzle = unsolved_puzzle(e);
    if (!role.reports) return puzzle.empty() ? kExitFailed : kExitUnsolved;
    if (!puzzle.empty()) {
      std::fprintf(stderr, "dtp-train: %s; `--impl reference` runs the reference\n", puzzle.c_str());
      return kExitUnsolved;
    }
    std::fprintf(stderr, "dtp-train: error: %s\n", e.what());
    return kExitFailed;
  }
  return 0;
}
