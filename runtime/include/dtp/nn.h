/// @file nn.h
/// @brief A small GPT with explicit forward and backward: the model that
/// chapters 02-08 parallelize.
///
/// The model is a list of **units**: the embedding, one unit per transformer
/// block, and the head (final LayerNorm, LM head, cross-entropy). Each unit
/// keeps its parameters in one flat buffer and its gradients in another; every
/// named parameter is a view into them. So a DDP bucket, a ZeRO shard or an
/// FSDP unit is just a slice or a whole buffer.
///
/// Layers hold no activations. Their forward fills a `...Saved` struct with
/// exactly what the backward needs (charged to MemoryCategory::activations);
/// the caller keeps it and hands it back to backward, which releases it. That
/// way a pipeline schedule can keep several micro-batches in flight, and
/// activation checkpointing can drop and recompute them.
///
/// Conventions: activations are [B, T, C]; parameter gradients accumulate (+=)
/// until zero_grad(); activation gradients are transient and charged to
/// MemoryCategory::other.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dtp/moe_routing.h"
#include "dtp/nn_ops.h"
#include "dtp/tensor.h"

namespace dtp {

/// An uninitialized tensor of @p shape with @p like's dtype and device,
/// charged to MemoryCategory::activations: how a layer's forward makes its
/// output and what it saves.
Tensor new_activation(const Shape& shape, const Tensor& like);
/// The same, charged to MemoryCategory::other: how a backward makes the
/// transient gradient of its input.
Tensor new_gradient(const Shape& shape, const Tensor& like);

/// How attention is computed: the naive form keeps the B*H*T*T probabilities
/// for the backward; the flash form keeps only two numbers per query row.
enum class AttentionKind { naive, flash };
/// "naive" or "flash".
const char* attention_kind_name(AttentionKind kind);
/// Parses "naive" or "flash"; throws dtp::Error naming both otherwise.
AttentionKind parse_attention_kind(const std::string& name);

/// The shape of a GPT and how it is initialized.
struct GPTConfig {
  int vocab_size = 64;          ///< number of token ids
  int context = 64;             ///< longest sequence (number of learned positions)
  int d_model = 64;             ///< width C of the residual stream
  int heads = 4;                ///< attention heads; d_model must divide by it
  int layers = 2;               ///< transformer blocks
  std::uint64_t seed = 1234;    ///< initialization seed: same seed, same weights
  int mlp_ratio = 4;            ///< MLP hidden width = mlp_ratio * d_model
  double init_std = 0.02;       ///< std of weight init (residual projections: / sqrt(2 layers))
  double layernorm_eps = 1e-5;  ///< LayerNorm epsilon
  AttentionKind attention = AttentionKind::naive;  ///< attention kernel
  /// Mixture of experts: 0 (the default) gives every block one dense MLP;
  /// E > 0 replaces it by a router and E expert MLPs of the same width
  /// (MoeMlp; the routing rules are in dtp/moe_routing.h).
  int experts = 0;
  int top_k = 1;                 ///< experts per token, 1 to experts (with experts > 0)
  double capacity_factor = 1.25; ///< expert capacity = ceil(factor * tokens * top_k / experts)
  double aux_loss_coef = 0.01;   ///< weight of each block's load-balancing loss in the total loss
  /// The N tokens of a batch are routed in this many equal consecutive
  /// groups, each with its own capacity and balance loss (the loss is their
  /// mean), as GShard does: expert parallelism on G ranks, where each rank
  /// routes its own tokens, equals one device with moe_groups = G.
  int moe_groups = 1;
  /// Expert parallelism over expert_shards ranks: this model holds only
  /// experts [expert_shard E / expert_shards, (expert_shard + 1) E /
  /// expert_shards) of each block, with memory for their weights and
  /// gradients. The others' parameters are drawn at init and dropped, so
  /// the held experts start as in the whole model. A layer that does not
  /// hold every expert runs only through a MoeCore. 1 (the default): all.
  int expert_shards = 1;
  int expert_shard = 0;  ///< which share of the experts, 0 to expert_shards - 1
  /// Parameters, gradients and activations. bf16 and f16 compute in f32 and
  /// round every stored value (chapter 07 keeps f32 master weights beside them).
  DType dtype = DType::f32;
  Device device = Device::cpu();  ///< where parameters and activations live

