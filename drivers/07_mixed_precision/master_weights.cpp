// Provided: the f32 master weights' constructor (an f32 copy of each unit's
// 16-bit parameters, charged as optimizer state) and release_grads.
#include "07_mixed_precision/mixed_precision.h"

#include "dtp/error.h"
#include "dtp/memory.h"
#include "dtp/nn_ops.h"

namespace dtp::ch07 {

MasterWeights::MasterWeights(GPT& model) : model_(&model) {
  const DType dtype = model.config().dtype;
  DTP_CHECK(dtype == DType::bf16 || dtype == DType::f16,
            "MasterWeights: the model must be bf16 or f16 (its 16-bit working copy), got a ",
            dtype_name(dtype), " model");
  for (Unit* unit : model.units()) {
    DTP_CHECK(unit->has_params(), "MasterWeights: unit ", unit->name(),
              " has its parameters released");
    Tensor master = Tensor::empty(unit->params().shape(), DType::f32, unit->params().device(),
                                  MemoryCategory::optimizer);
    ops::cast(unit->params(), master);
    buffers_.push_back({unit->name(), master, Tensor()});
  }
}

void MasterWeights::release_grads(Optimizer& optimizer) const {
  for (std::size_t i = 0; i < buffers_.size(); ++i) optimizer.set_grads(i, Tensor());
}

}  // namespace dtp::ch07
