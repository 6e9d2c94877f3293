// Provided code of puzzles 11.3 and 11.4: the constructors of LocalSgd and
// DiLoCo (they check h and set up DiLoCo's outer state) and DiLoCo's
// accessors. The puzzles write the steps.
#include <cstddef>

#include "11_beyond_lockstep/beyond_lockstep.h"
#include "dtp/error.h"

namespace dtp::ch11 {

LocalSgd::LocalSgd(Comm& comm, Trainer& trainer, int h) : comm_(comm), trainer_(trainer), h_(h) {
  DTP_CHECK(h_ >= 1, "LocalSgd: h = ", h_,
            " must be at least 1 (the ranks average their parameters every h local steps)");
}

DiLoCo::DiLoCo(Comm& comm, Trainer& trainer, int h, const OuterConfig& outer)
    : comm_(comm), trainer_(trainer), h_(h), outer_(outer) {
  DTP_CHECK(h_ >= 1, "DiLoCo: h = ", h_,
            " must be at least 1 (an outer step follows every h inner steps)");
  // theta starts as the model's parameters (the same on every rank), m at 0.
  for (Unit* unit : trainer_.model().units()) {
    const Tensor& params = unit->params();
    Tensor theta =
        Tensor::empty(params.shape(), params.dtype(), params.device(), MemoryCategory::optimizer);
    theta.copy_from(params);
    theta_.push_back(theta);
    momentum_.push_back(
        Tensor::zeros(params.shape(), params.dtype(), params.device(), MemoryCategory::optimizer));
  }
}

const Tensor& DiLoCo::global_parameters(int unit) const {
  DTP_CHECK(unit >= 0 && static_cast<std::size_t>(unit) < theta_.size(),
            "DiLoCo::global_parameters: unit ", unit, " is out of range: the model has ",
            theta_.size(), " units (0 to ", theta_.size() - 1, ")");
  return theta_[static_cast<std::size_t>(unit)];
}

const Tensor& DiLoCo::outer_momentum(int unit) const {
  DTP_CHECK(unit >= 0 && static_cast<std::size_t>(unit) < momentum_.size(),
            "DiLoCo::outer_momentum: unit ", unit, " is out of range: the model has ",
            momentum_.size(), " units (0 to ", momentum_.size() - 1, ")");
  return momentum_[static_cast<std::size_t>(unit)];
}

}  // namespace dtp::ch11