  /// Throws dtp::Error naming the first bad field.
  void validate() const;
  /// d_model / heads.
  int head_dim() const { return d_model / heads; }
  /// Parameters in the whole model.
  std::int64_t parameter_count() const;
  /// "vocab 64, context 64, d_model 64, heads 4, layers 2, f32 on cpu, naive attention".
  std::string describe() const;
};

// --- units -------------------------------------------------------------------------

/// How a parameter starts.
enum class ParamInit { zeros, ones, normal };

/// One entry of a unit's flat layout.
struct ParamSpec {
  std::string name;                   ///< e.g. "attn.q.weight"
  Shape shape;                        ///< its shape
  ParamInit init = ParamInit::zeros;  ///< how it starts
  double std = 0;                     ///< for ParamInit::normal
  /// false: drawn at init (so that the parameters after it start as in the
  /// whole unit) but given no memory and no view; an expert another rank holds.
  bool held = true;
};

/// One named parameter: where it sits in the unit's flat buffers, and views of them.
struct ParamView {
  std::string name;         ///< e.g. "attn.q.weight"
  Shape shape;              ///< its shape
  std::int64_t offset = 0;  ///< elements from the start of the flat buffers
  Tensor value;             ///< view of Unit::params() (undefined when params are)
  Tensor grad;              ///< view of Unit::grads() (undefined when grads are)
};

/// A group of parameters with one flat parameter buffer and one flat gradient
/// buffer (the granularity of DDP hooks and FSDP units).
class Unit {
 public:
  virtual ~Unit() = default;
  Unit(const Unit&) = delete;
  Unit& operator=(const Unit&) = delete;

  /// "embedding", "block.0", ..., "head".
  const std::string& name() const { return name_; }
  /// Position in the model: 0 embedding, 1..layers the blocks, layers + 1 the head.
  int index() const { return index_; }
  /// The config of the model the unit belongs to.
  const GPTConfig& config() const { return config_; }
  /// The flat parameter buffer (1-D, MemoryCategory::params); undefined
  /// while released (see set_buffers()).
  Tensor& params() { return params_; }
  /// The flat parameter buffer.
  const Tensor& params() const { return params_; }
  /// The flat gradient buffer (1-D, MemoryCategory::grads), laid out like params().
  Tensor& grads() { return grads_; }
  /// The flat gradient buffer.
  const Tensor& grads() const { return grads_; }
  /// Parameters in this unit (elements of each flat buffer).
  std::int64_t numel() const { return numel_; }
  /// Every parameter in layout order.
  const std::vector<ParamView>& parameters() const { return views_; }
  /// Every parameter in layout order, writable, so that
  /// `for (ParamView& p : unit->parameters()) comm.all_reduce(p.grad, ...)`
  /// compiles (collectives take a Tensor&). Write into the views' values;
  /// never reassign a view (it would stop aliasing the flat buffers).
  std::vector<ParamView>& parameters() { return views_; }
  /// The parameter called @p name; throws listing the names this unit has.
  const ParamView& parameter(const std::string& name) const;
  /// Sets the gradient buffer to zero (nothing while it is released).
  void zero_grad();
  /// Re-initializes every parameter from the model seed (the same values as at
  /// construction, independent of other units). Throws while the parameters
  /// are released.
  void reset_parameters();
  /// Replaces the flat buffers (same numel and dtype) and re-points every
  /// view and layer at them. Either may be an undefined tensor: the buffer is
  /// then released, and the unit keeps no reference to the old storage (its
  /// views and layers become undefined too), so the memory is freed as soon
  /// as the caller drops its own handles. FSDP gathers full parameters into a
  /// fresh buffer and installs it here before a unit's forward or backward,
  /// and releases it afterwards. Saved activations never refer to
  /// parameters, so releasing between forward and backward is fine.
  void set_buffers(Tensor params, Tensor grads);
  /// False while the parameters are released: forward and backward then
  /// throw dtp::Error.
  bool has_params() const { return params_.defined(); }
  /// False while the gradients are released: backward then throws (unless
  /// the unit is frozen), and zero_grad() skips the unit.
  bool has_grads() const { return grads_.defined(); }
  /// Stops computing this unit's parameter gradients for good and releases
  /// its gradient buffer: its backward still passes gradients on to earlier
  /// units (and to any LinearAdapter attached to its layers), but never
  /// computes its own. LoRA (chapter 08) freezes the whole base model, so
  /// the base takes no gradient and no optimizer memory.
  void freeze();
  /// True after freeze().
  bool frozen() const { return frozen_; }

