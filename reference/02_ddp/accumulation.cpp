// Puzzle 2.4: gradient accumulation. Gradients add up across backward calls
// until zero_grad(), so K micro-batches with the loss scaled by 1/K leave the
// gradient of the mean loss over all of them: the same as one batch K times
// larger. Averaging over ranks is linear, so it can wait for the sum: one
// synchronization after the last micro-batch instead of K.
#include "02_ddp/ddp.h"

#include "dtp/error.h"

namespace dtp::ch02 {

double accumulation_step(GPT& model, const std::vector<Batch>& micro_batches,
                         const std::function<void()>& synchronize_gradients) {
  const std::size_t k = micro_batches.size();
  DTP_CHECK(k >= 1, "accumulation_step: needs at least one micro-batch, got none");
  for (std::size_t i = 1; i < k; ++i)
    DTP_CHECK(micro_batches[i].inputs.shape() == micro_batches[0].inputs.shape(),
              "accumulation_step: micro-batch ", i, " has shape ",
              micro_batches[i].inputs.shape().str(), " but micro-batch 0 has ",
              micro_batches[0].inputs.shape().str(), "; 1/K weighting needs equal micro-batches");
  double loss_sum = 0;
  for (const Batch& micro : micro_batches) {
    loss_sum += model.forward(micro.inputs, micro.targets);
    model.backward(1.0 / static_cast<double>(k));
  }
  synchronize_gradients();
  return loss_sum / static_cast<double>(k);
}

}  // namespace dtp::ch02
