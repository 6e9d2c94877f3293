// Checkers of what every strategy shares (drivers/strategy.h): the
// registry `dtp train` lists, the per-rank report table, and the one run
// loop, driven here by a strategy defined in this file alone (what adding a
// chapter's strategy takes, minus its CMake line).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "drivers/strategy.h"
#include "dtp/dtp.h"
#include "dtp/train_run.h"
#include "support/harness.h"
#include "support/training.h"

namespace dtp::drivers {
namespace {

TEST(StrategyRegistry, ListsEveryStrategyOnceInTheOrderOfTheCMakeLines) {
  std::vector<std::string> names;
  for (const Strategy* s : registered_strategies()) names.push_back(s->name());
  const std::vector<std::string> expected = {"single",    "ddp",    "zero",  "tp",   "pp",
                                             "sp",        "ep",     "mixed", "lora", "compress",
                                             "local-sgd", "diloco", "3d"};
  EXPECT_EQ(names, expected) << "drivers/CMakeLists.txt's dtp_strategy() lines, in order";
  for (const std::string& name : expected) {
    const Strategy* found = find_strategy(name);
    ASSERT_NE(found, nullptr) << name;
    EXPECT_EQ(found->name(), name);
  }
  EXPECT_EQ(find_strategy("zero9"), nullptr) << "an unknown name finds nothing";
}

TEST(StrategyRegistry, EveryStrategyDeclaresItsFlagsOnceEachWithHelp) {
  for (Strategy* s : registered_strategies()) {
    FlagGroup flags(s->title());
    s->add_flags(flags);
    std::set<std::string> seen;
    for (const cli::Flag& flag : flags.flags()) {
      EXPECT_TRUE(seen.insert(flag.name).second)
          << s->name() << " declares " << flag.name << " twice";
      EXPECT_EQ(flag.name.rfind("--", 0), 0u)
          << s->name() << ": '" << flag.name << "' is not a long flag";
      EXPECT_FALSE(flag.help.empty()) << s->name() << ": " << flag.name << " has no help";
      EXPECT_TRUE(flag.set) << s->name() << ": " << flag.name << " sets nothing";
    }
    // A strategy chosen by a flag of its own declares that flag.
    const std::string by = s->chosen_by();
    if (by != "--strategy " + s->name()) {
      const std::string flag = by.substr(0, by.find(' '));
      EXPECT_NE(flags.find(flag), nullptr)
          << s->name() << " is chosen by " << by << " but does not declare " << flag;
    }
  }
}

TEST(ReportTable, PrintsAlignedColumnsInTheirUnitsAndADashForNone) {
  ReportTable table;
  table.columns = {{"loss", ColumnUnit::number},
                   {"calls", ColumnUnit::count},
                   {"moved", ColumnUnit::mebibytes},
                   {"waited", ColumnUnit::milliseconds}};
  table.rows.push_back({"0", {1.5, 3, 2 * 1048576.0, 0.0125}});
  table.rows.push_back({"DDP", {0.25, 12, std::numeric_limits<double>::quiet_NaN(), 1}});
  const std::string expected =
      "    rank    loss  calls  moved MiB  waited ms\n"
      "    0     1.5000      3      2.000      12.50\n"
      "    DDP   0.2500     12          -    1000.00\n";
  EXPECT_EQ(table.str(), expected);
  EXPECT_EQ(table.at(0, "moved"), 2 * 1048576.0)
      << "at() gives the number in bytes, not as printed";
  EXPECT_EQ(table.at(1, "calls"), 12);
  const std::string missing = testing::error_of([&] { (void)table.at(0, "bytes"); });
  EXPECT_NE(missing.find("no column 'bytes' (it has loss, calls, moved, waited)"),
            std::string::npos)
      << missing;
  EXPECT_EQ(ReportTable{}.str(), "") << "a table without rows prints nothing";
}

// A strategy of this file alone: plain data parallelism by a gradient
// all-reduce after backward, on --world ranks, reporting each rank's
// all-reduced bytes and a line.
class EchoRank : public RankRun {
 public:
  EchoRank(const TrainConfig& config, Comm& comm)
      : comm_(comm), trainer_(config, comm.rank(), comm.size()) {
    trainer_.on_after_backward([this] {
      for (Unit* unit : trainer_.model().units()) comm_.all_reduce(unit->grads(), ReduceOp::avg);
    });
  }
  Trainer& trainer() override { return trainer_; }
  StepRecord step() override {
    before_ = comm_.stats().collective_bytes;
    return trainer_.step();
  }
  std::vector<double> report_values() override {
    return {static_cast<double>(comm_.stats().collective_bytes - before_)};
  }
  void report(const std::vector<RankStepRow>& rows, StepReport& report) override {
    report.ranks.columns = {{"moved", ColumnUnit::mebibytes}};
    for (std::size_t r = 0; r < rows.size(); ++r)
      report.ranks.rows.push_back({std::to_string(r), rows[r].extra});
    report.lines.push_back("echo of step " + std::to_string(report.record.step));
    report.once = "once\n";
  }

