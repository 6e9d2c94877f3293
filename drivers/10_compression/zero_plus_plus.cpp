// ZeRO++ training: ZeRO-3's hooks, each collective swapped for puzzle
// 10.5's where its part is on (zero_plus_plus.h has the table).
#include "drivers/10_compression/zero_plus_plus.h"

#include <sstream>
#include <utility>

#include "10_compression/compression.h"
#include "dtp/checkpoint.h"
#include "dtp/error.h"

namespace dtp::ch10 {
namespace {

// One (parameter shard, zeroed gradient shard) pair per unit: chunk
// world.rank() of its full parameters, copied so the full buffer can go.
std::vector<ParamBuffer> shard_buffers(GPT& model, const Comm& world) {
  std::vector<ParamBuffer> buffers;
  for (Unit* unit : model.units()) {
    const ChunkRange mine = chunk_range(unit->numel(), world.size(), world.rank());
    const Tensor& full = unit->params();
    Tensor shard =
        Tensor::empty(Shape{mine.length}, full.dtype(), full.device(), MemoryCategory::params);
    shard.copy_from(full.slice(mine.offset, mine.length));
    Tensor grads =
        Tensor::zeros(shard.shape(), shard.dtype(), shard.device(), MemoryCategory::grads);
    buffers.push_back({unit->name() + " shard", shard, grads});
  }
  return buffers;
}

// Rank 0's concatenation of every rank's @p shard (undefined elsewhere).
Tensor gather_to_rank0(Comm& comm, const Tensor& shard, std::int64_t numel) {
  Tensor full;
  if (comm.rank() == 0)
    full = Tensor::empty(Shape{numel}, shard.dtype(), shard.device(), MemoryCategory::other);
  comm.gather(shard, full, 0);
  return full;
}

}  // namespace

std::string ZeroPlusPlusParts::text() const {
  std::ostringstream out;
  const char* sep = "";
  if (qwz) {
    out << "qwz";
    sep = ",";
  }
  if (hpz_ranks > 0) {
    out << sep << "hpz:" << hpz_ranks;
    sep = ",";
  }
  if (qgz_bits > 0) out << sep << "qgz:" << qgz_bits;
  return out.str().empty() ? "none" : out.str();
}

ZeroPlusPlusParts parse_zeropp(const std::string& text, int hpz_ranks, std::int64_t block) {
  ZeroPlusPlusParts parts;
  parts.block = block;
  if (text == "none") return parts;
  std::istringstream in(text);
  std::string item;
  bool any = false;
  while (std::getline(in, item, ',')) {
    any = true;
    const bool qgz = item == "qgz" || item == "qgz8";
    DTP_CHECK(item == "qwz" || item == "hpz" || qgz,
              "--zeropp: expected 'none' or a comma-separated list of qwz, hpz, qgz (4-bit) and "
              "qgz8, got '",
              item, "' in '", text, "'");
    const bool twice = (item == "qwz" && parts.qwz) || (item == "hpz" && parts.hpz_ranks > 0) ||
                       (qgz && parts.qgz_bits > 0);
    DTP_CHECK(!twice, "--zeropp: '", item, "' given twice (qgz and qgz8 are one part) in '", text,
              "'");
    if (item == "qwz") parts.qwz = true;
    if (item == "hpz") parts.hpz_ranks = hpz_ranks;
    if (qgz) parts.qgz_bits = item == "qgz" ? 4 : 8;
  }
  DTP_CHECK(any, "--zeropp: expected 'none' or a list such as qwz,hpz,qgz, got '", text, "'");
  return parts;
}

void validate_zeropp(const ZeroPlusPlusParts& parts, int world) {
  DTP_CHECK(parts.hpz_ranks == 0 ||
                (parts.hpz_ranks >= 1 && parts.hpz_ranks <= world && world % parts.hpz_ranks == 0),
            "zero++: hpZ's node of --node-ranks ", parts.hpz_ranks,
            " ranks must divide the world of ", world, " ranks into whole nodes");
  DTP_CHECK(parts.qgz_bits == 0 || parts.qgz_bits == 4 || parts.qgz_bits == 8,
            "zero++: qgZ quantizes to 4 or 8 bits, got ", parts.qgz_bits);
  DTP_CHECK(parts.block >= 1, "zero++: --block must be at least 1, got ", parts.block);
}

ZeroPlusPlus::ZeroPlusPlus(Comm& world, GPT& model, const TrainConfig& config,
                           const ZeroPlusPlusParts& parts)
    : Optimizer(shard_buffers(model, world)),
      world_(world),
      model_(model),
      parts_(parts),
      reduced_(model.units().size(), false) {
  validate_zeropp(parts, world.size());
  for (const ParamBuffer& buffer : buffers_) {
    parameter_shards_.push_back(buffer.params);
    gradient_shards_.push_back(buffer.grads);
  }
  secondary_shards_.resize(buffers_.size());
  optimizer_ = make_optimizer(config, buffers_);
  if (parts.hpz_ranks > 0)
    node_ = std::make_unique<Comm>(world.split(world.rank() / parts.hpz_ranks, world.rank()));
  for (Unit* unit : model.units()) unit->set_buffers(Tensor(), Tensor());
  model.on_before_forward([this](Unit& unit) { gather_for_forward(unit); });
  model.on_after_forward([this](Unit& unit) { keep_secondary_and_release(unit); });
  model.on_before_backward([this](Unit& unit) { gather_for_backward(unit); });
  model.on_grad_ready([this](Unit& unit) { reduce_and_release(unit); });
}

ZeroPlusPlus::~ZeroPlusPlus() { model_.clear_hooks(); }

Tensor ZeroPlusPlus::gather_from_world(const Unit& unit) {
  const Tensor& shard = parameter_shards_[static_cast<std::size_t>(unit.index())];
  Tensor full =
      Tensor::empty(Shape{unit.numel()}, shard.dtype(), shard.device(), MemoryCategory::params);
  if (parts_.qwz)
    quantized_all_gather(world_, shard, full, parts_.block);
  else
    world_.all_gather(shard, full);
  return full;
}

void ZeroPlusPlus::gather_for_forward(Unit& unit) {
  unit.set_buffers(gather_from_world(unit), Tensor());
}

// hpZ keeps its node's share of what the forward gathered, so the backward
// gathers the same bits from inside the node.
void ZeroPlusPlus::keep_secondary_and_release(Unit& unit) {
  if (node_)
    secondary_shards_[static_cast<std::size_t>(unit.index())] =
        secondary_shard(*node_, unit.params());
  unit.set_buffers(Tensor(), Tensor());
}

void ZeroPlusPlus::gather_for_backward(Unit& unit) {
  Tensor full;
  Tensor& secondary = secondary_shards_[static_cast<std::size_t>(unit.index())];
  if (node_) {
    DTP_CHECK(secondary.defined(), "zero++: unit '", unit.name(),
              "' reached its backward without a secondary shard: its forward did not run");
    full = Tensor::empty(Shape{unit.numel()}, secondary.dtype(), secondary.device(),
                         MemoryCategory::params);
    secondary_all_gather(*node_, secondary, full);
    secondary = Tensor();
  } else {
    full = gather_from_world(unit);
  }
  Tensor grads = Tensor::zeros(full.shape(), full.dtype(), full.device(), MemoryCategory::grads);
  unit.set_buffers(std::move(full), std::move(grads));
}

void ZeroPlusPlus::reduce_and_release(Unit& unit) {
  Tensor& shard = gradient_shards_[static_cast<std::size_t>(unit.index())];
  if (parts_.qgz_bits > 0)
    quantized_reduce_scatter(world_, unit.grads(), shard, parts_.qgz_bits, parts_.block);
  else
    world_.reduce_scatter(unit.grads(), shard, ReduceOp::avg);
  unit.set_buffers(Tensor(), Tensor());
  reduced_[static_cast<std::size_t>(unit.index())] = true;
}

void ZeroPlusPlus::finish_backward() {
  for (Unit* unit : model_.units())
    DTP_CHECK(reduced_[static_cast<std::size_t>(unit->index())], "zero++: unit '", unit->name(),
              "' was not reduce-scattered since the last step; did backward run?");
  reduced_.assign(reduced_.size(), false);
}

void ZeroPlusPlus::step(double lr) {
  optimizer_->step(lr);
  ++steps_;
}

std::string ZeroPlusPlus::name() const { return optimizer_->name(); }

double ZeroPlusPlus::clip_gradients(double max_norm) {
  return clip_sharded_grad_norm(world_, gradient_shards_, max_norm);
}

const Tensor& ZeroPlusPlus::parameter_shard(int unit) const {
  DTP_CHECK(unit >= 0 && unit < static_cast<int>(parameter_shards_.size()),
            "ZeroPlusPlus::parameter_shard: unit ", unit, " outside [0, ", parameter_shards_.size(),
            ")");
  return parameter_shards_[static_cast<std::size_t>(unit)];
}

const Tensor& ZeroPlusPlus::gradient_shard(int unit) const {
  (void)parameter_shard(unit);  // the range check
  return gradient_shards_[static_cast<std::size_t>(unit)];
}

std::vector<NamedTensor> ZeroPlusPlus::gather_checkpoint() {
  const std::vector<Unit*> units = model_.units();
  std::vector<NamedTensor> tensors;
  for (Unit* unit : units) {
    const Tensor full = gather_to_rank0(
        world_, parameter_shards_[static_cast<std::size_t>(unit->index())], unit->numel());
    if (world_.rank() != 0) continue;
    for (const ParamView& p : unit->parameters())
      tensors.push_back({parameter_entry(unit->name(), p.name),
                         full.slice(p.offset, p.shape.numel()).view(p.shape)});
  }
  for (Unit* unit : units)
    for (const std::string& kind : state_kinds(*optimizer_)) {
      const Tensor full = gather_to_rank0(
          world_, state_tensor(*optimizer_, unit->name() + " shard", kind), unit->numel());
      if (world_.rank() == 0) tensors.push_back({optimizer_entry(unit->name(), kind), full});
    }
  return tensors;
}

}  // namespace dtp::ch10
