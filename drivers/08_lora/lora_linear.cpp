// Provided: a LoraLinear is the LinearAdapter that runs puzzle 8.1 inside a
// Linear, and the names of the Linears an adapter can go on.
#include <algorithm>
#include <sstream>

#include "08_lora/lora.h"

namespace dtp::ch08 {

Tensor LoraLinear::forward(const Tensor& x, Tensor& y) const {
  return lora_forward(x, a, b, scale, y);
}

void LoraLinear::backward_input(const Tensor& dy, Tensor& dx) const {
  lora_backward_input(dy, a, b, scale, dx);
}

void LoraLinear::backward_weight(const Tensor& dy, const Tensor& x, const Tensor& kept) const {
  Tensor da = grad_a, db = grad_b;  // views: writes land in the LoraModel's gradient buffer
  lora_backward_weight(dy, x, kept, b, scale, da, db);
}

const std::vector<std::string>& all_lora_targets() {
  static const std::vector<std::string> names = {"attn.q",    "attn.k", "attn.v",
                                                 "attn.proj", "mlp.fc", "mlp.proj"};
  return names;
}

namespace {
std::string accepted() {
  std::string names;
  for (const std::string& name : all_lora_targets()) names += (names.empty() ? "" : ", ") + name;
  return names + " (or all)";
}
}  // namespace

std::vector<std::string> parse_lora_targets(const std::string& text) {
  if (text == "all") return all_lora_targets();
  std::vector<std::string> targets;
  std::stringstream items(text);
  std::string item;
  while (std::getline(items, item, ',')) {
    bool known = false;
    for (const std::string& name : all_lora_targets()) known = known || name == item;
    DTP_CHECK(known, "LoRA targets: unknown target '", item, "'; accepted: ", accepted());
    for (const std::string& seen : targets)
      DTP_CHECK(seen != item, "LoRA targets: '", item, "' is named twice");
    targets.push_back(item);
  }
  DTP_CHECK(!targets.empty(), "LoRA targets: none given; accepted: ", accepted());
  return targets;
}

Linear& target_linear(Block& block, const std::string& target) {
  if (target == "attn.q") return block.attn.q;
  if (target == "attn.k") return block.attn.k;
  if (target == "attn.v") return block.attn.v;
  if (target == "attn.proj") return block.attn.proj;
  DTP_CHECK(!block.is_moe() || (target != "mlp.fc" && target != "mlp.proj"), "LoRA: target '",
            target, "': block ", block.layer(),
            " is a mixture of experts; adapters go on its attention only (attn.q, attn.k, attn.v, "
            "attn.proj)");
  if (target == "mlp.fc") return block.mlp.fc;
  if (target == "mlp.proj") return block.mlp.proj;
  throw Error("LoRA: unknown target '" + target + "'; accepted: " + accepted());
}

std::int64_t lora_parameter_count(const GPTConfig& model, const LoraConfig& config) {
  const std::int64_t d = model.d_model,
                     hidden = static_cast<std::int64_t>(model.mlp_ratio) * model.d_model;
  std::int64_t per_block = 0;
  for (const std::string& target : config.targets) {
    DTP_CHECK(std::find(all_lora_targets().begin(), all_lora_targets().end(), target) !=
                  all_lora_targets().end(),
              "LoRA: unknown target '", target, "'; accepted: ", accepted());
    const std::int64_t in = target == "mlp.proj" ? hidden : d,
                       out = target == "mlp.fc" ? hidden : d;
    per_block += config.rank * (in + out);
  }
  return model.layers * per_block;
}

}  // namespace dtp::ch08