 private:
  Comm& comm_;
  Trainer trainer_;
  std::int64_t before_ = 0;
};

class EchoStrategy : public Strategy {
 public:
  int world = 2;
  std::string name() const override { return "echo"; }
  std::string title() const override { return "Echo"; }
  void add_flags(FlagGroup& flags) override { add_world_flag(flags, &world, "ranks"); }
  void validate(const TrainConfig& config) const override {
    DTP_CHECK(config.batch % world == 0, "echo: --batch ", config.batch,
              " does not split over --world ", world);
  }
  int world_size() const override { return world; }
  std::vector<RunSetting> settings(const TrainConfig&) const override {
    return {{"--world", std::to_string(world)}};
  }
  std::string header(const TrainConfig&, const std::string&) const override { return "echo"; }
  std::unique_ptr<RankRun> start(const TrainConfig& config, Comm& comm) const override {
    return std::make_unique<EchoRank>(config, comm);
  }
};

TEST(RunStrategy, ANewStrategyRunsThroughTheSharedLoopAndEqualsOneDevice) {
  TrainConfig config = testing::tiny_config(4, 3);
  const TrainResult single = train(config);
  EchoStrategy echo;
  std::vector<StepReport> reports;
  const TrainResult result =
      run_strategy(config, echo, [&](const StepReport& r) { reports.push_back(r); });
  ASSERT_EQ(result.steps.size(), 3u);
  ASSERT_EQ(reports.size(), 3u) << "one report per step, on rank 0";
  std::int64_t gradient_bytes = 0;
  {
    GPT model(config.resolved_model());
    for (const Unit* unit : model.units())
      gradient_bytes += static_cast<std::int64_t>(unit->grads().nbytes());
  }
  for (std::size_t s = 0; s < reports.size(); ++s) {
    const StepReport& r = reports[s];
    EXPECT_EQ(r.record.step, static_cast<std::int64_t>(s) + 1);
    EXPECT_TRUE(testing::close_enough(single.steps[s].loss, r.record.loss))
        << "step " << s + 1
        << ": the group's loss is the mean of the ranks', the batch's mean: one device "
        << single.steps[s].loss << ", got " << r.record.loss;
    EXPECT_EQ(r.record.tokens, config.batch * config.seq)
        << "step " << s + 1 << ": every rank's tokens";
    ASSERT_EQ(r.ranks.rows.size(), 2u) << "a row per rank";
    for (std::size_t rank = 0; rank < 2; ++rank)
      EXPECT_EQ(r.ranks.at(rank, "moved"), static_cast<double>(gradient_bytes))
          << "step " << s + 1 << ", rank " << rank << ": one all-reduce of every gradient";
    EXPECT_EQ(r.lines, std::vector<std::string>{"echo of step " + std::to_string(s + 1)});
    EXPECT_EQ(r.once, "once\n");
  }
  EXPECT_EQ(result.steps.back().step, 3);
}

TEST(RunStrategy, ChecksTheStrategyFirstAndRefusesResumeWithLoad) {
  TrainConfig config = testing::tiny_config(3, 1);
  EchoStrategy echo;
  const std::string message = testing::error_of([&] { run_strategy(config, echo); });
  EXPECT_NE(message.find("echo: --batch 3 does not split over --world 2"), std::string::npos)
      << message;
  config.batch = 4;
  config.resume_path = "a.ckpt";
  config.load_path = "b.ckpt";
  const std::string both = testing::error_of([&] { run_strategy(config, echo); });
  EXPECT_NE(both.find("--resume continues a run"), std::string::npos) << both;
}

}  // namespace
}  // namespace dtp::drivers