 protected:
  /// Allocates zeroed flat buffers for @p layout; the derived constructor
  /// then calls finish_construction().
  Unit(std::string name, int index, const GPTConfig& config, std::vector<ParamSpec> layout);
  /// Derived units point their layers at the current views.
  virtual void bind() = 0;
  /// The value view of parameter @p name.
  Tensor value(const std::string& name) const { return parameter(name).value; }
  /// The gradient view of parameter @p name.
  Tensor grad(const std::string& name) const { return parameter(name).grad; }
  /// Finishes construction: initializes parameters and binds. Derived
  /// constructors call it last.
  void finish_construction();
  /// Throws dtp::Error when the parameters are released; @p pass is
  /// "forward" or "backward", for the message.
  void require_params(const char* pass) const;

  GPTConfig config_;  ///< the model's config

 private:
  void make_views();
  std::string name_;
  int index_;
  std::vector<ParamSpec> layout_;
  std::int64_t numel_ = 0;
  bool frozen_ = false;
  Tensor params_;
  Tensor grads_;
  std::vector<ParamView> views_;
};

// --- layers ------------------------------------------------------------------------
// A layer holds views of its parameters (bound by its unit) and nothing else.

/// Deferred weight-gradient work (zero-bubble pipelines run input gradients
/// first and weight gradients later). Holds the tensors the work needs and
/// refers to the layers that queued it, so those must outlive it.
class PendingWeightGrads {
 public:
  /// Queues @p work.
  void add(std::function<void()> work) { work_.push_back(std::move(work)); }
  /// Runs and forgets all pending work, in the order it was added.
  void run();
  /// True when nothing is queued.
  bool empty() const { return work_.empty(); }
  /// Drops queued work without running it.
  void clear() { work_.clear(); }

 private:
  std::vector<std::function<void()>> work_;
};

/// What a Linear keeps for its backward.
struct LinearSaved {
  Tensor input;    ///< x, shared with whoever produced it (no copy)
  Tensor adapter;  ///< what the layer's LinearAdapter kept (undefined without one)
};

/// A trainable term added to a Linear's output, y = x W^T + b + adapter(x):
/// LoRA's low-rank update (chapter 08). Attached with Linear::adapter (not
/// owned); it holds its own parameters and gradients, so it trains even
/// when the Linear's unit is frozen.
class LinearAdapter {
 public:
  virtual ~LinearAdapter() = default;
  /// Adds the adapter's term for x [..., in] to y [..., out]; returns what
  /// its backward needs (the Linear keeps it in LinearSaved::adapter).
  virtual Tensor forward(const Tensor& x, Tensor& y) const = 0;
  /// Adds the adapter's part of dx for dy into dx [..., in].
  virtual void backward_input(const Tensor& dy, Tensor& dx) const = 0;
  /// Accumulates the adapter's own gradients for dy, the layer's input x
  /// and what forward returned.
  virtual void backward_weight(const Tensor& dy, const Tensor& x, const Tensor& kept) const = 0;
};

/// y = x W^T + b with W [out, in]. The backward is split: backward_input gives
/// dx = dy W, backward_weight accumulates dW += dy^T x and db += sum(dy).
class Linear {
 public:
  Linear() = default;
  /// W [out_features, in_features], with a bias [out_features] when @p has_bias.
  Linear(std::int64_t in_features, std::int64_t out_features, bool has_bias);
  /// Appends "<prefix>.weight" (and "<prefix>.bias") to a unit layout.
  void declare(std::vector<ParamSpec>& layout, const std::string& prefix, double weight_std) const;
  /// Points weight/bias and their gradients at the unit's views.
  void bind(const Unit& unit, const std::string& prefix);
  /// y [..., out] (MemoryCategory::activations); saves x.
  Tensor forward(const Tensor& x, LinearSaved& saved) const;
  /// dx [..., in] = dy W (MemoryCategory::other).
  Tensor backward_input(const Tensor& dy) const;
  /// dx = dy W, or dx += dy W with @p accumulate.
  void backward_input_into(const Tensor& dy, Tensor& dx, bool accumulate) const;
  /// dW += dy^T x, db += sum over rows of dy.
  void backward_weight(const Tensor& dy, const LinearSaved& saved) const;
  /// Both halves; with @p defer the weight half is queued instead and keeps dy
  /// and x alive until it runs. Releases saved.
  Tensor backward(const Tensor& dy, LinearSaved& saved, PendingWeightGrads* defer = nullptr) const;

