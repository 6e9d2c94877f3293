/// @file trainer.h
/// @brief The Trainer: a run's settings (TrainConfig), its model, optimizer
/// and sampler, one optimizer step at a time (StepRecord), and its
/// checkpoints.
///
/// Later chapters build on Trainer: a data-parallel rank constructs
/// `Trainer(config, rank, world)` (it then samples only its slice of each
/// global batch), hooks communication into `trainer.model().on_grad_ready(...)`
/// and calls `step()`. The whole run around it (its log, trace and summary)
/// is in dtp/train_run.h; a distributed strategy's run in drivers/strategy.h.
#pragma once

#include <chrono>
#include <cstdint>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dtp/checkpoint.h"
#include "dtp/data.h"
#include "dtp/memory.h"
#include "dtp/nn.h"
#include "dtp/optim.h"

namespace dtp {

/// Everything a training run needs. Same config, same run (bit for bit on CPU).
struct TrainConfig {
  /// The model. vocab_size is taken from the data; context is raised to seq if smaller.
  GPTConfig model;
  std::string data_path;            ///< a text file (byte tokens); empty: synthetic data
  SyntheticConfig synthetic;        ///< used when data_path is empty (vocab_size from model)
  std::int64_t steps = 300;         ///< optimizer steps
  std::int64_t batch = 16;          ///< global batch (sequences per step)
  std::int64_t seq = 64;            ///< tokens per sequence
  std::string optimizer = "adamw";  ///< "adamw" or "sgd"
  double lr = 3e-3;                 ///< peak learning rate
  double min_lr_ratio = 0.1;        ///< the cosine ends at lr * min_lr_ratio
  std::int64_t warmup = 20;         ///< linear warm-up steps
  double weight_decay = 0.0;        ///< decoupled (AdamW) or L2 (SGD)
  double beta1 = 0.9;               ///< AdamW first-moment decay
  double beta2 = 0.95;              ///< AdamW second-moment decay
  double momentum = 0.9;            ///< SGD
  double grad_clip = 1.0;           ///< clip by global norm; <= 0 disables
  std::uint64_t seed = 1234;        ///< seeds the weights, the synthetic data and the sampler
  std::string strategy = "single";  ///< the run's strategy, as logs and checkpoints name it
  /// How blocks keep their activations (chapter 09): "none", "full",
  /// "every:K" or "selective". dtp train's run loop installs the policies
  /// (drivers/checkpointing.h); the numbers a run computes do not change.
  std::string checkpoint = "none";
  std::string trace_path;  ///< Chrome trace JSON of the run (empty: none)
  /// Checkpoints (dtp/checkpoint.h). save_path: write one at the end of the
  /// run. resume_path: continue the run that wrote it (what it trains, optimizer state, steps
  /// done; every other setting but steps must match, the strategy's own
  /// included). load_path: start from its parameters only (fine-tuning; under
  /// LoRA the frozen base, which may come with resume_path's adapters).
  /// stop_after: stop after this step (0: at steps), so a run of `steps` can
  /// be trained in slices with save and resume.
  std::string save_path;
  std::string resume_path;      ///< see save_path
  std::string load_path;        ///< see save_path
  std::int64_t stop_after = 0;  ///< see save_path
  std::string json_path;        ///< JSON-lines log (empty: none)
  /// Recorded in the log's config line, so a log says how to rerun it: the
  /// program's command line (dtp train fills it) and the source revision.
  std::vector<std::string> command_line;
  std::string git_revision;  ///< e.g. "6fc42d9" (empty: not known)

  /// Throws dtp::Error naming the first bad field.
  void validate() const;
  /// The schedule these settings give.
  LRSchedule schedule() const;
  /// The model as a run builds it: a data file's vocabulary is its 256 byte
  /// values, the context covers seq, and seed seeds the weights.
  GPTConfig resolved_model() const;
};

/// What one optimizer step did.
struct StepRecord {
  std::int64_t step = 0;         ///< counted from 1
  double loss = 0;               ///< mean loss of this rank's batch
  double lr = 0;                 ///< learning rate used
  double grad_norm = 0;          ///< global norm before clipping
  double seconds = 0;            ///< wall time of the step (a strategy: its slowest rank's)
  double tokens_per_second = 0;  ///< tokens / seconds
  std::int64_t tokens = 0;       ///< tokens of the step (a strategy: over all ranks)
  std::int64_t peak_bytes = 0;   ///< highest tracked memory during the step
  std::int64_t peak_activation_bytes = 0;  ///< ... of it, MemoryCategory::activations
  /// Page faults the process took during the step (getrusage: minor + major,
  /// every thread of the process). A steady-state step should take about none.
  std::int64_t page_faults = 0;
  /// The loss scale the step's backward used (chapter 07); 0: no scaling.
  double loss_scale = 0;
  /// True when the update was skipped (a non-finite gradient under loss scaling).
  bool skipped = false;
};

/// Measures one optimizer step for its StepRecord. Made when the step starts
/// (it resets the memory tracker's peaks, starts the clock and reads the page
/// fault count); finish() fills the record's seconds, tokens, tokens per
/// second, memory peaks and page faults.
/// Trainer::step() and every strategy's step use it.
class StepMeter {
 public:
  StepMeter();
  /// Fills @p record's timing and memory for a step of @p tokens tokens.
  void finish(StepRecord& record, std::int64_t tokens) const;

