/// @file pipeline.h
/// @brief Chapter 05 contract: pipeline parallelism.
///
/// Pipeline parallelism splits the model by **depth**: rank r of a pipeline
/// of p ranks holds a contiguous run of the model's units (a **stage**). A
/// batch is cut into m **micro-batches**; a micro-batch's activations travel
/// forward from stage to stage (send/recv), its gradients travel back, and
/// each stage accumulates its units' gradients over the micro-batches before
/// one optimizer step. While stage 0 works on micro-batch 2, stage 1 can work
/// on micro-batch 1: that overlap is the whole point, and the idle time that
/// is left (the **bubble**) is what the schedules below fight.
///
/// A **schedule** is data: for each rank, the ordered list of actions it
/// runs, F(mb) forward, B(mb) backward and, when the backward is split for
/// zero-bubble schedules, B(mb) the input gradient and W(mb) the weight
/// gradient. The sends and receives follow from the data flow, so one
/// executor (7) runs every schedule, and one verifier (provided) checks any
/// schedule and simulates it: its makespan, bubble and memory.
///
/// Interleaved schedules give each rank v **model chunks**: the model is
/// split into p x v virtual stages and rank r holds virtual stages r, r + p,
/// ..., r + (v-1) p (chunk c of rank r is virtual stage c p + r).
///
/// See chapters/05_pipeline/README.md for the pictures and the formulas.
#pragma once

#include <any>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dtp/comm.h"
#include "dtp/data.h"
#include "dtp/error.h"
#include "dtp/nn.h"
#include "dtp/optim.h"
#include "dtp/tensor.h"
#include "dtp/trainer.h"

/// Chapter 05: pipeline parallelism.
namespace dtp::ch05 {

// --- provided: schedules as data -------------------------------------------------

/// What an action does with one micro-batch on one stage.
enum class ActionKind {
  forward,   ///< F: the stage's forward
  backward,  ///< B: the stage's backward; only the input gradient when the schedule splits it
  weight,    ///< W: the weight gradients a split B left for later (zero-bubble)
};

/// "F", "B" or "W".
const char* action_letter(ActionKind kind);

/// One entry of a rank's list: what to do, for which micro-batch, on which
/// of the rank's model chunks (always 0 unless the schedule is interleaved).
struct Action {
  ActionKind kind = ActionKind::forward;  ///< F, B or W
  int microbatch = 0;                     ///< 0 .. m-1
  int chunk = 0;                          ///< 0 .. v-1
  /// Same kind, micro-batch and chunk.
  bool operator==(const Action& other) const = default;
};

/// Shorthands for building lists: F(3) is Action{forward, 3, 0}.
inline Action F(int microbatch, int chunk = 0) { return {ActionKind::forward, microbatch, chunk}; }
/// B(3): the backward of micro-batch 3 (its input gradient when split).
inline Action B(int microbatch, int chunk = 0) { return {ActionKind::backward, microbatch, chunk}; }
/// W(3): the deferred weight gradients of micro-batch 3.
inline Action W(int microbatch, int chunk = 0) { return {ActionKind::weight, microbatch, chunk}; }

/// "F3", or "F3c1" on chunk 1 of an interleaved schedule.
std::string action_name(const Action& action, int chunks = 1);

/// A pipeline schedule: per rank, the actions in the order that rank runs them.
struct Schedule {
  std::string name;             ///< "afab", "1f1b", "interleaved" or "zb-h1"
  int stages = 1;               ///< p: ranks in the pipeline
  int microbatches = 1;         ///< m: micro-batches per step
  int chunks = 1;               ///< v: model chunks per rank (interleaved), else 1
  bool split_backward = false;  ///< B computes the input gradient only, and W the weight gradients
  std::vector<std::vector<Action>> actions;  ///< actions[r]: rank r's list, in order

