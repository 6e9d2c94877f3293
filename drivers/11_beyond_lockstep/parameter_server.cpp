// The parameter server's provided parts (beyond_lockstep.h): its state,
// the round it applies, and the worker's plumbing. Puzzles 11.1 and 11.2
// write the serve loops and the worker's step.
#include <utility>

#include "11_beyond_lockstep/beyond_lockstep.h"
#include "dtp/error.h"
#include "dtp/ops.h"

namespace dtp::ch11 {
namespace {

// An optimizer that updates nothing: a worker's Trainer computes gradients,
// the server applies them.
class NoUpdate : public Optimizer {
 public:
  explicit NoUpdate(GPT& model) : Optimizer(param_buffers(model)) {}
  void step(double lr) override {
    (void)lr;
    ++steps_;
  }
  std::string name() const override { return "none (the server updates)"; }
  double clip_gradients(double max_norm) override {
    (void)max_norm;
    return 0;
  }
};

}  // namespace

const std::vector<std::string>& ps_methods() {
  static const std::vector<std::string> names = {"pull", "push", "done"};
  return names;
}

ParameterServer::ParameterServer(Comm& comm, const TrainConfig& config, double timeout_seconds)
    : comm_(comm),
      trainer_(config),
      server_(comm, ps_methods(), config.model.dtype),
      timeout_seconds_(timeout_seconds) {
  DTP_CHECK(comm.rank() == 0, "ParameterServer: the server is rank 0, not rank ", comm.rank());
  DTP_CHECK(comm.size() >= 2, "ParameterServer: needs at least one worker (ranks 1..W), got ",
            comm.size(), " rank(s)");
  DTP_CHECK(config.batch % (comm.size() - 1) == 0, "ParameterServer: the global batch (",
            config.batch, ") must split evenly over the ", comm.size() - 1, " workers");
}

Tensor ParameterServer::parameters() const {
  GPT& model = const_cast<Trainer&>(trainer_).model();
  std::int64_t total = 0;
  for (Unit* unit : model.units()) total += unit->numel();
  Tensor flat = Tensor::empty(Shape{total}, config().model.dtype, comm_.device());
  std::int64_t offset = 0;
  for (Unit* unit : model.units()) {
    flat.slice(offset, unit->numel()).copy_from(unit->params());
    offset += unit->numel();
  }
  return flat;
}

void ParameterServer::apply_round(std::int64_t round,
                                  const std::vector<std::vector<Tensor>>& gradients,
                                  const std::vector<std::int64_t>& versions) {
  const int w = workers();
  const std::vector<Unit*> units = model().units();
  DTP_CHECK(static_cast<int>(gradients.size()) == w && static_cast<int>(versions.size()) == w,
            "apply_round: round ", round, " needs the gradients and versions of ", w,
            " workers, got ", gradients.size(), " and ", versions.size());
  DTP_CHECK(round == version_ + 1, "apply_round: round ", round, " comes after round ", version_,
            ", not after round ", round - 1);
  for (std::size_t u = 0; u < units.size(); ++u) {
    Tensor mean = units[u]->grads();
    mean.fill(0);
    for (int k = 0; k < w; ++k) {
      const Tensor& g = gradients[static_cast<std::size_t>(k)][u];
      DTP_CHECK(g.defined(), "apply_round: round ", round, ": worker ", k + 1,
                " has not pushed unit '", units[u]->name(),
                "' for it (was a round applied before all its pushes came, or a push stored "
                "under another round?)");
      DTP_CHECK(g.numel() == units[u]->numel(), "apply_round: round ", round, ": worker ", k + 1,
                "'s gradient of unit '", units[u]->name(), "' has ", g.numel(),
                " elements, expected ", units[u]->numel(), " (a push stored under another unit?)");
      ops::accumulate(mean, g.view(mean.shape()));
    }
    ops::scale(mean, 1.0 / w);  // as ReduceOp::avg does: the sum times 1/W
  }
  Optimizer& optimizer = trainer_.optimizer();
  optimizer.clip_gradients(config().grad_clip);
  optimizer.step(config().schedule().at(round - 1));
  for (int k = 0; k < w; ++k) log_.push_back({k + 1, round, versions[static_cast<std::size_t>(k)]});
  version_ = round;
}

PsWorker::PsWorker(Comm& comm, const TrainConfig& config, double timeout_seconds)
    : comm_(comm),
      trainer_(config, comm.rank() - 1, comm.size() - 1),
      client_(comm, 0, ps_methods(), config.model.dtype, timeout_seconds) {
  DTP_CHECK(comm.rank() >= 1, "PsWorker: workers are ranks 1..W; rank 0 is the server");
  trainer_.set_optimizer(std::make_unique<NoUpdate>(trainer_.model()));
}

void PsWorker::finish() { client_.call(kDone, -1, 0, Tensor()); }

}  // namespace dtp::ch11
