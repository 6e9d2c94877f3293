// dtp-bench-lora-finetune: chapter 08's measurement. A GPT is pretrained on
// one synthetic task and saved (a checkpoint, dtp/checkpoint.h); then, from
// those weights, it is fine-tuned on a second task (other phrases: another
// data seed) in full and with LoRA at several ranks, each from the same
// checkpoint and the same batches. The second task is either the first few
// of the pretraining phrases (--task subset: adapting what the model knows,
// what LoRA is for) or another phrase bank (--task new: new knowledge). For each: trainable
// parameters, the tracker's peak memory per category, the bytes one data-parallel step all-reduces
// (--world ranks: chapter 02's flat all-reduce for full fine-tuning, 8.4's per-block all-reduce for
// LoRA, measured from the communicator's counters), and the final loss on the second task (the mean
// of the last 10 steps) against full fine-tuning's.
//   dtp-bench-lora-finetune [--pretrain-steps 600] [--finetune-steps 300] [--ranks 4,8,16]
//                           [--targets attn.q,attn.v] [--world 2] [--json FILE]
//                           [--layers 4] [--d-model 128] [--heads 4] [--batch 16] [--seq 64]
//                           [--optimizer adamw|sgd] [--dtype f32|f64]
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "02_ddp/ddp.h"
#include "08_lora/lora.h"
#include "bench_common.h"
#include "bench_flags.h"
#include "dtp/checkpoint.h"
#include "dtp/error.h"
#include "dtp/memory.h"
#include "dtp/train_checkpoint.h"
#include "dtp/train_run.h"
#include "dtp/trainer.h"
#include "dtp_cli.h"

namespace {

using namespace dtp;
using namespace dtp::bench;

struct Measured {
  std::string method;  // "full" or "lora"
  int rank = 0;        // LoRA's r (0: full)
  std::int64_t trainable = 0, parameters = 0;
  std::vector<std::int64_t> peaks;  // per MemoryCategory
  std::int64_t ddp_bytes = 0, ddp_calls = 0;
  double first_loss = 0, last_loss = 0, seconds = 0;
  std::vector<double> losses;
};

/// A fresh trainer on the fine-tuning task, started from the checkpoint,
/// with LoRA of rank @p r attached (r = 0: full fine-tuning).
struct FineTuner {
  Trainer trainer;
  std::unique_ptr<ch08::LoraModel> lora;
  FineTuner(const TrainConfig& config, const std::string& checkpoint, const Checkpoint& saved,
            int r, const std::vector<std::string>& targets, int rank = 0, int world = 1)
      : trainer(config, rank, world) {
    load_parameters(trainer.model(), saved, checkpoint);
    if (r == 0) return;
    ch08::LoraConfig lc;
    lc.rank = r;
    lc.alpha = 2.0 * r;
    lc.targets = targets;
    lc.seed = config.seed;
    lora = std::make_unique<ch08::LoraModel>(trainer.model(), lc);
    trainer.set_optimizer(make_optimizer(config, lora->buffers()));
    trainer.on_zero_grad([this] { lora->zero_grad(); });
  }
};

}  // namespace

