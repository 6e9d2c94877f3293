/// @file trainer.h
/// @brief Single-device training: the Trainer (one optimizer step at a time),
/// the train() loop behind `dtp train`, step records and their JSON lines.
///
/// Later chapters build on Trainer: a data-parallel rank constructs
/// `Trainer(config, rank, world)` (it then samples only its slice of each
/// global batch), hooks communication into `trainer.model().on_grad_ready(...)`
/// and calls `step()`. A whole strategy can be registered under a name that
/// `dtp train --strategy NAME` runs.
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
  std::string strategy = "single";  ///< a registered strategy (see strategy_names())
  std::string trace_path;           ///< Chrome trace JSON of the run (empty: none)
  /// Checkpoints (dtp/checkpoint.h; the strategies resumable_strategies()
  /// names). save_path: write one at the end of the run. resume_path:
  /// continue the run that wrote it (what it trains, optimizer state, steps
  /// done; every other setting but steps must match, the strategy's own
  /// included). load_path: start from its parameters only (fine-tuning; under
  /// LoRA the frozen base, which may come with resume_path's adapters).
  /// stop_after: stop after this step (0: at steps), so a run of `steps` can
  /// be trained in slices with save and resume.
  std::string save_path;
  std::string resume_path;   ///< see save_path
  std::string load_path;     ///< see save_path
  std::int64_t stop_after = 0;  ///< see save_path
  std::string json_path;            ///< JSON-lines log (empty: none)
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
  std::int64_t step = 0;                   ///< counted from 1
  double loss = 0;                         ///< mean loss of this rank's batch
  double lr = 0;                           ///< learning rate used
  double grad_norm = 0;                    ///< global norm before clipping
  double seconds = 0;                      ///< wall time of the step (a strategy: its slowest rank's)
  double tokens_per_second = 0;            ///< tokens / seconds
  std::int64_t tokens = 0;                 ///< tokens of the step (a strategy: over all ranks)
  std::int64_t peak_bytes = 0;             ///< highest tracked memory during the step
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

class Comm;
/// A strategy's per-rank report: gathers every rank's @p row (the same
/// length on every rank) to rank 0 of @p comm. Rank 0 gets one row per
/// rank, in rank order; the others get an empty list. Collective.
std::vector<std::vector<double>> gather_rows_to_rank0(Comm& comm, const std::vector<double>& row);

/// How a group of ranks makes one step of their records (report_group_step).
struct GroupStepRule {
  /// The ranks that hold a slice of the batch of their own: their tokens
  /// count, and their losses make the mean. Empty: every rank (data
  /// parallel). Ranks that share a slice count it once (tensor parallel:
  /// one rank per tensor-parallel group; sequence parallel: rank 0).
  std::function<bool(int rank)> own_slice;
  /// True: each rank's loss is of its own slice, and the group's is their
  /// mean (equal slices: the mean of the means is the batch's mean). False:
  /// the step already reduced the loss, and rank 0's is the group's.
  bool mean_loss = true;
};

/// One rank's numbers of a group step, as rank 0 received them.
struct RankStepRow {
  double loss = 0;             ///< the rank's own loss
  double seconds = 0;          ///< the rank's own step time
  double tokens = 0;           ///< the tokens of the rank's own record
  std::vector<double> extra;   ///< the rank's @p extra of report_group_step
};

/// The step of a whole group, reported by rank 0. Collective over @p comm:
/// every rank passes its own @p record and @p extra numbers (as many on
/// every rank). On rank 0 @p record becomes the group's step: the slowest
/// rank's seconds (the step is done when its last rank is), the tokens and
/// loss of the ranks @p rule counts, tokens per second from those; the
/// result holds every rank's row, in rank order. The other ranks get an
/// empty list and keep their record.
std::vector<RankStepRow> report_group_step(Comm& comm, StepRecord& record, const std::vector<double>& extra = {},
                                           const GroupStepRule& rule = {});

/// A finished run.
struct TrainResult {
  std::vector<StepRecord> steps;  ///< one per step
  double seconds = 0;             ///< wall time, setup included
  std::int64_t parameters = 0;    ///< model size
  std::string data_name;          ///< what it trained on
  /// Peak bytes per MemoryCategory over the run (index = category).
  std::vector<std::int64_t> peak_by_category;
  std::int64_t peak_bytes = 0;  ///< highest tracked memory of any step
  /// Appends @p record and folds the tracker's peaks into the run's peaks.
  void add_step(const StepRecord& record, const MemoryTracker& tracker);
  /// Steps averaged by first_loss() and last_loss(): 10, or half of a
  /// shorter run (so the two never overlap), or 1 for a one-step run.
  std::int64_t loss_window() const;
  /// Mean loss of the first loss_window() steps.
  double first_loss() const;
  /// Mean loss of the last loss_window() steps.
  double last_loss() const;
};

