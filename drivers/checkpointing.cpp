#include "drivers/checkpointing.h"

#include <cstdlib>

#include "dtp/error.h"
#include "flag_group.h"

namespace dtp::drivers {

CheckpointChoice parse_checkpoint(const std::string& text) {
  const std::string forms = "none, full, every:K (K >= 1, every K-th block), selective or offload";
  CheckpointChoice choice;
  if (text == "none") return choice;
  if (text == "full") {
    choice.kind = CheckpointChoice::Kind::full;
    return choice;
  }
  if (text == "selective") {
    choice.kind = CheckpointChoice::Kind::selective;
    return choice;
  }
  if (text == "offload") {
    choice.kind = CheckpointChoice::Kind::offload;
    return choice;
  }
  if (text.rfind("every:", 0) == 0) {
    const std::string k = text.substr(6);
    char* end = nullptr;
    const long value = k.empty() ? 0 : std::strtol(k.c_str(), &end, 10);
    if (!k.empty() && *end == '\0' && value >= 1 && value <= 1 << 16) {
      choice.kind = CheckpointChoice::Kind::every;
      choice.every = static_cast<int>(value);
      return choice;
    }
    throw cli::UsageError(
        "--checkpoint every:K needs a whole K from 1 to 65536 (every K-th block "
        "recomputes), got '" +
        text + "'");
  }
  throw cli::UsageError("--checkpoint accepts " + forms + ", got '" + text + "'");
}

namespace {
CheckpointPolicies& program_policies() {
  static CheckpointPolicies policies;
  return policies;
}
}  // namespace

const CheckpointPolicies& checkpoint_policies() {
  const CheckpointPolicies& p = program_policies();
  DTP_CHECK(p.full && p.selective && p.offload && p.every,
            "--checkpoint: this program links no activation policies (chapter 09)");
  return p;
}

void set_checkpoint_policies(const CheckpointPolicies& policies) { program_policies() = policies; }

void check_checkpoint_fits(const std::string& text, const GPTConfig& model) {
  const CheckpointChoice::Kind kind = parse_checkpoint(text).kind;
  if (kind == CheckpointChoice::Kind::offload)
    DTP_CHECK(model.experts == 0,
              "--checkpoint offload moves a dense block's saved tensors; a mixture-of-experts "
              "block's are not enumerated (use full or every:K)");
  if (kind == CheckpointChoice::Kind::selective)
    DTP_CHECK(model.attention == AttentionKind::naive,
              "--checkpoint selective drops naive attention's probabilities; with --attention "
              "flash there are none to drop (flash already recomputes them): use full or every:K");
}

void install_checkpointing(const std::string& text, GPT& model) {
  const CheckpointChoice choice = parse_checkpoint(text);
  if (choice.kind == CheckpointChoice::Kind::none) return;
  check_checkpoint_fits(text, model.config());
  const CheckpointPolicies& policies = checkpoint_policies();
  std::vector<bool> plan(static_cast<std::size_t>(model.num_blocks()), true);
  if (choice.kind == CheckpointChoice::Kind::every)
    plan = policies.every(model.num_blocks(), choice.every);
  const ActivationPolicy* policy =
      choice.kind == CheckpointChoice::Kind::selective ? policies.selective
      : choice.kind == CheckpointChoice::Kind::offload ? policies.offload
                                                       : policies.full;
  for (int i = 0; i < model.num_blocks(); ++i)
    model.block(i).policy = plan.at(static_cast<std::size_t>(i)) ? policy : nullptr;
}

std::string checkpoint_header(const std::string& text, int layers) {
  const CheckpointChoice choice = parse_checkpoint(text);
  switch (choice.kind) {
    case CheckpointChoice::Kind::none:
      return "";
    case CheckpointChoice::Kind::full:
      return "activation checkpointing: full (each of the " + std::to_string(layers) +
             " blocks keeps its input and runs its forward again in the backward; 9.1)";
    case CheckpointChoice::Kind::every:
      return "activation checkpointing: every:" + std::to_string(choice.every) + ", blocks 0, " +
             std::to_string(choice.every) + ", " + std::to_string(2 * choice.every) +
             ", ... keep only their input (9.1 and 9.2)";
    case CheckpointChoice::Kind::selective:
      return "activation checkpointing: selective (each block drops its attention probabilities "
             "and makes them again in the backward; 9.3)";
    case CheckpointChoice::Kind::offload:
      return "activation offloading: each block's saved tensors go to host memory on the copy "
             "lane while the next block computes, and come back for its backward (9.4)";
  }
  return "";
}

}  // namespace dtp::drivers