 private:
  std::shared_ptr<MemoryTracker> tracker_;
  std::chrono::steady_clock::time_point start_;
  std::int64_t faults_at_start_ = 0;
};

/// The optimizer @p config names (SGD or AdamW, with its settings) over
/// @p buffers: what Trainer builds over the model's units, and what a sharded
/// strategy builds over its shards.
std::unique_ptr<Optimizer> make_optimizer(const TrainConfig& config,
                                          std::vector<ParamBuffer> buffers);

/// One setting that decides what a run computes: the flag that sets it and
/// its value. Every rank of a run must share them (check_ranks_agree), and a
/// strategy's own ones (--world, --ddp-mode, ...) are recorded in a
/// checkpoint ("strategy_settings") that a resumed run must match.
struct RunSetting {
  std::string flag;   ///< e.g. "--seed"
  std::string value;  ///< e.g. "1234"
};

/// The model, optimizer and sampler of one (data-parallel) rank.
class Trainer {
 public:
  /// Loads the data and builds the model. With world > 1 the sampler yields
  /// only this rank's slice of each global batch. The optimizer is built on
  /// first use (optimizer() or step()), so set_optimizer() before that never
  /// allocates full-size optimizer state.
  explicit Trainer(const TrainConfig& config, int rank = 0, int world = 1);
  /// One step: next batch, zero_grad, forward, backward (grad-ready hooks
  /// fire), after-backward hooks, optimizer().clip_gradients, optimizer
  /// update. Throws when the loss is not finite.
  StepRecord step();
  /// Runs @p hook after every backward, before clipping and the update: where
  /// a data-parallel strategy waits for its outstanding gradient all-reduces.
  void on_after_backward(std::function<void()> hook) { after_backward_.push_back(std::move(hook)); }
  /// Runs @p hook at the start of every step, right after the model's
  /// zero_grad: where gradients that live outside the model's units (LoRA's
  /// adapters, chapter 08) are zeroed.
  void on_zero_grad(std::function<void()> hook) { zero_grad_.push_back(std::move(hook)); }
  /// Steps taken so far.
  std::int64_t steps_done() const { return steps_done_; }
  /// The model (hook communication into it with on_grad_ready).
  GPT& model() { return *model_; }
  /// The optimizer: the one given to set_optimizer(), else (built now if
  /// needed) make_optimizer(config(), param_buffers(model())).
  Optimizer& optimizer();
  /// Uses @p optimizer from now on (a sharded one, over this rank's shards),
  /// replacing any built before; throws dtp::Error when it is null.
  void set_optimizer(std::unique_ptr<Optimizer> optimizer);
  /// This rank's sampler.
  const BatchSampler& sampler() const { return *sampler_; }
  /// The config as resolved (vocab and context filled in).
  const TrainConfig& config() const { return config_; }
  /// Writes a training checkpoint to @p path: what the run trains (every
  /// parameter of the units that are not frozen, "params/<unit>.<name>", and
  /// the tensors given to checkpoint_also(), "extra/<name>"), the
  /// optimizer's state ("optimizer/<buffer>.m", ...) and update count
  /// ("optimizer/steps": fewer than the steps when a loss scaler skipped
  /// some), the steps done,
  /// config() and @p strategy. Frozen units are left out: they are what the
  /// run started from (--load). The data needs no state: batch s is drawn
  /// from (seed, s) alone. A data-parallel run's replicas are equal, so its
  /// rank 0 alone saves.
  void save(const std::string& path, const std::vector<RunSetting>& strategy = {});
  /// Continues the run that saved @p path: its parameters, optimizer state
  /// and steps done, so that training on equals the run that was never
  /// stopped, bit for bit. Throws dtp::Error naming every setting that
  /// differs from the saved run's (all must match but steps and the output
  /// paths; @p strategy's too), or a tensor the file lacks.
  void resume(const std::string& path, const std::vector<RunSetting>& strategy = {});
  /// save() for a strategy whose ranks hold shards or slices (zero, tp, pp,
  /// ep): writes
  /// @p tensors, the run's full parameters and optimizer state gathered from
  /// every rank under the names save() gives them (parameter_entry,
  /// optimizer_entry), with what save() adds to them: the optimizer's update
  /// count, the steps done, config() and @p strategy.
  void save_gathered(const std::string& path, const std::vector<RunSetting>& strategy,
                     std::vector<NamedTensor> tensors);
  /// resume() for a strategy whose ranks hold shards: reads @p path and
  /// checks it as resume() does, sets the steps done and optimizer()'s
  /// update count, and returns the checkpoint, from which the strategy
  /// copies each rank's shards.
  Checkpoint resume_gathered(const std::string& path, const std::vector<RunSetting>& strategy);
  /// Adds tensors that live outside the model's units (LoRA's adapters) to
  /// what save() writes and resume() restores, under "extra/<name>".
  void checkpoint_also(std::vector<NamedTensor> tensors);
  /// Counts one step done, for a strategy that writes its step out itself
  /// instead of calling step() (gradient accumulation): what steps_done(),
  /// the next batch and checkpoints go by.
  void count_step() { ++steps_done_; }

 private:
  TrainConfig config_;
  std::unique_ptr<GPT> model_;
  std::unique_ptr<Optimizer> optimizer_;  // null until first needed or set
  std::unique_ptr<BatchSampler> sampler_;
  std::vector<std::function<void()>> after_backward_;
  std::vector<std::function<void()>> zero_grad_;
  std::vector<NamedTensor> extra_;  // checkpoint_also()
  std::int64_t steps_done_ = 0;
};

/// What a strategy that checkpoints does before its first step: starts from
/// config.load_path's parameters or continues config.resume_path's run (with
/// @p strategy's settings), then returns last_step().
std::int64_t start_from_checkpoints(Trainer& trainer, const std::vector<RunSetting>& strategy = {});
/// The step @p trainer's run stops after (stop_after, else steps); throws
/// dtp::Error when a resumed run is already there.
std::int64_t last_step(const Trainer& trainer);

/// Loads the dataset a config names (the file, or the synthetic stream).
TokenDataset load_dataset(const TrainConfig& config);

}  // namespace dtp
