// `dtp train --strategy local-sgd` and `--strategy diloco` (provided, not
// puzzles): chapter 11's 11.3 and 11.4 wired into the trainer. Each rank is
// a replica training on its slice of the batch; every --every H steps the
// replicas meet (an average of parameters, or DiLoCo's outer step). Between
// meetings the replicas differ, so a run saves only on a meeting step, and
// a run cannot --resume: each replica's optimizer state is its own.
#include <memory>
#include <string>
#include <vector>

#include "11_beyond_lockstep/beyond_lockstep.h"
#include "drivers/strategy.h"
#include "dtp/error.h"
#include "dtp/train_checkpoint.h"

namespace dtp::ch11 {
namespace {

// What both strategies share: --world and --every, and the checks.
struct EveryH {
  int world = 2;
  int every = 8;
};

void validate_every(const TrainConfig& config, const EveryH& o, const std::string& name) {
  DTP_CHECK(o.world >= 1, name, ": --world must be at least 1, got ", o.world);
  DTP_CHECK(config.batch % o.world == 0, name, ": the global batch (--batch ", config.batch,
            ") must divide evenly by --world ", o.world, " (one slice per replica)");
  DTP_CHECK(o.every >= 1, name, ": --every H must be at least 1, got ", o.every);
  DTP_CHECK(
      config.save_path.empty() || config.steps % o.every == 0, name, ": --save needs --steps (",
      config.steps, ") a multiple of --every (", o.every,
      "): between meetings the replicas differ, and only a meeting's parameters are the run's");
  DTP_CHECK(config.resume_path.empty(), name,
            " cannot --resume: each replica's optimizer state is its own and is not saved");
}

// One rank: its Trainer and what meets every H steps.
class EveryHRank : public drivers::RankRun {
 public:
  EveryHRank(const TrainConfig& config, Comm& comm)
      : comm_(comm), trainer_(config, comm.rank(), comm.size()) {
    load_parameters(trainer_.model(), config);
  }
  Trainer& trainer() override { return trainer_; }

  std::vector<double> report_values() override {
    const double moved = static_cast<double>(comm_.stats().collective_bytes - bytes_before_);
    return {moved, meetings() > meetings_before_ ? 1.0 : 0.0};
  }

  void report(const std::vector<RankStepRow>& rows, drivers::StepReport& report) override {
    using drivers::ColumnUnit;
    report.ranks.columns = {{"loss", ColumnUnit::number},
                            {"moved", ColumnUnit::mebibytes},
                            {"met", ColumnUnit::number}};
    for (std::size_t r = 0; r < rows.size(); ++r)
      report.ranks.rows.push_back(
          {std::to_string(r), {rows[r].loss, rows[r].extra[0], rows[r].extra[1]}});
  }

 protected:
  virtual std::int64_t meetings() const = 0;
  void before_step() {
    bytes_before_ = comm_.stats().collective_bytes;
    meetings_before_ = meetings();
  }

  Comm& comm_;
  Trainer trainer_;

 private:
  std::int64_t bytes_before_ = 0;
  std::int64_t meetings_before_ = 0;
};

class LocalSgdRank : public EveryHRank {
 public:
  LocalSgdRank(const TrainConfig& config, Comm& comm, int every)
      : EveryHRank(config, comm), local_(comm, trainer_, every) {}
  StepRecord step() override {
    before_step();
    return local_.step();
  }

 private:
  std::int64_t meetings() const override { return local_.averages(); }
  LocalSgd local_;
};

class DiLoCoRank : public EveryHRank {
 public:
  DiLoCoRank(const TrainConfig& config, Comm& comm, int every, const OuterConfig& outer)
      : EveryHRank(config, comm), diloco_(comm, trainer_, every, outer) {}
  StepRecord step() override {
    before_step();
    return diloco_.step();
  }