int main(int argc, char** argv) {
  TrainConfig config;
  config.model.layers = 4;
  config.model.d_model = 128;
  config.model.heads = 4;
  std::int64_t pretrain_steps = 600, finetune_steps = 300;
  std::vector<std::int64_t> ranks = {4, 8, 16};
  std::string targets_text = "attn.q,attn.v", json_path, task = "subset";
  int subset_patterns = 8;
  double lora_lr = 1e-2;
  int world = 2;
  CLI::App app{
      "Pretrains a GPT on one synthetic task, saves it, then fine-tunes it on a second task in "
      "full and with "
      "LoRA at several ranks, from the same checkpoint: trainable parameters, peak memory per "
      "category, "
      "the bytes a data-parallel step all-reduces, and the final loss against full fine-tuning's.",
      "dtp-bench-lora-finetune"};
  app.add_option("--pretrain-steps", pretrain_steps, "steps on the first task")
      ->check(dtp::cli::Range(std::int64_t{1}, std::int64_t{1000000}))
      ->capture_default_str();
  app.add_option("--finetune-steps", finetune_steps, "steps on the second task, for every method")
      ->check(dtp::cli::Range(std::int64_t{1}, std::int64_t{1000000}))
      ->capture_default_str();
  dtp::cli::add_list_option(app, "--ranks", ranks, "LoRA ranks to measure", "R,...")
      ->check(dtp::cli::Range(std::int64_t{1}, std::int64_t{4096}))
      ->capture_default_str();
  app.add_option("--targets", targets_text, "the Linears of each block that get adapters (or all)")
      ->capture_default_str();
  app.add_option("--task", task,
                 "the second task: subset (the pretraining phrases, only the first "
                 "--subset-patterns of them: "
                 "adapting what the model knows) or new (another phrase bank: new knowledge)")
      ->check(CLI::IsMember({"subset", "new"}))
      ->capture_default_str();
  app.add_option("--subset-patterns", subset_patterns,
                 "phrases of the subset task (pretraining has 32)")
      ->check(dtp::cli::Range(1, 32))
      ->capture_default_str();
  app.add_option("--lr", config.lr, "peak learning rate of pretraining and full fine-tuning")
      ->check(dtp::cli::Range(1e-12, 1000.0))
      ->capture_default_str();
  app.add_option("--lora-lr", lora_lr, "peak learning rate of LoRA fine-tuning")
      ->check(dtp::cli::Range(1e-12, 1000.0))
      ->capture_default_str();
  app.add_option("--world", world,
                 "ranks of the data-parallel step whose all-reduced bytes are counted")
      ->check(dtp::cli::Range(2, 64))
      ->capture_default_str();
  app.add_option("--batch", config.batch, "sequences per step")
      ->check(dtp::cli::Range(std::int64_t{1}, std::int64_t{1} << 20))
      ->capture_default_str();
  add_model_options(app, config);
  app.add_option("--json", json_path, "append one JSON object per method to FILE")
      ->type_name("FILE");
  if (auto status = dtp::cli::parse(app, argc, argv)) return *status;
  try {
    const std::vector<std::string> targets = ch08::parse_lora_targets(targets_text);
    DTP_CHECK(config.batch % world == 0, "--batch ", config.batch, " must divide by --world ",
              world);
    FILE* json = nullptr;
    if (!open_json("dtp-bench-lora-finetune", json_path, json)) return 2;
    const RunContext context = make_context();
    const std::string checkpoint = (std::filesystem::temp_directory_path() /
                                    ("dtp-lora-base-" + std::to_string(::getpid()) + ".ckpt"))
                                       .string();
    // Removed however this block ends (an error in fine-tuning too).
    struct RemoveAtExit {
      std::string path;
      ~RemoveAtExit() {
        std::error_code ignored;
        std::filesystem::remove(path, ignored);
      }
    } remove_checkpoint{checkpoint};

    // 1. Pretraining on task 1 (data seed 1), saved.
    TrainConfig pretrain = config;
    pretrain.seed = 1;
    pretrain.steps = pretrain_steps;
    std::printf("pretraining %lld steps on task 1 (data seed 1): ",
                static_cast<long long>(pretrain_steps));
    std::fflush(stdout);
    {
      Trainer trainer(pretrain);
      TrainResult result;
      result.peak_by_category.assign(kMemoryCategoryCount, 0);
      for (std::int64_t s = 0; s < pretrain_steps; ++s)
        result.add_step(trainer.step(), *current_memory_tracker());
      std::printf("loss %.4f -> %.4f; saved to %s\n", result.first_loss(), result.last_loss(),
                  checkpoint.c_str());
      trainer.save(checkpoint);
    }
    const Checkpoint saved = read_checkpoint(checkpoint);

    // 2. Fine-tuning on task 2, every method from the checkpoint: the first
    //    phrases of the same bank (same data seed, fewer patterns), or another bank.
    TrainConfig finetune = config;
    finetune.seed = task == "new" ? 2 : 1;
    if (task == "subset") finetune.synthetic.patterns = subset_patterns;
    finetune.steps = finetune_steps;
    const std::string task_name = task == "new"
                                      ? "task 2: another phrase bank (data seed 2)"
                                      : "task 2: the first " + std::to_string(subset_patterns) +
                                            " of the 32 pretraining phrases";
    std::vector<int> methods = {0};
    for (std::int64_t r : ranks) methods.push_back(static_cast<int>(r));
    std::vector<Measured> measured;
    for (int r : methods) {
      TrainConfig c = finetune;
      if (r > 0) c.lr = lora_lr;
      Measured m;
      m.method = r == 0 ? "full" : "lora";
      m.rank = r;
      {
        FineTuner tuner(c, checkpoint, saved, r, targets);
        m.parameters = tuner.trainer.model().parameter_count();
        m.trainable = r == 0 ? m.parameters : tuner.lora->trainable_parameters();
        TrainResult result;
        result.peak_by_category.assign(kMemoryCategoryCount, 0);
        for (std::int64_t s = 0; s < c.steps; ++s) {
          StepRecord record = tuner.trainer.step();
          m.losses.push_back(record.loss);
          m.seconds += record.seconds;
          result.add_step(record, *current_memory_tracker());
        }
        m.peaks = result.peak_by_category;
        m.first_loss = result.first_loss();
        m.last_loss = result.last_loss();
      }
      // One data-parallel step on `world` ranks, counting what it all-reduces.
      launch(World::from_env(world), [&](Comm& comm) {
        FineTuner tuner(c, checkpoint, saved, r, targets, comm.rank(), comm.size());
        std::unique_ptr<ch08::LoraDataParallel> lora_ddp;
        if (r == 0)
          tuner.trainer.on_after_backward(
              [&] { ch02::flat_all_reduce_gradients(comm, tuner.trainer.model()); });
        else
          lora_ddp =
              std::make_unique<ch08::LoraDataParallel>(comm, tuner.trainer.model(), *tuner.lora);
        if (lora_ddp) tuner.trainer.on_after_backward([&] { lora_ddp->finish(); });
        const CommStats before = comm.stats();
        tuner.trainer.step();
        const CommStats after = comm.stats();
        if (comm.rank() == 0) {
          m.ddp_bytes = after.collective_bytes - before.collective_bytes;
          m.ddp_calls = after.total_collective_calls() - before.total_collective_calls();
        }
      });
      measured.push_back(m);
    }
    std::filesystem::remove(checkpoint);

    const Measured& full = measured.front();
    const auto mib = [](std::int64_t bytes) { return static_cast<double>(bytes) / 1048576.0; };
    std::printf(
        "\nfine-tuning %lld steps on %s, from the checkpoint; LoRA on %s, alpha = 2r, "
        "lr %.3g (full %.3g); %s\n",
        static_cast<long long>(finetune_steps), task_name.c_str(), targets_text.c_str(), lora_lr,
        config.lr, config.model.describe().c_str());
    std::printf("%-8s %12s %8s %10s %10s %10s %10s %14s %10s %10s %9s\n", "method", "trainable",
                "%", "params", "grads", "optimizer", "activat.", "DDP bytes/step", "loss 1-10",
                "last 10", "vs full");
    for (const Measured& m : measured) {
      const std::string name = m.rank == 0 ? "full" : "lora r=" + std::to_string(m.rank);
      const auto peak = [&](MemoryCategory k) { return mib(m.peaks[static_cast<int>(k)]); };
      std::printf(
          "%-8s %12lld %7.2f%% %8.3f M %8.3f M %8.3f M %8.3f M %14lld %10.4f %10.4f %8.3fx\n",
          name.c_str(), static_cast<long long>(m.trainable), 100.0 * m.trainable / m.parameters,
          peak(MemoryCategory::params), peak(MemoryCategory::grads),
          peak(MemoryCategory::optimizer), peak(MemoryCategory::activations),
          static_cast<long long>(m.ddp_bytes), m.first_loss, m.last_loss,
          m.last_loss / full.last_loss);
      JsonLine line;
      line.add("bench", "lora_finetune")
          .add("task", task)
          .add("task_patterns", finetune.synthetic.patterns)
          .add("method", m.method)
          .add("rank", m.rank)
          .add("alpha", 2.0 * m.rank)
          .add("targets", targets)
          .add("trainable", m.trainable)
          .add("parameters", m.parameters)
          .add("trainable_fraction",
               static_cast<double>(m.trainable) / static_cast<double>(m.parameters))
          .add("peak_params_bytes", m.peaks[static_cast<int>(MemoryCategory::params)])
          .add("peak_grads_bytes", m.peaks[static_cast<int>(MemoryCategory::grads)])
          .add("peak_optimizer_bytes", m.peaks[static_cast<int>(MemoryCategory::optimizer)])
          .add("peak_activations_bytes", m.peaks[static_cast<int>(MemoryCategory::activations)])
          .add("ddp_world", world)
          .add("ddp_bytes_per_step", m.ddp_bytes)
          .add("ddp_collectives_per_step", m.ddp_calls)
          .add("first_loss", m.first_loss)
          .add("last_loss", m.last_loss)
          .add("last_loss_vs_full", m.last_loss / full.last_loss)
          .add("losses", m.losses)
          .add("seconds", m.seconds)
          .add("lr", m.rank == 0 ? config.lr : lora_lr)
          .add("pretrain_steps", pretrain_steps)
          .add("finetune_steps", finetune_steps)
          .add("d_model", config.model.d_model)
          .add("layers", config.model.layers)
          .add("heads", config.model.heads)
          .add("batch", config.batch)
          .add("seq", config.seq);
      write_line(json, add_context(line, context));
    }
    if (close_json(json, "dtp-bench-lora-finetune", 0) != 0) return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dtp-bench-lora-finetune: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