  /// p x v.
  int virtual_stages() const { return stages * chunks; }
  /// The virtual stage that chunk @p chunk of rank @p rank holds: chunk * p + rank.
  int virtual_stage(int rank, int chunk) const { return chunk * stages + rank; }
};

/// A schedule named @p name with @p stages empty lists. Throws dtp::Error
/// naming the argument when stages, microbatches or chunks is below 1. The
/// schedule puzzles start from it.
Schedule empty_schedule(const std::string& name, int stages, int microbatches, int chunks = 1,
                        bool split_backward = false);

/// What each action costs on the simulated clock. The defaults are the
/// lesson's units: F = 1, a whole backward 2 (it computes two matrix
/// products per linear to the forward's one); split, its halves 1 and 1.
struct ActionCosts {
  double forward = 1;          ///< F
  double backward = 2;         ///< B of a schedule that does not split the backward
  double backward_input = 1;   ///< B of a split schedule (the input gradient)
  double backward_weight = 1;  ///< W (the weight gradients)
  /// The cost of one @p kind action in a schedule that splits (or not) the backward.
  double of(ActionKind kind, bool split_backward) const;
};

/// One action placed in time.
struct TimedAction {
  Action action;     ///< what ran
  double start = 0;  ///< when it started
  double end = 0;    ///< when it ended
};

/// What simulating a schedule found.
struct ScheduleReport {
  /// "" when the schedule is complete, respects every dependency and runs to
  /// the end; otherwise the first problem in words: a missing or repeated
  /// action, a B before its own F, a W before its B, or a deadlock with its
  /// cycle ("deadlock: rank 0 waits at B0 for rank 1's B0; rank 1 waits at
  /// F1 for rank 0's F1. ...").
  std::string problem;
  double makespan = 0;         ///< when the last action ends
  std::vector<double> busy;    ///< per rank: the sum of its actions' costs
  double bubble_fraction = 0;  ///< idle share: 1 - sum(busy) / (p x makespan)
  std::vector<int>
      peak_alive;  ///< per rank: most micro-batches (x chunks) holding activations at once
  std::vector<std::vector<TimedAction>> timeline;  ///< per rank, in run order
  /// True when problem is empty.
  bool ok() const { return problem.empty(); }
};

/// The verifier. Checks that @p schedule has exactly one F and one B per
/// (rank, chunk, micro-batch), and one W when it splits the backward (none
/// otherwise), then runs every rank's list in order on a simulated clock:
/// an action starts when its rank is free and its inputs exist (F after the
/// previous virtual stage's F of the same micro-batch; B after its own F and
/// after the next virtual stage's B; W after its own B), and lasts its cost.
/// Messages are free. A micro-batch is alive on a rank from its F until its
/// backward is complete (B, or W when split).
ScheduleReport simulate_schedule(const Schedule& schedule, const ActionCosts& costs = {});

/// The most micro-batches (x chunks) alive at once on a rank that runs
/// @p actions in this order: each is alive from its F until its backward is
/// complete (B, or W when @p split_backward). The verifier and the trainer
/// both count with it.
int peak_alive(const std::vector<Action>& actions, bool split_backward);

/// Throws dtp::Error with simulate_schedule(schedule).problem when there is one.
void check_schedule(const Schedule& schedule);

/// An ASCII Gantt chart of @p report: one row per rank, one column per
/// @p unit of time, each action drawn as its letter and micro-batch ("F3"
/// filling its columns, interleaved chunks in upper/lower case), idle time
/// as '.'. Then the makespan, the bubble and the peak alive per rank.
std::string gantt_chart(const Schedule& schedule, const ScheduleReport& report, double unit = 1.0);

/// The schedules the course builds.
enum class ScheduleKind { afab, one_f_one_b, interleaved, zb_h1 };
/// "afab", "1f1b", "interleaved" or "zb-h1".
const char* schedule_kind_name(ScheduleKind kind);
/// Parses those names; throws dtp::Error listing them otherwise.
ScheduleKind parse_schedule_kind(const std::string& name);
/// The schedule of @p kind for p = @p stages, m = @p microbatches (and v =
/// @p chunks for interleaved; ignored otherwise): calls the puzzle below.
Schedule make_schedule(ScheduleKind kind, int stages, int microbatches, int chunks = 2);

/// The lesson's bubble formula for @p kind with unit costs (F = 1, B = 2,
/// or F = B = W = 1 for zb-h1): (p-1)/(m+p-1) for afab and 1f1b,
/// (p-1)/(v m+p-1) interleaved, (p-1+max(0,p-m))/(3m+p-1+max(0,p-m)) zb-h1.
double bubble_formula(ScheduleKind kind, int stages, int microbatches, int chunks = 2);

// --- puzzles 3-6: the schedules ----------------------------------------------------

/// Puzzle 5.3. GPipe / all-forward-all-backward: every rank runs F0 .. F(m-1),
/// then B0 .. B(m-1). Bubble (p-1)/(m+p-1); a rank holds all m micro-batches'
/// activations at the turn. Throws (through empty_schedule) for p or m < 1.
Schedule afab_schedule(int stages, int microbatches);

/// Puzzle 5.4. 1F1B: rank r runs min(p-r-1, m) warm-up forwards, then
/// alternates one forward and one backward while forwards remain, then the
/// remaining backwards. The same bubble as AFAB, but rank r never holds more
/// than p - r micro-batches. Throws (through empty_schedule) for p or m < 1.
Schedule one_f_one_b_schedule(int stages, int microbatches);

/// Puzzle 5.5. Interleaved 1F1B (Megatron-LM): v chunks per rank, the
/// micro-batches taken in groups of p, each group through chunk 0, then
/// chunk 1, ... (backward: the last chunk first). Rank r runs
/// min((p-r-1) x 2 + (v-1) x p, m v) warm-up forwards, then 1F1B.
/// Bubble (p-1)/(v m + p - 1). Needs v >= 2, p >= 2 and m a multiple of p:
/// otherwise throws dtp::Error naming the numbers and the condition.
Schedule interleaved_schedule(int stages, int microbatches, int chunks);

/// Puzzle 5.6. ZB-H1 (zero bubble, the 1F1B-memory variant): split
/// backward. Rank r runs 1F1B's warm-up forwards, then F, B pairs as in
/// 1F1B, but delays its W's: the first r B's are not followed by their W,
/// later B's are followed by the oldest waiting W, and the W's still
/// waiting at the end fill the drain. At most p micro-batches alive per
/// rank; with F = B = W its bubble is a third of 1F1B's when m >= p.
Schedule zb_h1_schedule(int stages, int microbatches);

// --- puzzle 1: which units go where ---------------------------------------------------

/// The units of one stage: model units [first, first + count).
struct UnitRange {
  int first = 0;  ///< index of its first unit (0 = the embedding)
  int count = 0;  ///< how many consecutive units
  /// Same first and count.
  bool operator==(const UnitRange& other) const = default;
};

/// Puzzle 5.1. Splits units 0 .. n-1 (n = costs.size()) into @p stages
/// contiguous, non-empty ranges, in order, so that the most expensive stage
/// (the sum of its units' costs) is as cheap as possible: the pipeline runs
/// at the pace of its slowest stage. Throws dtp::Error when stages < 1, when
/// stages > n ("5 stages but only 4 units: each stage needs at least one"),
/// or when a cost is negative or not finite (naming the unit).
std::vector<UnitRange> partition_units(const std::vector<double>& costs, int stages);

/// Provided: the parameters of each unit of @p model, as costs.
std::vector<double> unit_costs_by_parameters(const GPT& model);

/// Provided: the measured seconds of each unit's forward plus backward on
/// @p batch (the median of @p repeats runs), as costs.
std::vector<double> unit_costs_by_time(GPT& model, const Batch& batch, int repeats = 3);

// --- provided: a stage and its micro-batches -----------------------------------------

/// One micro-batch: rows of the step's batch.
struct MicroBatch {
  Tensor inputs;   ///< i32 [b, T]
  Tensor targets;  ///< i32 [b, T]
};

/// Cuts @p batch ([B, T]) into @p microbatches micro-batches of B/m whole
/// sequences (views, no copies). Throws dtp::Error naming B and m when B is
/// not a multiple of m.
std::vector<MicroBatch> split_microbatches(const Batch& batch, int microbatches);

/// What a stage did with one action, on both clocks.
struct ActionRecord {
  Action action;           ///< what ran (chunk = the stage's chunk)
  double clock_start = 0;  ///< the simulated clock when it started
  double clock_end = 0;    ///< ... and ended: clock_start + its cost
  double wall_start = 0;   ///< seconds since the stage's record was last cleared
  double wall_end = 0;     ///< ... when it ended
};

/// How a stage runs the units of one kind of model (provided). StageModule
/// calls it unit by unit and keeps what each unit saved per micro-batch;
/// the serial GPT has one (the StageModule(GPT&, ...) constructor makes it),
/// and chapter 12 gives its tensor-parallel GPT another, so the same
/// executor (5.7) runs either.
class StageRunner {
 public:
  virtual ~StageRunner() = default;
  /// How many units the whole model has (0 = the embedding, the last = the head).
  virtual int unit_count() const = 0;
  /// Unit @p u, or nullptr where this rank does not hold it.
  virtual Unit* unit(int u) = 0;
  /// Forward of unit @p u on @p x (token ids for unit 0). Keeps in @p saved
  /// what its backward needs. Returns the output; the head computes the
  /// loss against microbatch.targets into @p loss and returns undefined.
  virtual Tensor forward(int u, const Tensor& x, const MicroBatch& microbatch, std::any& saved,
                         double& loss) = 0;
  /// Backward of unit @p u: @p dy is its output gradient (undefined for the
  /// head, which starts from its loss times @p loss_scale). Returns the input
  /// gradient (undefined for the embedding). With WeightGrads::deferred
  /// the weight gradients wait for weight().
  virtual Tensor backward(int u, const Tensor& dy, std::any& saved, WeightGrads mode,
                          double loss_scale) = 0;
  /// The deferred weight gradients of unit @p u.
  virtual void weight(int u, std::any& saved) = 0;
  /// A receive buffer for what crosses a stage boundary (see StageModule::boundary_tensor).
  virtual Tensor boundary_tensor(const MicroBatch& microbatch, bool gradient) const = 0;
};

/// The units of one stage (a model chunk) of a GPT, run one micro-batch at
/// a time (provided). forward() and backward() run its units in order and
/// in reverse, keeping each micro-batch's saved activations apart, so a
/// schedule can hold several micro-batches in flight. The stage holding the
/// embedding takes token ids; the one holding the head computes the loss.
///
/// Each call is one schedule action: it charges the action's cost (ActionCosts)
/// on the pipeline communicator's simulated clock, so an executed run's
/// clock can be compared with the verifier's, records the action (records())
/// and leaves a trace span named after it ("F3", "B3", "W3").
class StageModule {
 public:
  /// The units @p units of @p model (which must outlive the stage), as chunk
  /// @p chunk of this rank. Their gradients accumulate until zero_grad().
  StageModule(GPT& model, UnitRange units, int chunk = 0);
  /// The units @p units of the model @p runner runs (every unit of the
  /// range must be held: runner->unit(u) not null), as chunk @p chunk.
  StageModule(std::shared_ptr<StageRunner> runner, UnitRange units, int chunk = 0);