 private:
  std::int64_t meetings() const override { return diloco_.outer_steps(); }
  DiLoCo diloco_;
};

const char* kReport =
    "After each kept step, a row per rank: its loss (its own replica's), the MiB its collectives "
    "moved in the step (only meeting steps move any) and 1 where the step ended with a meeting.";

class LocalSgdStrategy : public drivers::Strategy {
 public:
  std::string name() const override { return "local-sgd"; }
  std::string title() const override { return "Local SGD"; }
  std::string chapter() const override { return "11"; }
  void add_flags(drivers::FlagGroup& flags) override {
    drivers::add_world_flag(flags, &o_.world, "replicas");
    flags.integer("--every", &o_.every, 1, 1 << 20, "H",
                  "local steps between averages of the parameters (11.3)");
    flags.paragraph(kReport);
  }
  void resolve(TrainConfig& config, const std::vector<drivers::GivenFlag>& given,
               int processes) override {
    (void)config;
    drivers::default_world_to_processes(o_.world, given, processes);
  }
  void validate(const TrainConfig& config) const override {
    validate_every(config, o_, "local-sgd");
  }
  int world_size() const override { return o_.world; }
  std::vector<RunSetting> settings(const TrainConfig& config) const override {
    (void)config;
    return {{"--world", std::to_string(o_.world)}, {"--every", std::to_string(o_.every)}};
  }
  std::string header(const TrainConfig& config, const std::string& backend) const override {
    return "local-sgd: " + std::to_string(o_.world) + " replicas (" + backend + " backend), each " +
           std::to_string(config.batch / o_.world) +
           " sequences per step; the parameters averaged every " + std::to_string(o_.every) +
           " steps (11.3); optimizer state stays on each replica";
  }
  std::unique_ptr<drivers::RankRun> start(const TrainConfig& config, Comm& world) const override {
    return std::make_unique<LocalSgdRank>(config, world, o_.every);
  }
  std::string save_note() const override { return "rank 0's parameters after the last average"; }

 private:
  EveryH o_;
};

class DiLoCoStrategy : public drivers::Strategy {
 public:
  std::string name() const override { return "diloco"; }
  std::string title() const override { return "DiLoCo"; }
  std::string chapter() const override { return "11"; }
  void add_flags(drivers::FlagGroup& flags) override {
    drivers::add_world_flag(flags, &o_.world, "replicas");
    flags.integer("--every", &o_.every, 1, 1 << 20, "H",
                  "inner steps (the trainer's optimizer, AdamW by default) between outer steps "
                  "(11.4)");
    flags.real("--outer-lr", &outer_.lr, 0, 100, "LR", "the outer Nesterov step's learning rate");
    flags.real("--outer-momentum", &outer_.momentum, 0, 0.999999, "M",
               "the outer Nesterov step's momentum");
    flags.paragraph(kReport);
  }
  void resolve(TrainConfig& config, const std::vector<drivers::GivenFlag>& given,
               int processes) override {
    (void)config;
    drivers::default_world_to_processes(o_.world, given, processes);
  }
  void validate(const TrainConfig& config) const override { validate_every(config, o_, "diloco"); }
  int world_size() const override { return o_.world; }
  std::vector<RunSetting> settings(const TrainConfig& config) const override {
    (void)config;
    return {{"--world", std::to_string(o_.world)},
            {"--every", std::to_string(o_.every)},
            {"--outer-lr", std::to_string(outer_.lr)},
            {"--outer-momentum", std::to_string(outer_.momentum)}};
  }
  std::string header(const TrainConfig& config, const std::string& backend) const override {
    char outer[120];
    std::snprintf(outer, sizeof outer, "outer Nesterov lr %g, momentum %g", outer_.lr,
                  outer_.momentum);
    return "diloco: " + std::to_string(o_.world) + " replicas (" + backend + " backend), each " +
           std::to_string(config.batch / o_.world) + " sequences per step; " + config.optimizer +
           " for " + std::to_string(o_.every) + " inner steps, then an " + outer +
           " on the averaged change (11.4)";
  }
  std::unique_ptr<drivers::RankRun> start(const TrainConfig& config, Comm& world) const override {
    return std::make_unique<DiLoCoRank>(config, world, o_.every, outer_);
  }
  std::string save_note() const override { return "rank 0's parameters after the last outer step"; }

 private:
  EveryH o_;
  OuterConfig outer_;
};

}  // namespace
}  // namespace dtp::ch11

namespace dtp::strategies {
drivers::Strategy& local_sgd() {
  static ch11::LocalSgdStrategy strategy;
  return strategy;
}
drivers::Strategy& diloco() {
  static ch11::DiLoCoStrategy strategy;
  return strategy;
}
}  // namespace dtp::strategies