  std::int64_t in_features = 0;   ///< columns of W
  std::int64_t out_features = 0;  ///< rows of W
  bool has_bias = true;           ///< false: no bias parameter
  bool frozen = false;            ///< no dW, db (its unit is frozen); the adapter still trains
  /// Adds its term to the output and trains beside W when set (not owned).
  const LinearAdapter* adapter = nullptr;
  Tensor weight;                  ///< W [out, in], a view of the unit's params
  Tensor bias;                    ///< b [out] (undefined without bias)
  Tensor weight_grad;             ///< dW, a view of the unit's grads
  Tensor bias_grad;               ///< db
};

/// What a LayerNorm keeps for its backward.
struct LayerNormSaved {
  Tensor input;  ///< x (shared, no copy)
  Tensor mean;   ///< one per row
  Tensor rstd;   ///< 1 / sqrt(var + eps), one per row
};

/// LayerNorm over the last dim with learned weight (init 1) and bias (init 0).
class LayerNorm {
 public:
  LayerNorm() = default;
  /// Normalizes over @p features (the last dim).
  LayerNorm(std::int64_t features, double eps) : features(features), eps(eps) {}
  /// Appends "<prefix>.weight" and "<prefix>.bias" to a unit layout.
  void declare(std::vector<ParamSpec>& layout, const std::string& prefix) const;
  /// Points the parameters and their gradients at the unit's views.
  void bind(const Unit& unit, const std::string& prefix);
  /// y (activations); saves x, mean and rstd (activations).
  Tensor forward(const Tensor& x, LayerNormSaved& saved) const;
  /// dx (other); accumulates dweight, dbias; releases saved.
  Tensor backward(const Tensor& dy, LayerNormSaved& saved) const;

  std::int64_t features = 0;  ///< size of the normalized (last) dim
  double eps = 1e-5;          ///< added to the variance
  bool frozen = false;        ///< no weight or bias gradients (its unit is frozen)
  Tensor weight;              ///< gain [features], starts at 1
  Tensor bias;                ///< shift [features], starts at 0
  Tensor weight_grad;         ///< gradient of weight
  Tensor bias_grad;           ///< gradient of bias
};

/// What a GELU keeps for its backward.
struct GeluSaved {
  Tensor input;  ///< x (shared, no copy)
};

/// GELU, tanh approximation.
class Gelu {
 public:
  /// y = gelu(x) (activations); saves x.
  Tensor forward(const Tensor& x, GeluSaved& saved) const;
  /// dx = dy * gelu'(x) (other); releases saved.
  Tensor backward(const Tensor& dy, GeluSaved& saved) const;
};

/// What attention keeps for its backward.
struct AttentionSaved {
  LinearSaved q_in;     ///< input of the q projection (the LayerNorm output)
  LinearSaved k_in;     ///< the same tensor, for k
  LinearSaved v_in;     ///< the same tensor, for v
  LinearSaved proj_in;  ///< input of the output projection: the attention output
  Tensor q;             ///< [B, T, C] query projection
  Tensor k;             ///< [B, T, C] key projection
  Tensor v;             ///< [B, T, C] value projection
  Tensor probs;         ///< naive attention: [B, H, T, T]
  Tensor row_max;       ///< flash attention: [B, H, T]
  Tensor row_sum;       ///< flash attention: [B, H, T]
};

/// The part of attention that mixes positions: for q, k, v viewed as [B, T,
/// H, D], out = softmax(q k^T / sqrt(D), causal) v. CausalSelfAttention
/// computes it itself (naive or flash) unless it is given a core: sequence
/// parallelism installs one that computes it across the ranks holding the
/// other positions. A core keeps what its backward needs between the two
/// calls, so every block needs its own.
class AttentionCore {
 public:
  virtual ~AttentionCore() = default;
  /// out [B, T, H, D] for this rank's q, k, v [B, T, H, D].
  virtual Tensor forward(const Tensor& q, const Tensor& k, const Tensor& v) = 0;
  /// Sets dq, dk, dv [B, T, H, D] from dout (writing into the tensors given,
  /// or replacing them).
  virtual void backward(const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv) = 0;
};

/// Causal multi-head self-attention with separate q, k, v projections (so
/// tensor parallelism splits heads by slicing rows of each) and an output
/// projection.
class CausalSelfAttention {
 public:
  CausalSelfAttention() = default;
  /// Sized by config.d_model and config.heads; config.attention picks the kernel.
  explicit CausalSelfAttention(const GPTConfig& config);
  /// Appends "<prefix>.{q,k,v,proj}.{weight,bias}" to a unit layout.
  void declare(std::vector<ParamSpec>& layout, const std::string& prefix) const;
  /// Points the four projections at the unit's views.
  void bind(const Unit& unit, const std::string& prefix);
  /// y [B, T, C] for x [B, T, C] (activations); fills saved.
  Tensor forward(const Tensor& x, AttentionSaved& saved) const;
  /// dx for dy; accumulates (or, with @p defer, queues) the projections'
  /// weight gradients; releases saved.
  Tensor backward(const Tensor& dy, AttentionSaved& saved,
                  PendingWeightGrads* defer = nullptr) const;

