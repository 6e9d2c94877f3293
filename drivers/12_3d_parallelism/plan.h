/// @file plan.h
/// @brief `dtp plan`: the cluster planner of chapter 12 (provided code).
///
/// Given a model, a cluster and a 3D layout (dp x pp x tp, a pipeline
/// schedule, activation recomputation, ZeRO), the planner predicts one
/// training step: memory per GPU by category, the step's time split into
/// compute, communication per group and the pipeline bubble, tokens/s and
/// MFU. It is not a second model of the machine: every collective costs what
/// the runtime's alpha-beta clock charges (dtp::collective_cost, with
/// CostModel::for_group choosing the node's link or the network's), the
/// tensor-parallel collectives are the list chapter 04's units issue
/// (tensor_parallel_unit_collectives), and the pipeline is chapter 05's
/// schedule run on that clock (simulate_step_clock). On a layout small
/// enough to execute, its clock is the executed step's clock.
///
/// Ranks are placed tiers first, as chapter 12's mesh places them: world rank
/// w = (d x pp + p) x tp + t.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "05_pipeline/pipeline.h"
#include "dtp/activation_memory.h"
#include "dtp/comm.h"
#include "dtp/gpt_config.h"

/// The cluster planner (`dtp plan`).
namespace dtp::plan {

// --- the model ---------------------------------------------------------------------

/// The shape of a decoder-only transformer. GPT-2 style (biases, LayerNorm
/// with bias, a GELU MLP, learned positions) or Llama style (no biases,
/// RMSNorm, a gated SwiGLU MLP, grouped-query attention, rotary positions).
/// The LM head is never tied to the embedding (as in the runtime's GPT).
struct ModelShape {
  std::string name = "custom";  ///< what the tables call it
  int layers = 2;               ///< L: transformer blocks
  int hidden = 64;              ///< h: width of the residual stream
  int heads = 4;                ///< a: attention heads
  int kv_heads = 4;             ///< key/value heads (grouped-query attention when below heads)
  std::int64_t ffn = 256;       ///< MLP hidden width
  std::int64_t vocab = 64;      ///< V: token ids
  int seq = 64;                 ///< s: tokens per sequence
  int positions = 64;           ///< learned position rows (0: rotary, no table)
  bool biases = true;           ///< linears and norms carry biases (GPT-2 style)
  bool gated_mlp = false;       ///< three [h, ffn] matrices (SwiGLU) instead of two
  bool dropout = false;         ///< dropout masks are kept for the backward
  /// The vocabulary is padded to a multiple of vocab_multiple x tp, as
  /// Megatron-LM pads it (128); 1 keeps it exact (the runtime's GPT).
  int vocab_multiple = 1;
  /// Activations are the tensors the runtime's GPT keeps as a chapter 12
  /// step runs it (chapter 04's reference units on the runtime's layers),
  /// counted by runtime_activation_peaks; false: Korthikanti et al.'s
  /// formula for production kernels (block_activation_bytes_per_rank).
  bool runtime_kernels = false;
  /// With runtime_kernels: flash attention keeps each row's max and sum
  /// instead of the [b, a, s, s] probabilities.
  bool flash_attention = false;
  /// hidden / heads.
  int head_dim() const { return hidden / heads; }
  /// The padded vocabulary for a tensor-parallel size of @p tp.
  std::int64_t padded_vocab(int tp) const;
  /// Parameters of the whole model (vocabulary unpadded).
  std::int64_t parameters() const;
  /// Throws dtp::Error naming the first field below 1 or a width that does not divide.
  void validate() const;
};

/// The model that runs the runtime's GPT of @p config over sequences of
/// @p seq tokens: the same parameters, element for element, and the same
/// activations (runtime_kernels).
ModelShape model_of(const GPTConfig& config, int seq);

/// The named models: gpt2-small, gpt2-medium, gpt2-large, gpt2-xl, llama2-7b,
/// llama3-8b, llama3-70b, llama3-405b, and Megatron-LM's 2021 GPT rows
/// (megatron-1.7b ... megatron-1t, gpt3-175b). Throws dtp::Error listing
/// the names for another.
ModelShape named_model(const std::string& name);
/// The names named_model() knows, in order.
std::vector<std::string> model_names();

// --- the cluster and the layout ----------------------------------------------------

/// A cluster of identical nodes.
struct Cluster {
  std::string gpu = "custom";           ///< what the tables call the GPU
  int gpus_per_node = 8;                ///< G: ranks that share a node's link
  int nodes = 1;                        ///< how many nodes
  double hbm_bytes = 80.0 * (1 << 30);  ///< memory per GPU
  double peak_flops = 312e12;           ///< dense bf16 FLOP/s per GPU
  double efficiency = 0.6;              ///< fraction of peak the model's FLOPs reach
  double node_alpha = 5e-6;             ///< seconds per message inside a node
  double node_beta = 1.0 / 300e9;       ///< seconds per byte inside a node
  double alpha = 10e-6;                 ///< seconds per message between nodes
  double beta = 1.0 / 25e9;             ///< seconds per byte between nodes
  /// gpus_per_node x nodes.
  int gpus() const { return gpus_per_node * nodes; }
  /// The runtime's two-tier model: CostModel{alpha, beta}.with_nodes(G, node_alpha, node_beta).
  CostModel cost_model() const;
};

/// A100 SXM 80 GB (312 TFLOP/s bf16, NVLink 300 GB/s per direction, 200 Gb/s
/// InfiniBand per GPU) or H100 SXM (989 TFLOP/s, 450 GB/s, 400 Gb/s), with
/// @p gpus_per_node x @p nodes GPUs and the GPU's default efficiency
/// (default_efficiency). Throws dtp::Error naming "a100" and "h100" for another.
Cluster named_cluster(const std::string& gpu, int gpus_per_node, int nodes);
/// The fraction of peak a large transformer's FLOPs reach on @p gpu
/// ("a100" 0.60, "h100" 0.50): one number per GPU, used for every row.
double default_efficiency(const std::string& gpu);

/// What a block keeps for its backward.
enum class Recompute {
  none,       ///< everything its layers saved
  selective,  ///< all but the attention scores (recomputed in the backward)
  full,       ///< only its input; the backward runs the forward again
};
/// "none", "selective" or "full".
const char* recompute_name(Recompute recompute);
/// Parses those names; throws dtp::Error listing them otherwise.
Recompute parse_recompute(const std::string& name);

/// How the model is spread over the GPUs and how a step runs.
struct Layout {
  int tp = 1;                      ///< tensor-parallel ranks (innermost)
  int pp = 1;                      ///< pipeline stages
  int dp = 1;                      ///< data-parallel replicas (outermost)
  int microbatch = 1;              ///< sequences per micro-batch
  int global_batch = 1;            ///< sequences per step, all replicas together
  bool sequence_parallel = false;  ///< Megatron sequence parallelism over the TP group
  ch05::ScheduleKind schedule = ch05::ScheduleKind::one_f_one_b;  ///< the pipeline schedule
  int chunks = 1;                         ///< model chunks per rank (interleaved)
  Recompute recompute = Recompute::none;  ///< activation recomputation
  int zero = 0;                           ///< 0, 1 (optimizer state sharded over dp) or 3 (FSDP)
  /// Micro-batches per step and replica: global_batch / (dp x microbatch).
  int microbatches() const { return global_batch / (dp * microbatch); }
  /// "tp 8 pp 16 dp 64, mb 1, 1f1b"...
  std::string text() const;
};

/// Bytes per element and per parameter.
struct Precision {
  int param_bytes = 2;       ///< a parameter as the model computes with it
  int grad_bytes = 2;        ///< a gradient
  int optimizer_bytes = 12;  ///< optimizer state per parameter (fp32 master, m and v: 12)
  int activation_bytes = 2;  ///< an activation or a message element
  /// bf16 parameters and gradients, fp32 master, m and v: the playbook's 16 B per parameter.
  static Precision mixed() { return {}; }
  /// Everything in @p dtype with AdamW's m and v (the runtime's trainer).
  static Precision uniform(DType dtype);
};

/// Everything the planner needs.
struct PlanInput {
  ModelShape model;     ///< the model
  Cluster cluster;      ///< the machines
  Layout layout;        ///< the layout
  Precision precision;  ///< bytes per element
  /// Which units each virtual stage holds (units: 0 the embedding, 1..L the
  /// blocks, L+1 the head); empty: the blocks as even as they go, the
  /// embedding with the first, the head with the last (stage_units()).
  std::vector<ch05::UnitRange> units;
  /// Throws dtp::Error naming what is wrong: an axis below 1, dp x pp x tp
  /// not the cluster's GPUs, a batch that does not divide, tp not dividing
  /// the heads or above the GPUs of a node, fewer blocks than stages, ...
  void validate() const;
};

/// The units of each virtual stage (input.units, or the even split).
std::vector<ch05::UnitRange> stage_units(const PlanInput& input);

// --- what one rank holds ------------------------------------------------------------

/// Elements of one unit's parameters on one TP rank of @p tp, exactly as
/// chapter 04 slices them: unit 0 the embedding (V/t token rows and the
/// positions), 1..L a block (q, k, v and fc by output rows, the two
/// projections by input columns, norms and the projections' biases whole),
/// L+1 the head (its norm and V/t rows of the LM head).
std::int64_t unit_parameters_per_rank(const ModelShape& model, int unit, int tp);

/// Memory of one GPU, in bytes, by category.
struct Memory {
  std::int64_t params = 0;     ///< parameters
  std::int64_t grads = 0;      ///< gradients
  std::int64_t optimizer = 0;  ///< optimizer state (fp32 master, m, v)
  /// Activations at the step's peak; with runtime kernels, the peak of
  /// MemoryCategory::activations and ::recompute together
  /// (runtime_activation_peaks().combined).
  std::int64_t activations = 0;
  /// The four together.
  std::int64_t total() const { return params + grads + optimizer + activations; }
};

/// Activation bytes one block keeps for one micro-batch on one TP rank
/// (Korthikanti et al. 2022, generalized to grouped-query attention and a
/// gated MLP): with N = b s tokens, e bytes and t ranks, 2 N h e for each of
/// the two norm inputs and the q/k/v and MLP inputs (sharded by t under
/// sequence parallelism), q, k, v, the attention output and the MLP's
/// hidden tensors sharded by t, the a s^2 b scores (2 e each, plus a mask
/// and a copy with dropout) unless recomputed; full recomputation keeps the
/// input alone.
std::int64_t block_activation_bytes_per_rank(const PlanInput& input);

/// The peaks of one rank's activations over one step of @p schedule on
/// pipeline stage @p stage, for the runtime's GPT (model.runtime_kernels),
/// as the tracker records them: MemoryCategory::activations, ::recompute
/// and their sum (offloaded stays 0). Walks the rank's actions in order: a
/// micro-batch keeps its virtual stage's tensors from its F to its B; an F
/// briefly holds more (its received input, then each unit's transients);
/// a recomputed block's B makes the block's forward again as recompute.
ActivationPeaks runtime_activation_peaks(const PlanInput& input, int stage,
                                         const ch05::Schedule& schedule);

/// Memory of pipeline stage @p stage (the largest over its TP and DP ranks).
Memory stage_memory(const PlanInput& input, int stage);
/// stage_memory() when @p schedule (layout_schedule(input)) is already made.
Memory stage_memory_under(const PlanInput& input, int stage, const ch05::Schedule& schedule);

// --- what one rank sends -------------------------------------------------------------

/// One library collective: its kind (as CommStats counts it) and bytes.
struct CollectiveCall {
  std::string kind;        ///< "all_reduce", "all_gather" or "reduce_scatter"
  std::int64_t bytes = 0;  ///< the whole buffer, as collective_cost and CommStats take it
  /// Same kind and bytes.
  bool operator==(const CollectiveCall& other) const = default;
};

/// One pass over a unit.
enum class Pass {
  forward,    ///< its forward
  backward,   ///< its backward
  reduction,  ///< after the step's last backward: the replicated gradients' sums
};

/// The collectives a tensor-parallel unit of chapter 04 issues over its TP
/// group in @p pass for a micro-batch of @p tokens tokens (N = b s), with
/// @p element bytes per element. Without sequence parallelism: a block's
/// forward and backward each all-reduce N h twice (after attention and
/// after the MLP); the embedding all-reduces N h forward; the head
/// all-reduces the N row maxima and the 2 N sums forward and N h backward.
/// With it, each N h all-reduce is an all-gather and a reduce-scatter of N h
/// where chapter 04 puts them, and the reduction pass sums each replicated
/// gradient (the norms and the projections' biases) once. The list does not
/// depend on the group's size: each buffer is the whole [N, h] (or [N]) one.
/// With one rank the units make the same calls, which cost nothing on the
/// clock (collective_cost of one rank is 0).
std::vector<CollectiveCall> tensor_parallel_unit_collectives(const ModelShape& model, int unit,
                                                             Pass pass, std::int64_t tokens,
                                                             int element, bool sequence_parallel);

/// The bytes a pipeline stage sends per micro-batch each way: the activation
/// [b, s, h] (this rank's token shard under sequence parallelism).
std::int64_t boundary_bytes(const PlanInput& input);

// --- the clock -----------------------------------------------------------------------

/// Where a pipeline rank's time went in one step, in seconds of the clock.
struct RankClock {
  double compute = 0;  ///< its actions' compute
  double tp = 0;       ///< tensor-parallel collectives
  double pp = 0;       ///< its pipeline sends (alpha + beta bytes each, paid by the sender)
  double dp = 0;       ///< data-parallel: the reductions after the pipeline, FSDP's gathers
  double idle = 0;     ///< waiting for a message: the bubble
  double end = 0;      ///< its clock at the end of the step
};

/// One step on the clock.
struct StepClock {
  std::vector<RankClock> stages;  ///< per pipeline rank
  int slowest = 0;                ///< the rank whose clock ends last
  /// The step's time: stages[slowest].end.
  double makespan() const { return stages.at(static_cast<std::size_t>(slowest)).end; }
};

/// Runs one step of @p schedule (chapter 05's, schedule.stages == pp) on the
/// runtime's clock, as the executed 3D step runs it: a rank's actions in its
/// list's order; an F of virtual stage v starts when the rank is free and
/// the activation from v - 1 has arrived (the sender's clock after it paid
/// the send), a B when the gradient from v + 1 has; each action lasts its
/// compute and the TP collectives its units issue (the TP ranks of a stage
/// run in lockstep); then the reductions: the TP replicated gradients
/// (sequence parallelism), then per unit the DP all-reduce (ZeRO-1: a
/// reduce-scatter and an all-gather; FSDP: gathers and reduce-scatters per
/// micro-batch instead). Compute costs FLOPs / (peak x efficiency), or with
/// @p compute_override the same constant per action kind on every stage
/// (ch05::ActionCosts, as chapter 05's StageModule charges it). Throws
/// dtp::Error naming the rank and action for a schedule that deadlocks.
StepClock simulate_step_clock(const PlanInput& input, const ch05::Schedule& schedule,
                              const ch05::ActionCosts* compute_override = nullptr);

/// The schedule @p input's layout runs (chapter 05's make_schedule).
ch05::Schedule layout_schedule(const PlanInput& input);

// --- the plan ------------------------------------------------------------------------

/// The planner's answer for one layout.
struct Plan {
  Memory memory;                        ///< the fullest stage's memory per GPU
  bool fits = false;                    ///< memory.total() <= cluster.hbm_bytes
  double step_seconds = 0;              ///< the step's clock
  double compute_seconds = 0;           ///< of the slowest rank: compute
  double tp_seconds = 0;                ///< ... tensor-parallel collectives
  double pp_seconds = 0;                ///< ... pipeline sends
  double dp_seconds = 0;                ///< ... the reductions after the pipeline
  double bubble_seconds = 0;            ///< ... idle, waiting for messages
  double model_flops_per_token = 0;     ///< 6 N + 12 L s h (no recomputation)
  double hardware_flops_per_token = 0;  ///< with the recomputed forward
  double tokens_per_second = 0;         ///< global_batch x s / step_seconds
  double mfu = 0;                       ///< model FLOP/s per GPU / peak
  double hfu = 0;                       ///< hardware FLOP/s (recomputation counted) per GPU / peak
};

/// Forward FLOPs per token of blocks and head: 2 per matrix parameter, plus
/// 4 s h per block for the scores and their product with V (the whole
/// s x s rectangle, as Megatron-LM counts it). Training is 3x that.
double forward_flops_per_token(const ModelShape& model);

/// Validates @p input and predicts its step.
Plan make_plan(const PlanInput& input);

/// A layout that `--search` considered, and its plan.
struct Candidate {
  Layout layout;  ///< the layout
  Plan plan;      ///< its plan
};

/// Every layout of @p base's model, cluster and global batch with tp
/// dividing the heads (and the kv heads) and at most a node's GPUs, pp
/// dividing the layers, dp the rest, micro-batches of 1, 2, 4, 8 sequences
/// (and base's schedule, recomputation and ZeRO); the ones that fit, best
/// tokens/s first.
std::vector<Candidate> search_layouts(const PlanInput& base);

// --- validation against published runs ----------------------------------------------

/// One published figure and the planner's prediction of it.
struct ValidationRow {
  std::string source;    ///< where the figure is published
  std::string what;      ///< what is compared ("TFLOP/s per GPU", "GB of state", ...)
  std::string setup;     ///< the run: model, GPUs, layout
  double published = 0;  ///< the published number
  double predicted = 0;  ///< the planner's
  double goal = 0.15;    ///< the largest relative error that meets the goal
  /// (predicted - published) / published.
  double error() const { return (predicted - published) / published; }
  /// |error()| <= goal.
  bool within_goal() const;
};

/// The validation table: Megatron-LM 2021 (Table 1 and the 175B rows),
/// Llama 3 (Table 4), torchtitan's Llama 3.1 8B on 8 H100 and the
/// Ultra-Scale Playbook's memory figures.
std::vector<ValidationRow> validation_rows();

}  // namespace dtp::plan
