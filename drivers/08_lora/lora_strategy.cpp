// `dtp train --lora-rank R` (strategy "lora"): the chapter's puzzles wired
// into the trainer. Provided code, not a puzzle (see drivers/README.md). Each
// rank starts from the base (--load), attaches 8.3's adapters, trains them
// alone, and with several ranks averages their gradients with 8.4. The
// adapters are the run's checkpoint (--save, --resume): the base never
// changes, so it is read from --load again rather than saved.
#include <algorithm>
#include <chrono>
#include <cmath>

#include "08_lora/lora.h"
#include "dtp/agreement.h"
#include "dtp/checkpoint.h"
#include "dtp/trainer.h"
#include "dtp/launch.h"
#include "dtp/memory.h"

namespace dtp::ch08 {
namespace {

// The strategy's own settings: what every rank must share beside the
// trainer's, and what a resumed run must share with the saved one.
std::vector<RunSetting> lora_own_settings(const TrainConfig& config, const LoraRunOptions& options, int world) {
  std::string targets;
  for (const std::string& t : options.lora.targets) targets += (targets.empty() ? "" : ",") + t;
  return {{"--world", std::to_string(world)},
          {"--lora-rank", std::to_string(options.lora.rank)},
          {"--lora-alpha", std::to_string(options.lora.alpha)},
          {"--lora-targets", targets},
          {"--load", config.load_path}};
}

// The adapters under their checkpoint names: one flat buffer per block.
std::vector<NamedTensor> adapter_tensors(const LoraModel& lora) {
  std::vector<NamedTensor> named;
  for (const ParamBuffer& b : lora.buffers()) named.push_back({b.name, b.params});
  return named;
}

TrainResult run_lora(const TrainConfig& config, const LoraRunOptions& options, const StepCallback& on_step) {
  validate_lora(config, options);
  const auto start = std::chrono::steady_clock::now();
  TrainResult result;
  result.peak_by_category.assign(kMemoryCategoryCount, 0);
  // The base, read once: every rank copies the same parameters from it.
  const Checkpoint base = config.load_path.empty() ? Checkpoint{} : read_checkpoint(config.load_path);
  launch(World::from_env(options.world), [&](Comm& comm) {
    Trainer trainer(config, comm.rank(), comm.size());
    GPT& model = trainer.model();
    if (!config.load_path.empty()) load_parameters(model, base, config.load_path);
    const std::vector<RunSetting> own = lora_own_settings(config, options, comm.size());
    check_ranks_agree(comm, run_settings(config, own), model);
    LoraModel lora(model, options.lora);
    trainer.set_optimizer(make_optimizer(config, lora.buffers()));
    trainer.on_zero_grad([&] { lora.zero_grad(); });
    trainer.checkpoint_also(adapter_tensors(lora));
    if (!config.resume_path.empty()) trainer.resume(config.resume_path, own);
    const std::int64_t last = last_step(trainer);
    std::unique_ptr<LoraDataParallel> data_parallel;
    if (comm.size() > 1) {
      data_parallel = std::make_unique<LoraDataParallel>(comm, model, lora);
      trainer.on_after_backward([&] { data_parallel->finish(); });
    }
    if (comm.rank() == 0) {
      result.parameters = model.parameter_count();
      result.data_name = trainer.sampler().data().name();
    }
    std::shared_ptr<MemoryTracker> tracker = current_memory_tracker();
    while (trainer.steps_done() < last) {
      const CommStats before = comm.stats();
      StepRecord record = trainer.step();
      const std::int64_t bytes = comm.stats().collective_bytes - before.collective_bytes;
      report_group_step(comm, record);  // equal slices: rank 0's record gets the mean loss
      if (comm.rank() != 0) continue;
      result.add_step(record, *tracker);
      if (on_step) on_step(record);
      if (options.on_step) options.on_step(record.step, bytes, lora.trainable_parameters());
    }
    if (comm.rank() == 0 && !config.save_path.empty()) trainer.save(config.save_path, own);
    if (comm.rank() == 0 && !options.save_merged_path.empty()) {
      // The merged model: an ordinary set of parameters for --load or inference.
      lora.merge_all();
      save_parameters(options.save_merged_path, model, config);
    }
  });
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace

void validate_lora(const TrainConfig& config, const LoraRunOptions& options) {
  DTP_CHECK(options.lora.rank >= 1, "lora: --lora-rank must be at least 1, got ", options.lora.rank);
  DTP_CHECK(std::isfinite(options.lora.alpha) && options.lora.alpha > 0, "lora: --lora-alpha must be positive, got ",
            options.lora.alpha);
  DTP_CHECK(!options.lora.targets.empty(), "lora: --lora-targets names none");
  DTP_CHECK(options.world >= 1, "lora: --world must be at least 1, got ", options.world);
  DTP_CHECK(config.batch % options.world == 0, "lora: the global batch (--batch ", config.batch,
            ") must divide evenly by --world ", options.world);
  DTP_CHECK(config.model.experts == 0 || (std::find(options.lora.targets.begin(), options.lora.targets.end(),
                                                    "mlp.fc") == options.lora.targets.end() &&
                                          std::find(options.lora.targets.begin(), options.lora.targets.end(),
                                                    "mlp.proj") == options.lora.targets.end()),
            "lora: a mixture-of-experts model takes adapters on attention only (attn.q, attn.k, attn.v, attn.proj)");
}

void register_lora_strategy(const LoraRunOptions& options) {
  register_strategy("lora", [options](const TrainConfig& config, const StepCallback& on_step) {
    return run_lora(config, options, on_step);
  });
}

}  // namespace dtp::ch08