  Linear q;                                   ///< query projection [C, C]
  Linear k;                                   ///< key projection [C, C]
  Linear v;                                   ///< value projection [C, C]
  Linear proj;                                ///< output projection [C, C]
  int heads = 1;                              ///< heads; head dim = C / heads
  AttentionKind kind = AttentionKind::naive;  ///< naive or flash
  double init_std = 0.02;                     ///< init std of q, k, v
  double proj_std = 0.02;                     ///< init std of proj (scaled for depth)
  /// Computes the attention itself when set (not owned; see AttentionCore).
  AttentionCore* core = nullptr;
};

/// What an MLP keeps for its backward.
struct MlpSaved {
  LinearSaved fc;    ///< input of fc (the LayerNorm output)
  LinearSaved proj;  ///< input of proj (the GELU output)
  GeluSaved gelu;    ///< input of the GELU (the fc output)
};

/// fc (C -> ratio C), GELU, proj (ratio C -> C).
class Mlp {
 public:
  Mlp() = default;
  /// Sized by config.d_model and config.mlp_ratio.
  explicit Mlp(const GPTConfig& config);
  /// Appends "<prefix>.{fc,proj}.{weight,bias}" to a unit layout.
  void declare(std::vector<ParamSpec>& layout, const std::string& prefix) const;
  /// Points fc and proj at the unit's views.
  void bind(const Unit& unit, const std::string& prefix);
  /// y [.., C] (activations); fills saved.
  Tensor forward(const Tensor& x, MlpSaved& saved) const;
  /// dx for dy; weight gradients accumulated or (with @p defer) queued; releases saved.
  Tensor backward(const Tensor& dy, MlpSaved& saved, PendingWeightGrads* defer = nullptr) const;

  Linear fc;               ///< C -> ratio * C
  Linear proj;             ///< ratio * C -> C
  Gelu gelu;               ///< between them
  double init_std = 0.02;  ///< init std of fc
  double proj_std = 0.02;  ///< init std of proj (scaled for depth)
};

/// What a mixture-of-experts MLP keeps for its backward.
struct MoeSaved {
  LinearSaved router;             ///< the router's input: the LayerNorm output as [N, C]
  Tensor probs;                   ///< router softmax [N, E]
  MoeRouting routing;             ///< the batch's routing, decided on the host (groups merged)
  /// balance_gradient[g * E + e]: d balance loss / d probs[n][e] for a token n of group g.
  std::vector<double> balance_gradient;
  std::vector<Tensor> rows;       ///< per expert: i32 [n_e] token rows it took (on the device)
  std::vector<Tensor> weights;    ///< per expert: [n_e] combine weights of those rows
  std::vector<Tensor> outputs;    ///< per expert: its output [n_e, C] before the weighting
  std::vector<MlpSaved> experts;  ///< per expert: the MLP's own
  double aux_loss = 0;            ///< aux_loss_coef * the routing's balance loss
};

/// Mixture of experts in place of the MLP: a router (Linear C -> E, no bias)
/// and softmax give each token a distribution over E expert MLPs; the token
/// goes to its top-k experts (capacity permitting) and the output is the sum
/// of their outputs weighted by the router probabilities. The routing rules
/// and the load-balancing loss are in dtp/moe_routing.h. Each expert runs on
/// exactly the rows routed to it: gathered with ops::embedding_forward
/// (the token rows are the "ids"), scaled with ops::scale_rows, added back
/// with ops::embedding_backward.
class MoeMlp {
 public:
  MoeMlp() = default;
  /// Sized by config.d_model, mlp_ratio, experts, top_k, capacity_factor, aux_loss_coef.
  explicit MoeMlp(const GPTConfig& config);
  /// Appends "<prefix>.router.weight" and "<prefix>.expert.<e>.{fc,proj}.{weight,bias}"
  /// (the experts it does not hold with ParamSpec::held false).
  void declare(std::vector<ParamSpec>& layout, const std::string& prefix) const;
  /// Points the router and the experts at the unit's views.
  void bind(const Unit& unit, const std::string& prefix);
  /// y [..., C] (activations) for x [..., C]; fills saved, including the
  /// auxiliary loss of this batch (saved.aux_loss).
  Tensor forward(const Tensor& x, MoeSaved& saved) const;
  /// dx for dy, for the total loss "loss_scale * (main loss + aux loss)":
  /// the combine weights pass dy's gradient to the router, and the
  /// load-balancing term adds loss_scale * coef * E f_e / N to every
  /// d probs[n][e]. Weight gradients accumulate or (with @p defer) queue;
  /// releases saved.
  Tensor backward(const Tensor& dy, MoeSaved& saved, double loss_scale = 1.0,
                  PendingWeightGrads* defer = nullptr) const;

