// `dtp train --strategy 3d` (provided, not a puzzle): chapter 12's step on a
// dp x pp x tp mesh of dp x pp x tp ranks, placed tiers first (12.1). Each
// rank holds its stages' TP slices; a rank's slices are its own, so a run
// neither saves nor resumes (--load starts from a checkpoint's parameters).
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "12_3d_parallelism/three_d.h"
#include "drivers/12_3d_parallelism/three_d_strategy.h"
#include "drivers/12_3d_parallelism/three_d_trainer.h"
#include "dtp/error.h"

namespace dtp::ch12 {
namespace {

// One rank of the mesh: its three groups and its slices.
class ThreeDRank : public drivers::RankRun {
 public:
  ThreeDRank(const TrainConfig& config, const ThreeDRunOptions& options, Comm& world)
      : options_(options),
        mesh_(make_mesh(world, options.shape)),
        trainer_(config, mesh_, options.model) {}

  Trainer& trainer() override { return trainer_.trainer(); }
  std::int64_t parameter_count() override { return trainer_.config().model.parameter_count(); }

  StepRecord step() override {
    before_ = moved();
    return trainer_.step();
  }

  // The ranks of one DP replica share its rows: one rank of each replica
  // counts them, and the step already averaged the loss over the replicas.
  GroupStepRule group_rule() const override {
    const int per_replica = options_.shape.pp * options_.shape.tp;
    return {[per_replica](int rank) { return rank % per_replica == 0; }, false};
  }

  std::vector<double> report_values() override {
    std::vector<double> out{
        static_cast<double>(current_memory_tracker()->live(MemoryCategory::params)),
        static_cast<double>(current_memory_tracker()->peak(MemoryCategory::activations))};
    const std::vector<std::int64_t> now = moved();
    for (std::size_t g = 0; g < now.size(); ++g)
      out.push_back(static_cast<double>(now[g] - before_[g]));
    return out;
  }

  void report(const std::vector<RankStepRow>& rows, drivers::StepReport& report) override {
    using drivers::ColumnUnit;
    report.ranks.columns = {{"params", ColumnUnit::mebibytes},
                            {"activation peak", ColumnUnit::mebibytes},
                            {"tp moved", ColumnUnit::mebibytes},
                            {"pp sent", ColumnUnit::mebibytes},
                            {"dp moved", ColumnUnit::mebibytes}};
    const MeshShape& s = options_.shape;
    for (std::size_t r = 0; r < rows.size(); ++r) {
      const int w = static_cast<int>(r);
      report.ranks.rows.push_back({std::to_string(w) + " (dp " + std::to_string(w / (s.tp * s.pp)) +
                                       ", pp " + std::to_string(w / s.tp % s.pp) + ", tp " +
                                       std::to_string(w % s.tp) + ")",
                                   rows[r].extra});
    }
  }

