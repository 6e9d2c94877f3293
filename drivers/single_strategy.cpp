// `dtp train` (--strategy single, the default): one device, no puzzles. The
// Trainer steps as it is; the run loop does the rest.
#include "drivers/strategy.h"
#include "dtp/train_checkpoint.h"

namespace dtp::drivers {
namespace {

class SingleRank : public RankRun {
 public:
  explicit SingleRank(const TrainConfig& config) : trainer_(config) {
    load_parameters(trainer_.model(), config);
  }
  Trainer& trainer() override { return trainer_; }
  StepRecord step() override { return trainer_.step(); }

 private:
  Trainer trainer_;
};

class SingleStrategy : public Strategy {
 public:
  std::string name() const override { return "single"; }
  std::string title() const override { return "One device"; }
  void add_flags(FlagGroup& flags) override { (void)flags; }
  void validate(const TrainConfig& config) const override { (void)config; }
  int world_size() const override { return 1; }
  std::string world_text() const override { return "one rank"; }
  std::vector<RunSetting> settings(const TrainConfig& config) const override {
    (void)config;
    return {};
  }
  std::string header(const TrainConfig& config, const std::string& backend) const override {
    (void)config, (void)backend;
    return "";
  }
  std::unique_ptr<RankRun> start(const TrainConfig& config, Comm& world) const override {
    (void)world;
    return std::make_unique<SingleRank>(config);
  }
};

}  // namespace
}  // namespace dtp::drivers

namespace dtp::strategies {
drivers::Strategy& single() {
  static drivers::SingleStrategy strategy;
  return strategy;
}
}  // namespace dtp::strategies
