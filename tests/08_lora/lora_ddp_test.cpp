// Puzzle 8.4: LoRA under data parallelism. Only the adapters' gradients
// travel, one all-reduce per block, and the run equals single-device LoRA.
// The models are f64 on the CPU, f32 on a GPU (lora_checks.h), where the
// distributed run matches the single-device one within ddp_close().
#include "lora_checks.h"

namespace dtp {
namespace {

using namespace testing::ch08;

// A distributed run differs from the single-device one only in the order of
// its sums: a few ulps of f64 (training.h's tolerances), or of f32 on a GPU,
// where cuBLAS also picks its own order per matrix shape: 1e-4 relative there.
bool ddp_close(double expected, double got) {
  return on_gpu() ? std::fabs(expected - got) <= 1e-6 + 1e-4 * std::fabs(expected)
                  : testing::close_enough(expected, got);
}

ch08::LoraConfig ddp_lora_config() {
  ch08::LoraConfig c;
  c.rank = 2;
  c.alpha = 4;
  c.seed = 9;
  return c;
}

/// A trainer with LoRA on its model: SGD (momentum) over the adapters only.
struct LoraRun {
  Trainer trainer;
  ch08::LoraModel lora;
  LoraRun(const TrainConfig& config, int rank, int world)
      : trainer(config, rank, world), lora(trainer.model(), ddp_lora_config()) {
    trainer.set_optimizer(make_optimizer(config, lora.buffers()));
    trainer.on_zero_grad([this] { lora.zero_grad(); });
  }
  std::vector<std::pair<std::string, Tensor>> adapters() const {
    std::vector<std::pair<std::string, Tensor>> named;
    for (const ParamBuffer& b : lora.buffers()) named.push_back({b.name, b.params});
    return named;
  }
};

TEST(Puzzle8_4_lora_ddp, OneAllReducePerBlockMovingExactlyTheAdapterGradients) {
  for (int world : {2, 3}) {
    testing::run_and_report("LoRA DDP communication", world, [&](Comm& comm) -> std::string {
      const TrainConfig config = lora_tiny_config(12, 2, comm.device());
      LoraRun run(config, comm.rank(), comm.size());
      ch08::LoraDataParallel ddp(comm, run.trainer.model(), run.lora);
      run.trainer.on_after_backward([&] { ddp.finish(); });
      const std::int64_t blocks = run.trainer.model().num_blocks();
      const std::int64_t element = static_cast<std::int64_t>(dtype_size(config.model.dtype));
      const std::int64_t bytes = run.lora.trainable_parameters() * element;
      std::vector<double> losses;
      const auto steps = testing::train_rank(comm, run.trainer, losses);
      for (std::size_t s = 0; s < steps.size(); ++s) {
        const testing::StepComm& c = steps[s];
        if (c.all_reduces != blocks || c.bytes != bytes || c.other_collectives != 0)
          return "rank " + std::to_string(comm.rank()) + ", step " + std::to_string(s + 1) +
                 ": expected " + std::to_string(blocks) + " all-reduces (one per block) moving " +
                 std::to_string(bytes) + " bytes (the adapters' gradients: " +
                 std::to_string(run.lora.trainable_parameters()) + " x " + std::to_string(element) +
                 ") and no other collective; got " + std::to_string(c.all_reduces) +
                 " all-reduce(s) of " + std::to_string(c.bytes) + " bytes and " +
                 std::to_string(c.other_collectives) + " other collective(s)" +
                 (c.bytes > bytes ? ". More bytes than the adapters have: are base weights or "
                                    "gradients travelling? "
                                    "The frozen base is the same on every rank and has no gradients"
                                  : "");
      }
      return "";
    });
  }
}

/// Every adapter gradient, concatenated (after the first backward).
std::vector<double> adapter_gradients(const ch08::LoraModel& lora) {
  std::vector<double> all;
  for (const ParamBuffer& b : lora.buffers())
    for (double v : b.grads.to_vector()) all.push_back(v);
  return all;
}

TEST(Puzzle8_4_lora_ddp, TrainingEqualsSingleDeviceLoraTrainingAndReplicasAgreeEveryStep) {
  const TrainConfig config = lora_tiny_config(12, 3);
  LoraRun single(config, 0, 1);
  std::vector<double> single_losses, single_gradients;
  single.trainer.on_after_backward([&] {
    if (single_gradients.empty()) single_gradients = adapter_gradients(single.lora);
  });
  for (int s = 0; s < 3; ++s) single_losses.push_back(single.trainer.step().loss);
  const auto expected = single.adapters();
  for (int world : {2, 4}) {
    testing::run_and_report("LoRA DDP training", world, [&](Comm& comm) -> std::string {
      LoraRun run(lora_tiny_config(12, 3, comm.device()), comm.rank(), comm.size());
      ch08::LoraDataParallel ddp(comm, run.trainer.model(), run.lora);
      run.trainer.on_after_backward([&] { ddp.finish(); });
      // First the step-1 gradients, after finish(): averaged, they equal the
      // single-device gradients of the whole batch.
      std::string first_step;
      run.trainer.on_after_backward([&] {
        if (run.trainer.steps_done() != 0) return;
        const std::vector<double> got = adapter_gradients(run.lora);
        for (std::size_t i = 0; i < got.size() && first_step.empty(); ++i)
          if (!ddp_close(single_gradients[i], got[i])) {
            const double ratio = got[i] / single_gradients[i];
            first_step = "rank " + std::to_string(comm.rank()) +
                         ": after step 1's backward, adapter gradient element " +
                         std::to_string(i) + " is " + testing::number(got[i]) +
                         ", the single-device gradient is " + testing::number(single_gradients[i]) +
                         " (x" + testing::number(ratio) + ")" +
                         (std::fabs(ratio - comm.size()) < 1e-6
                              ? ": summed over the ranks, not averaged (ReduceOp::avg)"
                              : "; this rank's own gradient, never averaged?");
          }
      });
      std::vector<double> losses;
      for (int s = 0; s < 3; ++s) {
        losses.push_back(run.trainer.step().loss);
        if (!first_step.empty()) return first_step;
        const std::string apart = testing::check_replicas_agree(
            comm, run.adapters(),
            "Each rank must apply the same averaged adapter gradients (step " +
                std::to_string(s + 1) + ").",
            "DP");
        if (!apart.empty()) return "rank " + std::to_string(comm.rank()) + ":" + apart;
      }
      const std::vector<double> mean = testing::mean_over_ranks(comm, losses);
      for (int s = 0; s < 3; ++s)
        if (!ddp_close(single_losses[static_cast<std::size_t>(s)],
                       mean[static_cast<std::size_t>(s)]))
          return "step " + std::to_string(s + 1) + ": the mean loss over ranks is " +
                 testing::number(mean[s]) + ", single-device LoRA's is " +
                 testing::number(single_losses[static_cast<std::size_t>(s)]);
      const auto got = run.adapters();
      for (std::size_t b = 0; b < got.size(); ++b) {
        const std::vector<double> e = expected[b].second.to_vector(), g = got[b].second.to_vector();
        for (std::size_t i = 0; i < e.size(); ++i)
          if (!ddp_close(e[i], g[i]))
            return "rank " + std::to_string(comm.rank()) + ": after 3 steps " + got[b].first +
                   " element " + std::to_string(i) + " is " + testing::number(g[i]) +
                   ", single-device LoRA has " + testing::number(e[i]) +
                   (std::fabs(g[i] - e[i]) > 0 && std::fabs(e[i]) > 0
                        ? " (x" + testing::number(g[i] / e[i]) + "; summed instead of averaged?)"
                        : "");
      }
      return "";
    });
  }
}

}  // namespace
}  // namespace dtp