 private:
  // Bytes each group moved so far: TP and DP collectives, pipeline sends.
  std::vector<std::int64_t> moved() const {
    return {mesh_.tp.stats().collective_bytes, mesh_.pp.stats().bytes_sent,
            mesh_.dp.stats().collective_bytes};
  }
  ThreeDRunOptions options_;
  Mesh mesh_;  // before the trainer, which holds it
  ThreeDTrainer trainer_;
  std::vector<std::int64_t> before_{0, 0, 0};
};

}  // namespace

void ThreeDStrategy::add_flags(drivers::FlagGroup& flags) {
  flags.integer("--dp", &options.shape.dp, 1, 1024, "D", "data-parallel replicas (outermost)");
  flags.integer("--pp", &options.shape.pp, 1, 1024, "P",
                "pipeline stages; the layers must divide by P x V");
  flags.integer("--tp", &options.shape.tp, 1, 1024, "T",
                "tensor-parallel ranks (consecutive: one node); heads, vocabulary and MLP "
                "width must divide by T");
  flags.integer("--microbatches", &options.model.microbatches, 1, ch05::kMaxMicrobatches, "M",
                "micro-batches per step of each replica");
  flags.custom(
      "--schedule", "KIND", "afab, 1f1b (default) or interleaved",
      [this](const std::string& v) { options.model.schedule = ch05::parse_schedule_kind(v); });
  flags.integer("--chunks", &options.model.chunks, 1, 64, "V",
                "model chunks per rank: 1, or 2 and more for --schedule interleaved");
  flags.toggle("--recompute", &options.model.recompute,
               "full activation recomputation: each block keeps only its input and runs its "
               "forward again in its backward");
  flags.toggle("--no-sequence-parallel", &no_sequence_parallel_,
               "keep whole activations between the linears (sequence parallelism is on by "
               "default)");
  flags.paragraph(
      "After each kept step, a row per rank: its parameter bytes, its peak activation bytes, "
      "and the bytes its TP and DP collectives moved and its pipeline sends carried.");
}

void ThreeDStrategy::resolve(TrainConfig& config, const std::vector<drivers::GivenFlag>& given,
                             int processes) {
  (void)config, (void)given, (void)processes;
  if (no_sequence_parallel_) options.model.sequence_parallel = false;
}

void validate_three_d(const TrainConfig& config, const ThreeDRunOptions& options) {
  const MeshShape& s = options.shape;
  const ThreeDOptions& o = options.model;
  DTP_CHECK(config.save_path.empty() && config.resume_path.empty(),
            "3d: --save and --resume are not supported: each rank holds only its stages' TP "
            "slices (--load starts from a checkpoint's parameters)");
  DTP_CHECK(config.batch % s.dp == 0, "3d: the global batch (--batch ", config.batch,
            ") must split into --dp ", s.dp, " equal slices");
  DTP_CHECK(config.batch / s.dp % o.microbatches == 0, "3d: each replica's ", config.batch / s.dp,
            " sequences must split into --microbatches ", o.microbatches);
  DTP_CHECK(o.schedule != ch05::ScheduleKind::zb_h1,
            "3d: --schedule zb-h1 splits the backward into B and W, which chapter 04's units "
            "do not; use afab, 1f1b or interleaved");
  if (o.schedule == ch05::ScheduleKind::interleaved)
    DTP_CHECK(o.chunks >= 2 && o.microbatches % s.pp == 0,
              "3d: --schedule interleaved needs --chunks 2 or more (got ", o.chunks,
              ") and --microbatches a multiple of --pp ", s.pp, " (got ", o.microbatches, ")");
  else
    DTP_CHECK(o.chunks == 1, "3d: --chunks ", o.chunks, " needs --schedule interleaved");
  DTP_CHECK(config.model.layers % (s.pp * o.chunks) == 0, "3d: ", config.model.layers,
            " layers do not split into --pp ", s.pp, " x --chunks ", o.chunks,
            " stages of whole layers");
  DTP_CHECK(config.model.heads % s.tp == 0, "3d: ", config.model.heads,
            " heads do not split over --tp ", s.tp);
  const std::int64_t vocab = config.data_path.empty() ? config.model.vocab_size : 256;
  DTP_CHECK(vocab % s.tp == 0, "3d: the vocabulary (", vocab,
            " token ids) does not split over --tp ", s.tp);
  if (o.sequence_parallel)
    DTP_CHECK(config.batch / s.dp / o.microbatches * config.seq % s.tp == 0,
              "3d: sequence parallelism splits a micro-batch's ",
              config.batch / s.dp / o.microbatches * config.seq, " tokens over --tp ", s.tp,
              ", which does not divide them (or pass --no-sequence-parallel)");
}

std::string ThreeDStrategy::world_text() const {
  return "--dp " + std::to_string(options.shape.dp) + " x --pp " +
         std::to_string(options.shape.pp) + " x --tp " + std::to_string(options.shape.tp) + " = " +
         std::to_string(world_size()) + " ranks";
}

std::vector<RunSetting> ThreeDStrategy::settings(const TrainConfig& config) const {
  (void)config;
  return {{"--dp", std::to_string(options.shape.dp)},
          {"--pp", std::to_string(options.shape.pp)},
          {"--tp", std::to_string(options.shape.tp)},
          {"--schedule", ch05::schedule_kind_name(options.model.schedule)},
          {"--chunks", std::to_string(options.model.chunks)},
          {"--microbatches", std::to_string(options.model.microbatches)},
          {"--sequence-parallel", options.model.sequence_parallel ? "on" : "off"},
          {"--recompute", options.model.recompute ? "on" : "off"}};
}

std::string ThreeDStrategy::header(const TrainConfig& config, const std::string& backend) const {
  char line[400];
  std::snprintf(line, sizeof line,
                "3d: %s = %d ranks (%s backend), tiers first: TP groups of %d consecutive "
                "ranks%s, %s pipelines of %d micro-batches, %d replica(s) of %lld sequences",
                options.shape.text().c_str(), world_size(), backend.c_str(), options.shape.tp,
                options.model.sequence_parallel ? " (sequence parallel)" : "",
                ch05::schedule_kind_name(options.model.schedule), options.model.microbatches,
                options.shape.dp, static_cast<long long>(config.batch / options.shape.dp));
  return line;
}

std::unique_ptr<drivers::RankRun> ThreeDStrategy::start(const TrainConfig& config,
                                                        Comm& world) const {
  return std::make_unique<ThreeDRank>(config, options, world);
}

}  // namespace dtp::ch12

namespace dtp::strategies {
drivers::Strategy& three_d() {
  static ch12::ThreeDStrategy strategy;
  return strategy;
}
}  // namespace dtp::strategies