  /// Charges every action's cost on @p pp's clock from now on.
  void set_clock(Comm& pp, const ActionCosts& costs, bool split_backward);
  /// True when the stage holds the embedding (its input is token ids).
  bool is_first() const;
  /// True when the stage holds the head (it computes the loss).
  bool is_last() const;
  /// The units this stage holds.
  UnitRange range() const { return range_; }
  /// The model chunk this stage is on its rank.
  int chunk() const { return chunk_; }
  /// Its units, in forward order.
  std::vector<Unit*> units();
  /// A receive buffer for what crosses a stage boundary for @p microbatch:
  /// [b, T, C] in the model's dtype and device (the runner's shape for
  /// another model: chapter 12's token shard [b T / t, C]). An activation (the next
  /// stage keeps it: MemoryCategory::activations), or with @p gradient the
  /// gradient sent back (MemoryCategory::other).
  Tensor boundary_tensor(const MicroBatch& microbatch, bool gradient = false) const;

  /// Forward of micro-batch @p index (F): @p input is microbatch.inputs on
  /// the first stage, otherwise the previous stage's output. Returns this
  /// stage's output [b, T, C]; on the last stage the loss is computed
  /// against microbatch.targets instead and an undefined tensor returned.
  /// Keeps what backward needs until backward (or W) of @p index.
  Tensor forward(int index, const Tensor& input, const MicroBatch& microbatch);
  /// The loss of micro-batch @p index (last stage, after its forward).
  double loss(int index) const;
  /// Backward of micro-batch @p index (B): @p dy is d(loss)/d(output) from the
  /// next stage (undefined on the last stage, which starts from its loss
  /// times @p loss_scale). Returns d(loss)/d(input) to send back (undefined
  /// on the first stage). Accumulates the gradients, or with
  /// WeightGrads::deferred leaves the weight gradients for weight(index).
  Tensor backward(int index, const Tensor& dy, double loss_scale,
                  WeightGrads mode = WeightGrads::immediate);
  /// The deferred weight gradients of micro-batch @p index (W).
  void weight(int index);
  /// Micro-batches holding saved activations (F done, backward not complete).
  int alive() const { return static_cast<int>(saved_.size()); }
  /// The most alive() has been since clear_records().
  int peak_alive() const { return peak_alive_; }
  /// Every action since clear_records(), in order.
  const std::vector<ActionRecord>& records() const { return records_; }
  /// Forgets the records and peak_alive, and restarts the wall clock at 0.
  void clear_records();
  /// Where the records' wall clock starts: steady-clock seconds, the same
  /// clock for every rank of one machine.
  double wall_origin() const { return wall_zero_; }
  /// Zeroes the units' gradients.
  void zero_grad();

