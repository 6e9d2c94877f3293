// Puzzle 8.3: adapters on a GPT. The base is frozen (no gradient buffers,
// no optimizer state); each block's adapters live in one flat parameter
// buffer and one flat gradient buffer, so an optimizer or an all-reduce
// handles a block's adapters as one tensor.
#include <cmath>

#include "08_lora/lora.h"

namespace dtp::ch08 {

LoraModel::LoraModel(GPT& model, const LoraConfig& config) : model_(model), config_(config) {
  DTP_CHECK(config.rank >= 1, "LoRA: the rank must be at least 1, got ", config.rank);
  DTP_CHECK(std::isfinite(config.alpha) && config.alpha > 0, "LoRA: alpha must be positive, got ",
            config.alpha);
  DTP_CHECK(!config.targets.empty(), "LoRA: no targets");
  for (int i = 0; i < model.num_blocks(); ++i)
    for (const std::string& name : config.targets)
      target_linear(model.block(i), name);  // throws for a bad one

  for (Unit* unit : model.units()) unit->freeze();
  const GPTConfig& shape = model.config();
  const std::int64_t r = config.rank;
  for (int i = 0; i < model.num_blocks(); ++i) {
    Block& block = model.block(i);
    std::int64_t numel = 0;
    for (const std::string& name : config.targets) {
      const Linear& linear = target_linear(block, name);
      numel += r * (linear.in_features + linear.out_features);
    }
    params_.push_back(Tensor::zeros({numel}, shape.dtype, shape.device, MemoryCategory::params));
    grads_.push_back(Tensor::zeros({numel}, shape.dtype, shape.device, MemoryCategory::grads));
    Rng rng(Rng::derive(config.seed, static_cast<std::uint64_t>(i)));
    std::int64_t offset = 0;
    auto take = [&](std::int64_t rows, std::int64_t cols, const Tensor& from) {
      Tensor view = from.slice(offset, rows * cols).view({rows, cols});
      return view;
    };
    for (const std::string& name : config.targets) {
      Linear& linear = target_linear(block, name);
      auto adapter = std::make_unique<LoraLinear>();
      adapter->a = take(r, linear.in_features, params_.back());
      adapter->grad_a = take(r, linear.in_features, grads_.back());
      offset += r * linear.in_features;
      adapter->b = take(linear.out_features, r, params_.back());
      adapter->grad_b = take(linear.out_features, r, grads_.back());
      offset += linear.out_features * r;
      adapter->scale = config.scale();
      ops::fill_normal(adapter->a, 0.0, 1.0 / std::sqrt(static_cast<double>(linear.in_features)),
                       rng);
      linear.adapter = adapter.get();
      targets_.push_back({i, name, &linear, std::move(adapter)});
    }
  }
}

LoraModel::~LoraModel() {
  for (Target& t : targets_) t.linear->adapter = nullptr;
}

std::vector<ParamBuffer> LoraModel::buffers() const {
  std::vector<ParamBuffer> buffers;
  for (std::size_t i = 0; i < params_.size(); ++i)
    buffers.push_back({"block." + std::to_string(i) + ".lora", params_[i], grads_[i]});
  return buffers;
}

std::int64_t LoraModel::trainable_parameters() const {
  std::int64_t total = 0;
  for (const Tensor& p : params_) total += p.numel();
  return total;
}

void LoraModel::zero_grad() {
  for (Tensor& g : grads_) g.fill(0.0);
}

const LoraLinear& LoraModel::adapter(int block, const std::string& target) const {
  for (const Target& t : targets_)
    if (t.block == block && t.name == target) return *t.adapter;
  std::string names;
  for (const std::string& name : config_.targets) names += (names.empty() ? "" : ", ") + name;
  DTP_CHECK(false, "LoRA: no adapter on block ", block, "'s ", target, "; blocks 0 to ",
            model_.num_blocks() - 1, " have adapters on ", names);
  throw;  // not reached
}

void LoraModel::merge_all() {
  DTP_CHECK(!merged_, "LoRA: merge_all: the adapters are merged already");
  for (Target& t : targets_) {
    merge(t.linear->weight, t.adapter->a, t.adapter->b, t.adapter->scale);
    t.linear->adapter = nullptr;
  }
  merged_ = true;
}

void LoraModel::unmerge_all() {
  DTP_CHECK(merged_, "LoRA: unmerge_all: the adapters are not merged");
  for (Target& t : targets_) {
    unmerge(t.linear->weight, t.adapter->a, t.adapter->b, t.adapter->scale);
    t.linear->adapter = t.adapter.get();
  }
  merged_ = false;
}

}  // namespace dtp::ch08