  Linear router;               ///< C -> E, no bias
  double router_std = 0.02;    ///< init std of the router (config.init_std)
  std::vector<Mlp> experts;    ///< E MLPs shaped like the dense one
  int top_k = 1;               ///< choices per token
  double capacity_factor = 1;  ///< see moe_capacity()
  double aux_loss_coef = 0;    ///< weight of the load-balancing loss
  int groups = 1;              ///< routing groups (GPTConfig::moe_groups)
  int first_held = 0;          ///< the first expert this layer holds (GPTConfig::expert_shard)
  int held = 0;                ///< how many it holds, from first_held; the others' Mlp are unbound
  /// Whether this layer holds expert @p e's weights.
  bool holds(int e) const { return e >= first_held && e < first_held + held; }

 private:
  void require_every_expert(const char* pass) const;
};

/// A mixture-of-experts layer computed elsewhere: expert parallelism
/// installs one in a Block to run the experts on the ranks that hold them.
/// It uses the block's MoeMlp weights and keeps what its backward needs
/// between the two calls, so every block needs its own.
class MoeCore {
 public:
  virtual ~MoeCore() = default;
  /// y [N, C] for this rank's tokens x [N, C].
  virtual Tensor forward(const Tensor& x) = 0;
  /// dx [N, C] for dy [N, C], for the loss "loss_scale * (main loss + aux_loss())";
  /// accumulates the weight gradients of the experts it runs and the router.
  virtual Tensor backward(const Tensor& dy, double loss_scale) = 0;
  /// aux_loss_coef times the last forward's load-balancing loss.
  virtual double aux_loss() const = 0;
};

/// What the loss keeps for its backward.
struct CrossEntropySaved {
  Tensor logits;   ///< [B, T, V], turned into its gradient in place by backward
  Tensor targets;  ///< i32 [B, T]
};

/// Mean softmax cross-entropy over all B*T positions (fused with the softmax).
class CrossEntropy {
 public:
  /// The mean loss (computed in double); saves logits and targets.
  double forward(const Tensor& logits, const Tensor& targets, CrossEntropySaved& saved) const;
  /// d(loss_scale * mean loss)/d logits, written over the saved logits and returned.
  Tensor backward(CrossEntropySaved& saved, double loss_scale = 1.0) const;
};

// --- the units of a GPT -----------------------------------------------------------------

/// Positions [start, start + length) of a sequence: a sequence-parallel
/// rank holds one such range, or two (the zigzag layout).
struct PositionRange {
  std::int64_t start = 0;   ///< first global position
  std::int64_t length = 0;  ///< number of positions
  /// One past the last position.
  std::int64_t end() const { return start + length; }
};

/// What the embedding keeps for its backward.
struct EmbeddingSaved {
  Tensor ids;                         ///< i32 [B, T]
  std::vector<PositionRange> ranges;  ///< the positions of the T tokens, in order
};

/// Token embedding [vocab, C] plus learned positions [context, C].
class Embedding : public Unit {
 public:
  /// Unit "embedding" (index 0), initialized from config.seed.
  explicit Embedding(const GPTConfig& config);
  /// x [B, T, C] (activations) for ids i32 [B, T]; positions start at
  /// @p start_position (sequence parallelism runs a later slice of a sequence).
  Tensor forward(const Tensor& ids, EmbeddingSaved& saved, std::int64_t start_position = 0) const;
  /// The same for tokens at the positions @p ranges, in order (their lengths
  /// sum to T): a zigzag rank's two chunks.
  Tensor forward(const Tensor& ids, EmbeddingSaved& saved, const std::vector<PositionRange>& ranges) const;
  /// Accumulates the table gradients; releases saved.
  void backward(const Tensor& dx, EmbeddingSaved& saved);

  Tensor tokens;          ///< token table [vocab, C]
  Tensor positions;       ///< position table [context, C]
  Tensor tokens_grad;     ///< gradient of tokens
  Tensor positions_grad;  ///< gradient of positions