  /// Hooks around each unit (pipeline x FSDP, 5.8): called with the unit
  /// before and after its forward, before its backward, and after its
  /// backward is complete (after the W of a deferred one).
  using UnitHook = std::function<void(Unit&)>;
  /// Adds a hook run before each unit's forward.
  void on_before_forward(UnitHook hook) { before_forward_.push_back(std::move(hook)); }
  /// Adds a hook run after each unit's forward.
  void on_after_forward(UnitHook hook) { after_forward_.push_back(std::move(hook)); }
  /// Adds a hook run before each unit's backward (B).
  void on_before_backward(UnitHook hook) { before_backward_.push_back(std::move(hook)); }
  /// Adds a hook run once a unit's gradient of one micro-batch is complete.
  void on_grad_ready(UnitHook hook) { grad_ready_.push_back(std::move(hook)); }
  /// Removes every hook.
  void clear_hooks();

 private:
  struct Saved;
  void begin_action(const Action& action);
  void end_action();
  std::shared_ptr<StageRunner> runner_;
  UnitRange range_;
  int chunk_;
  Comm* clock_ = nullptr;
  ActionCosts costs_;
  bool split_ = false;
  std::map<int, std::shared_ptr<Saved>> saved_;
  int peak_alive_ = 0;
  std::vector<ActionRecord> records_;
  double wall_zero_ = 0;
  std::vector<UnitHook> before_forward_, after_forward_, before_backward_, grad_ready_;
};

/// The tag of the message that virtual stage @p sender sends for micro-batch
/// @p microbatch: its output activation (@p gradient false, to sender + 1)
/// or its input gradient (true, to sender - 1). Every message of a step has
/// its own tag, so a rank may receive them in any order (provided). Without
/// interleaving the virtual stage is the rank. A tag packs the virtual
/// stage into 7 bits and the micro-batch into 12, so a pipeline has at most
/// kMaxVirtualStages virtual stages and kMaxMicrobatches micro-batches.
int pipeline_tag(bool gradient, int microbatch, int sender);
/// The most virtual stages (p x v) a pipeline_tag() can name (7 bits).
inline constexpr int kMaxVirtualStages = 128;
/// The most micro-batches per step a pipeline_tag() can name (12 bits).
inline constexpr int kMaxMicrobatches = 4096;
/// What a pipeline_tag() names, in words, for reading a deadlock report:
/// "the activation of micro-batch 0 sent by virtual stage 1" (provided).
std::string describe_pipeline_tag(int tag);

// --- puzzles 2 and 7: running a pipeline ---------------------------------------------

/// Puzzle 5.2. The naive pipeline: one micro-batch, one stage per rank of
/// @p pp. Rank r receives its input from rank r-1 (rank 0 reads the
/// tokens), runs its forward and sends the output to rank r+1; the last
/// rank computes the loss and starts the backward (loss_scale 1); each rank
/// then receives its output gradient from rank r+1, runs its backward and
/// sends the input gradient to rank r-1. Only one rank computes at a time.
/// Returns the loss on the last rank and 0 on the others.
double naive_pipeline_step(Comm& pp, StageModule& stage, const MicroBatch& batch);

/// Puzzle 5.7. The executor: runs this rank's list of @p schedule
/// (schedule.actions[pp.rank()]) for one step, @p chunks[c] being this
/// rank's chunk c. For each action, in order:
/// - F(mb, c): the input is the micro-batch's tokens on virtual stage 0,
///   otherwise received from the rank holding the previous virtual stage;
///   forward; unless this is the last virtual stage, send the output on.
/// - B(mb, c): the output gradient is received from the next virtual stage
///   (the last one starts from its loss, scaled by 1/m so that the m
///   micro-batches' gradients add up to the batch mean's); backward
///   (WeightGrads::deferred when the schedule splits it); unless this is
///   virtual stage 0, send the input gradient back.
/// - W(mb, c): the deferred weight gradients.
/// Every message uses pipeline_tag(). Returns the step's loss (the mean of
/// the m micro-batches' losses) on the rank holding the last virtual
/// stage, 0 on the others. It does not zero the gradients: the m
/// micro-batches add up onto whatever the units hold (the trainer calls
/// zero_grad() before each step). Throws dtp::Error when pp.size() is not
/// schedule.stages, @p chunks does not hold schedule.chunks stages or
/// @p microbatches does not hold m.
double execute_schedule(Comm& pp, const Schedule& schedule, const std::vector<StageModule*>& chunks,
                        const std::vector<MicroBatch>& microbatches);

// --- puzzle 8: pipeline x FSDP ----------------------------------------------------------

/// Puzzle 5.8. Pipeline x FSDP (ZeRO-3 inside each stage): the d ranks of a
/// data-parallel group all hold the same stage, and each keeps only its
/// 1/d shard (chunk_range(unit.numel(), d, rank)) of every unit of it.
///
/// The constructor copies this rank's shard of each of the stage's units
/// into a tensor of its own (MemoryCategory::params), zeroes a gradient
/// shard of the same size (MemoryCategory::grads), releases the units'
/// buffers, and installs hooks on @p stage:
/// - before a unit's forward: all-gather its parameters and install them;
///   after its forward: release them;
/// - before its backward: all-gather them again, with a zeroed full gradient;
/// - when a micro-batch's gradient of the unit is complete: reduce-scatter
///   it (mean over the group) and **add** it to the gradient shard (the
///   micro-batches accumulate there), then release both buffers.
/// Schedules that split the backward (zb-h1) are refused: a W would need
/// the gathered parameters long after its B.
class PipelineFsdp {
 public:
  /// Shards @p stage's units over @p dp and installs the hooks. @p dp and
  /// @p stage must outlive this object.
  PipelineFsdp(Comm& dp, StageModule& stage);
  /// Removes the hooks.
  ~PipelineFsdp();
  /// Zeroes the gradient shards (before a step's first micro-batch).
  void zero_grad();
  /// This rank's parameter shards, one per unit of the stage, in order.
  std::vector<Tensor>& parameter_shards() { return parameter_shards_; }
  /// The gradient shards, laid out like parameter_shards().
  std::vector<Tensor>& gradient_shards() { return gradient_shards_; }
  /// Installs unit @p u's (position in the stage) full parameters, gathered
  /// from the shards; the checkers read a unit between steps with it.
  void gather_unit(int u);

 private:
  Comm& dp_;
  StageModule& stage_;
  std::vector<Tensor> parameter_shards_;
  std::vector<Tensor> gradient_shards_;
};

}  // namespace dtp::ch05
