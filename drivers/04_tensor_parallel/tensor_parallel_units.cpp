// Provided code, not a puzzle (see drivers/README.md): how a tensor-parallel
// rank gets its slices, and how the slices become whole again (checkpoints).
// Every TP unit is built from the serial GPT's unit of the same name,
// copying out this rank's rows or columns, so the TP model starts from
// exactly the serial model's weights and the checkers can compare the two.
// The forward and backward bodies are the puzzles.
#include <cmath>
#include <string>

#include "04_tensor_parallel/tensor_parallel.h"
#include "dtp/error.h"

namespace dtp::ch04 {

ChunkRange even_split(const std::string& what, std::int64_t size, int parts, int rank) {
  DTP_CHECK(parts >= 1, what, ": the tensor-parallel group needs at least 1 rank, got ", parts);
  DTP_CHECK(rank >= 0 && rank < parts, what, ": rank ", rank, " is outside the group of ", parts);
  DTP_CHECK(size % parts == 0, what, ": ", size, " do not split over ", parts,
            " tensor-parallel ranks (", size, " % ", parts, " = ", size % parts,
            "); tensor parallelism needs equal parts: pick a tensor-parallel size that divides ",
            size);
  const std::int64_t length = size / parts;
  return {rank * length, length};
}

// --- the layers' constructors ------------------------------------------------------

ColumnParallelLinear::ColumnParallelLinear(Comm& tp, std::int64_t in_features,
                                           std::int64_t out_features, bool has_bias,
                                           bool sequence_parallel)
    : tp(&tp),
      sequence_parallel(sequence_parallel),
      local(
          in_features,
          even_split("column-parallel linear: output features", out_features, tp.size(), tp.rank())
              .length,
          has_bias) {}

RowParallelLinear::RowParallelLinear(Comm& tp, std::int64_t in_features, std::int64_t out_features,
                                     bool sequence_parallel)
    : tp(&tp),
      sequence_parallel(sequence_parallel),
      local(even_split("row-parallel linear: input features", in_features, tp.size(), tp.rank())
                .length,
            out_features, false) {}

TensorParallelMlp::TensorParallelMlp(Comm& tp, const GPTConfig& config, bool sequence_parallel)
    : fc(tp, config.d_model, std::int64_t{config.mlp_ratio} * config.d_model, true,
         sequence_parallel),
      proj(tp, std::int64_t{config.mlp_ratio} * config.d_model, config.d_model, sequence_parallel) {
}

VocabParallelEmbedding::VocabParallelEmbedding(Comm& tp, const GPTConfig& config,
                                               bool sequence_parallel)
    : tp(&tp),
      sequence_parallel(sequence_parallel),
      vocab_start(even_split("vocabulary-parallel embedding: vocabulary", config.vocab_size,
                             tp.size(), tp.rank())
                      .offset) {}

VocabParallelCrossEntropy::VocabParallelCrossEntropy(Comm& tp, std::int64_t vocab_size)
    : tp(&tp),
      vocab_start(even_split("vocabulary-parallel cross-entropy: vocabulary", vocab_size, tp.size(),
                             tp.rank())
                      .offset),
      vocab_size(vocab_size) {}

// --- copying a rank's slices out of the serial model --------------------------------

namespace {

enum class Split { whole, rows, columns };

struct SliceSpec {
  std::string name;
  Split split;
};

// Rows [r0, r0 + n) of a [R, K] (or [R]) parameter: contiguous.
// Columns [c0, c0 + n) of a [R, K] parameter: one piece per row.
void copy_slice(const Tensor& full, Tensor shard, Split split, int parts, int rank,
                const std::string& name) {
  if (split == Split::whole) {
    shard.copy_from(full);
    return;
  }
  if (split == Split::rows) {
    const ChunkRange rows = even_split(name + ": rows", full.size(0), parts, rank);
    const std::int64_t per_row = full.numel() / full.size(0);
    shard.flatten().copy_from(full.flatten().slice(rows.offset * per_row, rows.length * per_row));
    return;
  }
  const std::int64_t R = full.size(0), K = full.size(1);
  const ChunkRange columns = even_split(name + ": columns", K, parts, rank);
  Tensor flat_full = full.flatten(), flat_shard = shard.flatten();
  for (std::int64_t i = 0; i < R; ++i)
    flat_shard.slice(i * columns.length, columns.length)
        .copy_from(flat_full.slice(i * K + columns.offset, columns.length));
}

// Which slice of each parameter a TP rank holds: the split of every layer.
Split split_of(const std::string& name) {
  auto ends_with = [&](const std::string& suffix) {
    return name.size() >= suffix.size() &&
           name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  if (name == "tokens" || name == "lm.weight") return Split::rows;  // by vocabulary
  if (ends_with(".q.weight") || ends_with(".q.bias") || ends_with(".k.weight") ||
      ends_with(".k.bias") || ends_with(".v.weight") || ends_with(".v.bias") ||
      ends_with(".fc.weight") || ends_with(".fc.bias"))
    return Split::rows;                                  // column-parallel: output rows
  if (ends_with(".proj.weight")) return Split::columns;  // row-parallel: input columns
  return Split::whole;  // LayerNorms, positions, row-parallel biases: replicated
}

// The layout of a TP unit: the serial unit's names with their shapes cut by
// the split, zero-initialized (the values are copied from the serial unit).
std::vector<ParamSpec> sliced_layout(const Unit& full, int parts) {
  std::vector<ParamSpec> layout;
  for (const ParamView& p : full.parameters()) {
    std::vector<std::int64_t> dims;
    for (int d = 0; d < p.shape.ndim(); ++d) dims.push_back(p.shape[d]);
    const Split split = split_of(p.name);
    if (split == Split::rows)
      dims[0] = even_split(full.name() + " " + p.name, dims[0], parts, 0).length;
    if (split == Split::columns)
      dims[1] = even_split(full.name() + " " + p.name, dims[1], parts, 0).length;
    layout.push_back({p.name, Shape(dims), ParamInit::zeros, 0.0});
  }
  return layout;
}

void copy_slices(const Unit& full, Unit& shard, int parts, int rank) {
  DTP_CHECK(full.has_params(), "tensor parallelism: the serial unit '", full.name(),
            "' has no parameters to copy (released?)");
  const auto& from = full.parameters();
  auto& to = shard.parameters();
  for (std::size_t i = 0; i < from.size(); ++i)
    copy_slice(from[i].value, to[i].value, split_of(from[i].name), parts, rank,
               full.name() + " " + from[i].name);
}

// Every rank's rows, gathered in rank order, are the full rows. Columns come
// back as each rank's [R, K/n] block in turn: row i of the full tensor is row
// i of every block, side by side.
Tensor unslice(Comm& tp, const Tensor& slice, Split split, const Shape& full_shape) {
  if (split == Split::whole) return tp.rank() == 0 ? slice : Tensor();
  Tensor gathered;
  if (tp.rank() == 0)
    gathered = Tensor::empty(Shape{full_shape.numel()}, slice.dtype(), slice.device(),
                             MemoryCategory::other);
  tp.gather(slice.flatten(), gathered, 0);
  if (tp.rank() != 0 || split == Split::rows)
    return tp.rank() == 0 ? gathered.view(full_shape) : Tensor();
  const std::int64_t R = full_shape[0], K = full_shape[1], columns = K / tp.size();
  Tensor full = Tensor::empty(full_shape, slice.dtype(), slice.device(), MemoryCategory::other);
  Tensor flat = full.flatten();
  for (int r = 0; r < tp.size(); ++r)
    for (std::int64_t i = 0; i < R; ++i)
      flat.slice(i * K + r * columns, columns)
          .copy_from(gathered.slice((r * R + i) * columns, columns));
  return full;
}

GPTConfig checked(const GPTConfig& config, const Comm& tp) {
  even_split("attention heads", config.heads, tp.size(), tp.rank());
  even_split("vocabulary", config.vocab_size, tp.size(), tp.rank());
  return config;
}

}  // namespace

bool is_replicated(const std::string& parameter_name) {
  return split_of(parameter_name) == Split::whole;
}

void copy_tensor_parallel_slice(const std::string& name, const Tensor& full, Tensor slice,
                                int parts, int rank) {
  copy_slice(full, std::move(slice), split_of(name), parts, rank, name);
}

Tensor gather_tensor_parallel_slices(Comm& tp, const std::string& name, const Tensor& slice,
                                     const Shape& full_shape) {
  return unslice(tp, slice, split_of(name), full_shape);
}

// --- the units -----------------------------------------------------------------------

TensorParallelEmbedding::TensorParallelEmbedding(Comm& tp, const Embedding& full,
                                                 const TensorParallelOptions& options)
    : Unit(full.name(), full.index(), checked(full.config(), tp), sliced_layout(full, tp.size())),
      layer(tp, config_, options.sequence_parallel),
      tp_(&tp),
      sequence_parallel_(options.sequence_parallel) {
  finish_construction();
  copy_slices(full, *this, tp.size(), tp.rank());
}

void TensorParallelEmbedding::bind() {
  layer.tokens = value("tokens");
  layer.positions = value("positions");
  layer.tokens_grad = grad("tokens");
  layer.positions_grad = grad("positions");
}

TensorParallelBlock::TensorParallelBlock(Comm& tp, const Block& full,
                                         const TensorParallelOptions& options)
    : Unit(full.name(), full.index(), checked(full.config(), tp), sliced_layout(full, tp.size())),
      ln1(config_.d_model, config_.layernorm_eps),
      attn(tp, config_, options.sequence_parallel),
      ln2(config_.d_model, config_.layernorm_eps),
      mlp(tp, config_, options.sequence_parallel),
      sequence_parallel(options.sequence_parallel),
      tp_(&tp) {
  finish_construction();
  copy_slices(full, *this, tp.size(), tp.rank());
}

void TensorParallelBlock::bind() {
  ln1.bind(*this, "ln1");
  attn.q.local.bind(*this, "attn.q");
  attn.k.local.bind(*this, "attn.k");
  attn.v.local.bind(*this, "attn.v");
  attn.proj.local.bind(*this, "attn.proj");
  attn.proj.bias = value("attn.proj.bias");
  attn.proj.bias_grad = grad("attn.proj.bias");
  ln2.bind(*this, "ln2");
  mlp.fc.local.bind(*this, "mlp.fc");
  mlp.proj.local.bind(*this, "mlp.proj");
  mlp.proj.bias = value("mlp.proj.bias");
  mlp.proj.bias_grad = grad("mlp.proj.bias");
}

std::vector<Tensor> TensorParallelBlock::replicated_gradients() const {
  return {ln1.weight_grad, ln1.bias_grad, attn.proj.bias_grad,
          ln2.weight_grad, ln2.bias_grad, mlp.proj.bias_grad};
}

TensorParallelHead::TensorParallelHead(Comm& tp, const Head& full,
                                       const TensorParallelOptions& options)
    : Unit(full.name(), full.index(), checked(full.config(), tp), sliced_layout(full, tp.size())),
      ln(config_.d_model, config_.layernorm_eps),
      lm(tp, config_.d_model, config_.vocab_size, false, options.sequence_parallel),
      loss(tp, config_.vocab_size),
      sequence_parallel(options.sequence_parallel),
      tp_(&tp) {
  finish_construction();
  copy_slices(full, *this, tp.size(), tp.rank());
}

void TensorParallelHead::bind() {
  ln.bind(*this, "ln");
  lm.local.bind(*this, "lm");
}

// --- the model -----------------------------------------------------------------------

TensorParallelGPT::TensorParallelGPT(Comm& tp, const GPT& full,
                                     const TensorParallelOptions& options)
    : tp_(&tp), config_(full.config()), sequence_parallel_(options.sequence_parallel) {
  std::vector<const Unit*> units = full.units();
  embedding = std::make_unique<TensorParallelEmbedding>(
      tp, dynamic_cast<const Embedding&>(*units.front()), options);
  for (std::size_t i = 1; i + 1 < units.size(); ++i)
    blocks.push_back(
        std::make_unique<TensorParallelBlock>(tp, dynamic_cast<const Block&>(*units[i]), options));
  head =
      std::make_unique<TensorParallelHead>(tp, dynamic_cast<const Head&>(*units.back()), options);
  block_saved_.resize(blocks.size());
}

void TensorParallelGPT::zero_grad() {
  for (Unit* unit : units()) unit->zero_grad();
}

std::vector<Unit*> TensorParallelGPT::units() {
  std::vector<Unit*> all{embedding.get()};
  for (auto& block : blocks) all.push_back(block.get());
  all.push_back(head.get());
  return all;
}

double TensorParallelGPT::global_grad_norm() const {
  // Each sharded gradient is summed over the group; a replicated one is the
  // same on every rank, so only TP rank 0 counts it.
  double squares = 0;
  auto add_unit = [&](const Unit& unit) {
    for (const ParamView& p : unit.parameters())
      if (!is_replicated(p.name) || tp_->rank() == 0) squares += ops::sum_squares(p.grad);
  };
  add_unit(*embedding);
  for (const auto& block : blocks) add_unit(*block);
  add_unit(*head);
  return std::sqrt(all_reduce_value(*tp_, squares, ReduceOp::sum));
}

}  // namespace dtp::ch04