 private:
  void bind() override;
};

/// What one block keeps between its forward and backward.
struct BlockSaved {
  LayerNormSaved ln1;   ///< input: the block input
  LayerNormSaved ln2;   ///< input: x + attention
  AttentionSaved attn;  ///< attention's own
  MlpSaved mlp;         ///< the MLP's own (a dense block)
  MoeSaved moe;         ///< the mixture of experts' own (config.experts > 0)
  /// Weight-gradient work queued by a deferred backward.
  PendingWeightGrads pending;
  /// Drops every saved tensor (and pending work).
  void clear() { *this = BlockSaved{}; }
};

/// Whether a block's backward computes weight gradients at once or queues them.
enum class WeightGrads { immediate, deferred };

/// Pre-LN transformer block: x + attn(ln1(x)), then + mlp(ln2(.)).
class Block : public Unit {
 public:
  /// Unit "block.<layer>" (index layer + 1), initialized from config.seed.
  Block(const GPTConfig& config, int layer);
  /// Which block this is, from 0.
  int layer() const { return layer_; }
  /// Block output [B, T, C] for x [B, T, C] (activations); fills saved.
  /// A mixture-of-experts block also leaves its load-balancing loss in
  /// saved.moe.aux_loss, which the model adds to its loss.
  Tensor forward(const Tensor& x, BlockSaved& saved) const;
  /// dx for dy = d(block output). With WeightGrads::deferred the linear
  /// layers' weight gradients are queued in saved.pending (LayerNorm's are
  /// computed at once); call backward_weight(saved) to finish the unit.
  /// @p loss_scale scales the load-balancing loss's gradient the way dy is
  /// scaled (GPT::backward passes its own); a dense block ignores it.
  /// Releases the saved activations.
  Tensor backward(const Tensor& dy, BlockSaved& saved,
                  WeightGrads mode = WeightGrads::immediate, double loss_scale = 1.0) const;
  /// True when the MLP half is a mixture of experts (config.experts > 0).
  bool is_moe() const { return config_.experts > 0; }
  /// Runs queued weight-gradient work.
  void backward_weight(BlockSaved& saved) const;

  LayerNorm ln1;             ///< before attention
  LayerNorm ln2;             ///< before the MLP
  CausalSelfAttention attn;  ///< the attention half
  Mlp mlp;                   ///< the MLP half of a dense block
  MoeMlp moe;                ///< the MLP half of a mixture-of-experts block
  /// Runs the mixture of experts (with moe's weights) when set (not owned;
  /// see MoeCore). Only WeightGrads::immediate backward then.
  MoeCore* moe_core = nullptr;

 private:
  void bind() override;
  int layer_;
};

/// What the head keeps for its backward.
struct HeadSaved {
  LayerNormSaved ln;       ///< final LayerNorm
  LinearSaved lm;          ///< LM head input (the LayerNorm output)
  CrossEntropySaved loss;  ///< logits and targets
};

/// Final LayerNorm, LM head (vocab x C, no bias, not tied to the embedding)
/// and cross-entropy.
class Head : public Unit {
 public:
  /// Unit "head" (index layers + 1), initialized from config.seed.
  explicit Head(const GPTConfig& config);
  /// Mean loss over all positions of x [B, T, C] against targets i32 [B, T].
  double forward(const Tensor& x, const Tensor& targets, HeadSaved& saved) const;
  /// d(loss_scale * mean loss)/dx; accumulates the head's gradients; releases saved.
  Tensor backward(HeadSaved& saved, double loss_scale = 1.0) const;
  /// Logits [B, T, vocab] without saving anything (MemoryCategory::other).
  Tensor logits(const Tensor& x) const;

  LayerNorm ln;       ///< final LayerNorm
  Linear lm;          ///< LM head [vocab, C], no bias
  CrossEntropy loss;  ///< the loss

 private:
  void bind() override;
};

// --- the model ----------------------------------------------------------------------

/// The whole GPT: embedding, blocks, head. forward() saves what backward()
/// needs; backward() accumulates gradients unit by unit in reverse and calls
/// every grad-ready hook as soon as a unit's gradients are final.
///
/// Unit hooks let a strategy act around each unit without owning the loop
/// (FSDP gathers a unit's parameters before it runs and frees them after;
/// DDP reduces gradients as they become ready). For a model with blocks
/// 0..L-1, forward() and logits() call, for each unit in forward order
/// (embedding, block.0, ..., block.L-1, head):
///
///     before-forward hooks(unit), the unit's forward, after-forward hooks(unit)
///
/// and backward() calls, for each unit in reverse order (head, block.L-1,
/// ..., block.0, embedding):
///
///     before-backward hooks(unit), the unit's backward, grad-ready hooks(unit)
///
/// Hooks of one kind run in the order they were added, outside the unit's
/// trace span (so communication they start is not counted as the unit's
/// compute). A hook may replace the unit's buffers (Unit::set_buffers).
class GPT {
 public:
  /// Builds the units; each is initialized from (config.seed, unit index).
  explicit GPT(const GPTConfig& config);
  /// The config the model was built with.
  const GPTConfig& config() const { return config_; }