/// The optimizer @p config names (SGD or AdamW, with its settings) over
/// @p buffers: what Trainer builds over the model's units, and what a sharded
/// strategy builds over its shards.
std::unique_ptr<Optimizer> make_optimizer(const TrainConfig& config, std::vector<ParamBuffer> buffers);

/// One setting that decides what a run computes: the flag that sets it and
/// its value. Every rank of a run must share them (check_ranks_agree), and a
/// strategy's own ones (--world, --ddp-mode, ...) are recorded in a
/// checkpoint ("strategy_settings") that a resumed run must match.
struct RunSetting {
  std::string flag;   ///< e.g. "--seed"
  std::string value;  ///< e.g. "1234"
};

/// The strategies that save and continue a run (--save, --resume,
/// --stop-after, --load): every strategy DTP has.
const std::vector<std::string>& resumable_strategies();

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

/// Copies the parameters of a checkpoint into @p model ("params/<unit>.<name>"
/// for each of the model's parameters): fine-tuning from pretrained weights,
/// with no optimizer state and no steps. A file of another float dtype is
/// cast to the model's (f32 to bf16 rounds to nearest even), as PyTorch's
/// load_state_dict does. Throws dtp::Error naming @p path, the first
/// parameter the file lacks or holds with another shape (or not as floats),
/// and the model settings that differ.
void load_parameters(GPT& model, const Checkpoint& checkpoint, const std::string& path);
/// --load: load_parameters() from config.load_path when it is set, nothing
/// otherwise. A strategy that cuts or shards the model calls it before it
/// does: every rank reads the whole file and keeps its part.
void load_parameters(GPT& model, const TrainConfig& config);

/// Writes a "model" checkpoint to @p path: @p model's parameters
/// ("params/<unit>.<name>"), with @p config as its settings; what
/// load_parameters() reads (a merged LoRA model, weights for inference).
void save_parameters(const std::string& path, GPT& model, const TrainConfig& config);

/// The run's settings as the log's config line writes them (a JSON object).
std::string config_json(const TrainConfig& config);
/// The model's settings as the config line's "model" object writes them.
std::string model_json(const GPTConfig& model);

/// Loads the dataset a config names (the file, or the synthetic stream).
TokenDataset load_dataset(const TrainConfig& config);

/// Called after every step with its record.
using StepCallback = std::function<void(const StepRecord&)>;
/// A whole training strategy: runs config.steps steps, calling on_step after each.
using StrategyFn = std::function<TrainResult(const TrainConfig&, const StepCallback&)>;

/// Makes `train()` (and `dtp train --strategy NAME`) run @p fn for @p name.
void register_strategy(const std::string& name, StrategyFn fn);
/// Registered strategy names, sorted ("single" is always there).
std::vector<std::string> strategy_names();

/// Runs the strategy config.strategy (throws dtp::Error listing the accepted
/// names for an unknown one). Writes the trace and JSON log when asked: both
/// are opened before the first step and written as the run goes, and a run
/// that fails still leaves its spans and a {"kind":"failed"} log line.
TrainResult train(const TrainConfig& config, const StepCallback& on_step = {});
/// The single-device loop that the "single" strategy runs.
TrainResult train_single(const TrainConfig& config, const StepCallback& on_step = {});

/// One progress line: "step   10/200  loss 3.2145  lr 1.50e-03  ...".
std::string format_step(const StepRecord& record, std::int64_t total_steps);
/// The closing summary: time, throughput, loss before and after, memory.
std::string format_summary(const TrainResult& result);
/// {"kind":"step","step":10,"loss":...} (one line, no newline).
std::string step_json(const StepRecord& record);

/// Writes one JSON object per line; flushes each line.
class JsonLinesWriter {
 public:
  /// Throws dtp::Error naming @p path when it cannot be opened.
  explicit JsonLinesWriter(const std::string& path);
  /// Writes @p json_object and a newline.
  void write(const std::string& json_object);

 private:
  std::ofstream out_;
  std::string path_;
};

}  // namespace dtp