  /// Mean cross-entropy of predicting targets i32 [B, T] from tokens i32
  /// [B, T] (T <= context), plus, for a mixture-of-experts model, every
  /// block's load-balancing loss (aux_loss() alone). Saves activations for
  /// backward().
  double forward(const Tensor& tokens, const Tensor& targets);
  /// The same for a sequence-parallel rank: tokens and targets [B, T_local]
  /// sit at the global positions @p positions (in order; their lengths sum to
  /// T_local, each ends at most at context). The loss is the mean over these
  /// positions; attention reaches the other positions through each block's
  /// AttentionCore.
  double forward(const Tensor& tokens, const Tensor& targets, const std::vector<PositionRange>& positions);
  /// Accumulates d(loss_scale * loss)/d(parameters) into the grads, unit by
  /// unit from the head to the embedding; after each unit, calls the
  /// grad-ready hooks with it. Releases the saved activations as it goes.
  /// For gradient accumulation over k micro-batches pass loss_scale = 1/k.
  void backward(double loss_scale = 1.0);
  /// Logits [B, T, vocab] (MemoryCategory::other), no activations kept.
  /// Calls the before- and after-forward hooks like forward(), which may
  /// change the units' buffers even though the model is const here.
  Tensor logits(const Tensor& tokens) const;
  /// The load-balancing part of the last forward()'s loss (0 for a dense model).
  double aux_loss() const { return aux_loss_; }
  /// True between forward() and backward().
  bool has_saved_activations() const { return has_saved_; }
  /// Drops saved activations without a backward (e.g. after an eval forward).
  void release_activations();

  /// Zeroes every unit's gradient buffer.
  void zero_grad();
  /// A hook called with one unit (see the class comment for when).
  using UnitHook = std::function<void(Unit&)>;
  /// The same as UnitHook, under the name chapter 02 uses.
  using GradReadyHook = UnitHook;
  /// Adds a hook called before each unit's forward, in forward order
  /// (embedding, block.0, ..., head), by forward() and logits().
  void on_before_forward(UnitHook hook) { before_forward_hooks_.push_back(std::move(hook)); }
  /// Adds a hook called after each unit's forward, in forward order, by
  /// forward() and logits().
  void on_after_forward(UnitHook hook) { after_forward_hooks_.push_back(std::move(hook)); }
  /// Adds a hook called before each unit's backward, in reverse order (head,
  /// block.L-1, ..., block.0, embedding).
  void on_before_backward(UnitHook hook) { before_backward_hooks_.push_back(std::move(hook)); }
  /// Adds a hook called after each unit's backward, once its gradients are
  /// complete, in reverse order: head, block.L-1, ..., block.0, embedding.
  /// DDP all-reduces there; FSDP reduce-scatters and frees the parameters.
  void on_grad_ready(GradReadyHook hook) { grad_ready_hooks_.push_back(std::move(hook)); }
  /// Removes every grad-ready hook (the other kinds stay).
  void clear_grad_ready_hooks() { grad_ready_hooks_.clear(); }
  /// Removes every hook of every kind, grad-ready included.
  void clear_hooks();

  /// All units in forward order: embedding, blocks, head.
  std::vector<Unit*> units();
  /// All units in forward order.
  std::vector<const Unit*> units() const;
  /// The embedding unit.
  Embedding& embedding() { return *embedding_; }
  /// Block @p layer (from 0); throws for a block the model does not have.
  Block& block(int layer);
  /// The head unit.
  Head& head() { return *head_; }
  /// Number of transformer blocks.
  int num_blocks() const { return static_cast<int>(blocks_.size()); }
  /// Parameters in all units.
  std::int64_t parameter_count() const;

 private:
  void check_tokens(const Tensor& tokens, const char* what) const;
  /// Calls each of @p hooks with @p unit, in order.
  static void run_hooks(const std::vector<UnitHook>& hooks, Unit& unit);
  GPTConfig config_;
  std::unique_ptr<Embedding> embedding_;
  std::vector<std::unique_ptr<Block>> blocks_;
  std::unique_ptr<Head> head_;
  std::vector<UnitHook> before_forward_hooks_;
  std::vector<UnitHook> after_forward_hooks_;
  std::vector<UnitHook> before_backward_hooks_;
  std::vector<UnitHook> grad_ready_hooks_;
  EmbeddingSaved embedding_saved_;
  std::vector<BlockSaved> block_saved_;
  HeadSaved head_saved_;
  bool has_saved_ = false;
  double aux_loss_ = 0;
};

}  // namespace dtp
