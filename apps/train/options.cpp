// dtp-train's flags: its own groups, the strategies' groups, the choice of
// strategy, and the checks between flags.
#include "train/options.h"

#include <cstdio>
#include <cstdlib>
#include <limits>

#include "drivers/checkpointing.h"
#include "dtp/device.h"
#include "dtp/error.h"
#include "dtp/launch.h"

namespace dtp::train_app {
namespace {

constexpr std::int64_t kMaxSteps = 1000000000;
constexpr std::int64_t kMaxWidth = 1 << 16;

// dtp-train's own flags, bound to an Options: the run, its checkpoints, the
// model and the optimizer. @p strategy_name and @p dtype are read after
// parsing (the strategy is chosen once every flag is known).
struct CommonFlags {
  cli::FlagGroup run{"Run"}, checkpoints{"Checkpoints"}, model{"Model"}, optimizer{"Optimizer"};
  std::string strategy_name = "single";
  std::string dtype = "f32";

  explicit CommonFlags(Options& o) {
    TrainConfig& c = o.config;
    run.custom("--device", "cpu|cuda[:k]", "where to train (default cpu)",
               [&c](const std::string& v) { c.model.device = parse_device(v); });
    run.custom("--strategy", "NAME", "how to train: a strategy below (default single, one device)",
               [this](const std::string& v) {
                 if (v.empty()) throw UsageError("--strategy expects a strategy name, got ''");
                 strategy_name = v;
               });
    run.custom("--impl", "puzzles|reference",
               "whose code a strategy with puzzles runs: yours in puzzles/ (default) or the "
               "reference solution "
               "(bin/dtp-train-reference, started for you)",
               [&o](const std::string& v) {
                 if (v != "puzzles" && v != "reference")
                   throw UsageError("--impl accepts puzzles or reference, got '" + v + "'");
                 o.impl = v;
               });
    run.integer("--steps", &c.steps, 1, kMaxSteps, "K", "optimizer steps");
    run.integer("--batch", &c.batch, 1, 1 << 20, "B", "sequences per step, the global batch");
    run.integer("--seq", &c.seq, 1, 1 << 16, "T", "tokens per sequence");
    run.path(
        "--data", &c.data_path, "FILE",
        "train on the bytes of a text file (vocabulary 256); default: the synthetic phrase stream");
    run.integer("--seed", &c.seed, 0, std::numeric_limits<std::int64_t>::max(), "N",
                "seeds weights, data and sampling");
    run.path("--trace", &c.trace_path, "FILE",
             "write a Chrome/Perfetto trace of the run as it runs: each rank a process, its "
             "communication thread "
             "a second track. Under mpiexec each process writes FILE.partK and rank 0 merges them "
             "into FILE");
    run.path("--json", &c.json_path, "FILE",
             "write a JSON-lines log (config, one line per step, summary)");
    run.integer("--log-every", &o.log_every, 1, kMaxSteps, "N",
                "keep a line every N steps; on a terminal a line updates in place in between",
                "about ten lines per run");

    checkpoints.path(
        "--save", &c.save_path, "FILE",
        "at the end, write what the run trains, the optimizer state, the step and these settings "
        "to "
        "FILE (through FILE.tmp, renamed: an interrupted save leaves the old FILE as it was)");
    checkpoints.custom(
        "--resume", "FILE",
        "continue the run that saved FILE, from its step to --steps: the same result, bit for bit, "
        "as the run never stopped. Every setting but --steps must be the saved run's, the "
        "strategy's flags too (the error lists any that differ)",
        [&c](const std::string& v) {
          if (v.empty()) throw UsageError("--resume expects a checkpoint file, got ''");
          c.resume_path = v;
        });
    checkpoints.custom(
        "--load", "FILE",
        "start from FILE's parameters (a new run: fresh optimizer, step 0): fine-tuning a "
        "pretrained model. A file of another float dtype is cast",
        [&c](const std::string& v) {
          if (v.empty()) throw UsageError("--load expects a checkpoint file, got ''");
          c.load_path = v;
        });
    checkpoints.integer(
        "--stop-after", &c.stop_after, 1, kMaxSteps, "K",
        "stop after step K of --steps: train a run in slices (--save, then --resume)", "--steps");
    checkpoints.paragraph(
        "Every strategy saves and resumes. Where ranks hold shards (zero, tp, pp, ep), rank 0 "
        "gathers them into one file of the single-device layout, which --load reads under any "
        "strategy. The format: runtime/include/dtp/checkpoint.h.");

    model.integer("--layers", &c.model.layers, 0, 256, "N", "transformer blocks");
    model.integer("--d-model", &c.model.d_model, 1, kMaxWidth, "C", "width");
    model.integer("--heads", &c.model.heads, 1, kMaxWidth, "H",
                  "attention heads; C must divide by H");
    model.integer("--vocab", &c.model.vocab_size, 2, 1 << 20, "V",
                  "vocabulary of the synthetic data");
    model.custom("--attention", "naive|flash", "the attention kernel (default naive)",
                 [&c](const std::string& v) { c.model.attention = parse_attention_kind(v); });
    model.choice("--dtype", &dtype, {"f32", "f64"}, "parameter and activation dtype");
    model.custom("--checkpoint", "none|full|every:K|selective|offload",
                 "activation checkpointing (chapter 09): full recomputes every block's forward in "
                 "its backward, every:K blocks 0, K, 2K, ..., selective only naive attention's "
                 "probabilities, offload copies each block's saved tensors to host memory and "
                 "back; the numbers trained do not change (default none)",
                 [&c](const std::string& v) {
                   drivers::parse_checkpoint(v);
                   c.checkpoint = v;
                 });
    model.integer("--moe-experts", &c.model.experts, 0, 1024, "E",
                  "a mixture of E expert MLPs in every block (0: one dense MLP)");
    model.integer("--top-k", &c.model.top_k, 1, 1024, "K", "experts per token (at most E)");
    model.real("--capacity-factor", &c.model.capacity_factor, 0, 1024, "X",
               "expert capacity = ceil(X tokens K / E); choices over it are dropped",
               cli::Ends::open_low);
    model.real("--aux-loss-coef", &c.model.aux_loss_coef, 0, 100, "X",
               "weight of the load-balancing loss");
    model.integer(
        "--moe-groups", &c.model.moe_groups, 1, 1024, "G",
        "route each batch's tokens in G equal groups, each with its own capacity and balance loss");

    optimizer.choice("--optimizer", &c.optimizer, {"adamw", "sgd"}, "the optimizer");
    optimizer.real("--lr", &c.lr, 1e-12, 1000, "X", "peak learning rate");
    optimizer.integer("--warmup", &c.warmup, 0, kMaxSteps, "N", "linear warm-up steps");
    optimizer.real("--min-lr-ratio", &c.min_lr_ratio, 0, 1, "X", "the cosine decay ends at lr * X");
    optimizer.real("--weight-decay", &c.weight_decay, 0, 100, "X", "decoupled weight decay");
    optimizer.real("--momentum", &c.momentum, 0, 1, "X", "SGD momentum", cli::Ends::open_high);
    optimizer.real("--clip", &c.grad_clip, 0, 1e6, "X",
                   "clip gradients to this global norm; 0 disables");
  }

  std::vector<const cli::FlagGroup*> groups() const {
    return {&run, &checkpoints, &model, &optimizer};
  }
};

// A strategy's flags, declared once per program (its settings live in the
// strategy object the registry holds).
const std::vector<cli::FlagGroup>& strategy_flags() {
  static const std::vector<cli::FlagGroup> groups = [] {
    std::vector<cli::FlagGroup> out;
    for (drivers::Strategy* s : drivers::registered_strategies()) {
      std::string title = s->title() + " (" + s->chosen_by();
      if (!s->chapter().empty()) title += ", chapter " + s->chapter();
      out.emplace_back(title + ")");
      s->add_flags(out.back());
    }
    return out;
  }();
  return groups;
}

// "--strategy ddp, zero or ep, --precision bf16|fp16 or --lora-rank R": the
// ways to choose the strategies that take @p flag.
std::string strategies_taking(const std::string& flag) {
  std::vector<std::string> by_name, by_flag;
  const auto& groups = strategy_flags();
  for (std::size_t i = 0; i < groups.size(); ++i) {
    if (!groups[i].find(flag)) continue;
    drivers::Strategy* s = drivers::registered_strategies()[i];
    if (s->chosen_by() == "--strategy " + s->name())
      by_name.push_back(s->name());
    else
      by_flag.push_back(s->chosen_by());
  }
  std::vector<std::string> ways;
  if (!by_name.empty()) {
    std::string names = "--strategy ";
    for (std::size_t i = 0; i < by_name.size(); ++i)
      names += (i == 0 ? "" : i + 1 == by_name.size() ? " or " : ", ") + by_name[i];
    ways.push_back(names);
  }
  ways.insert(ways.end(), by_flag.begin(), by_flag.end());
  std::string text;
  for (std::size_t i = 0; i < ways.size(); ++i)
    text += (i == 0 ? "" : i + 1 == ways.size() ? " or " : ", ") + ways[i];
  return text;
}

// The strategy the command line asks for: --strategy NAME, or the one a
// flag of its own chooses (--precision bf16, --lora-rank R).
drivers::Strategy* choose_strategy(const std::string& name,
                                   const std::vector<cli::GivenFlag>& given) {
  drivers::Strategy* named = drivers::find_strategy(name);
  std::string names;
  for (drivers::Strategy* s : drivers::registered_strategies())
    if (s->chosen_by() == "--strategy " + s->name())
      names += (names.empty() ? "" : ", ") + s->name();
  if (!named) throw UsageError("--strategy: unknown strategy '" + name + "'; accepted: " + names);
  if (named->chosen_by() != "--strategy " + named->name())
    throw UsageError("--strategy " + name + " is chosen by " + named->chosen_by() +
                     ": give that instead");
  drivers::Strategy* chosen = nullptr;
  for (drivers::Strategy* s : drivers::registered_strategies()) {
    if (!s->chosen(given)) continue;
    if (chosen)
      throw UsageError(s->chosen_by() + " (--strategy " + s->name() + ") and " +
                       chosen->chosen_by() + " (--strategy " + chosen->name() +
                       ") choose two strategies: give one");
    chosen = s;
  }
  if (!chosen) return named;
  if (name != "single")
    throw UsageError(chosen->chosen_by() + " chooses --strategy " + chosen->name() + " (" +
                     chosen->title() + "), which does not combine with --strategy " + name +
                     ": give one of them");
  return chosen;
}

// A flag that the run would not use is a mistake in the command line, not
// something to drop without a word.
void check_no_ignored_flags(const Options& o) {
  const TrainConfig& c = o.config;
  auto given = [&o](const char* flag) { return cli::was_given(o.given, flag); };
  for (const char* flag : {"--top-k", "--capacity-factor", "--aux-loss-coef"})
    if (given(flag) && c.model.experts == 0)
      throw UsageError(std::string(flag) +
                       " sets the mixture of experts: it needs --moe-experts E");
  if (given("--momentum") && c.optimizer != "sgd")
    throw UsageError("--momentum is SGD's; this run's --optimizer is " + c.optimizer);
  if (given("--vocab") && !c.data_path.empty())
    throw UsageError("--vocab is 256 (one id per byte) with --data: drop --vocab");
}

}  // namespace

std::string usage() {
  Options o;
  const CommonFlags common(o);
  std::string text =
      "Usage: dtp train [OPTIONS]\n\n"
      "Trains a small GPT on one device or with a strategy of the chapters (below), shows a "
      "progress line\n"
      "(loss, tokens/s, time left), a per-rank table after each kept step, and a summary.\n\n"
      "Strategies:\n";
  for (drivers::Strategy* s : drivers::registered_strategies()) {
    char line[160];
    std::snprintf(
        line, sizeof line, "  %-24s %s%s\n", s->chosen_by().c_str(), s->title().c_str(),
        s->chapter().empty() ? " (the default)" : (" (chapter " + s->chapter() + ")").c_str());
    text += line;
  }
  std::vector<const cli::FlagGroup*> groups = {&common.run, &common.checkpoints};
  for (const cli::FlagGroup& g : strategy_flags())
    if (!g.flags().empty() || !g.paragraphs().empty()) groups.push_back(&g);
  groups.push_back(&common.model);
  groups.push_back(&common.optimizer);
  text += cli::format_groups(groups);
  text +=
      "\n  -h, --help                this text\n\n"
      "Exit status: 0 trained; 1 the run failed; 2 a bad command line; 3 a puzzle the run needs is "
      "not solved "
      "yet.\n";
  return text;
}

Options parse_arguments(int argc, char** argv) {
  Options o;
  CommonFlags common(o);
  std::vector<const cli::FlagGroup*> groups = common.groups();
  for (const cli::FlagGroup& g : strategy_flags()) groups.push_back(&g);
  bool help = false;
  o.given = cli::read_flags(argc, argv, groups, help);
  if (help) {
    std::fputs(usage().c_str(), stdout);
    std::exit(0);
  }
  for (const cli::FlagGroup* g : common.groups()) cli::apply_flags(*g, o.given);
  o.config.model.dtype = parse_dtype(common.dtype);
  o.strategy = choose_strategy(common.strategy_name, o.given);
  o.config.strategy = o.strategy->name();
  // The chosen strategy's flags are set. A flag that only other strategies
  // take is a mistake, unless it is the flag that chooses one of them and
  // here did not (--precision fp32).
  const std::vector<drivers::Strategy*>& registered = drivers::registered_strategies();
  const cli::FlagGroup* mine = nullptr;
  for (std::size_t i = 0; i < registered.size(); ++i)
    if (registered[i] == o.strategy) mine = &strategy_flags()[i];
  cli::apply_flags(*mine, o.given);
  for (const cli::GivenFlag& flag : o.given) {
    bool taken = mine->find(flag.name) != nullptr;
    for (const cli::FlagGroup* g : common.groups()) taken = taken || g->find(flag.name);
    for (drivers::Strategy* s : registered)
      taken = taken || s->chosen_by().rfind(flag.name + " ", 0) == 0;
    if (!taken) throw UsageError(flag.name + " needs " + strategies_taking(flag.name));
  }
  return o;
}

void check_options(const Options& o) {
  const TrainConfig& config = o.config;
  check_no_ignored_flags(o);
  if (config.model.d_model % config.model.heads != 0)
    throw UsageError("--heads " + std::to_string(config.model.heads) + " must divide --d-model " +
                     std::to_string(config.model.d_model));
  if (config.model.top_k > std::max(config.model.experts, 1))
    throw UsageError("--top-k " + std::to_string(config.model.top_k) +
                     " needs at least as many experts (--moe-experts " +
                     std::to_string(config.model.experts) + ")");
  if (config.stop_after > config.steps)
    throw UsageError("--stop-after " + std::to_string(config.stop_after) + " is past --steps " +
                     std::to_string(config.steps));
  if (!config.resume_path.empty() && !config.load_path.empty() && !o.strategy->resume_with_load())
    throw UsageError(
        "--resume continues a run and --load starts a new one from saved parameters: give one, not "
        "both (under --lora-rank they go together: --load the base, --resume the adapters)");
  try {
    o.strategy->validate(config);
  } catch (const dtp::Error& e) {
    throw UsageError(e.what());
  }
  check_files(o);
  if (config.model.device.is_cuda() && cuda_device_count() == 0)
    throw UsageError("--device " + config.model.device.str() +
                     ": no usable CUDA device here (none found, or DTP was built without CUDA)");
  // The environment the runtime reads, before the run prints its header.
  try {
    (void)World::from_env(1);
    (void)default_timeout_seconds();
  } catch (const dtp::Error& e) {
    throw UsageError(std::string("the environment: ") + e.what());
  }
  // Last: these create the files, which a later usage error would leave behind.
  check_outputs_writable(o);
}

std::string find_flag(int argc, char** argv, const std::string& flag) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == flag && i + 1 < argc) return argv[i + 1];
    if (arg.rfind(flag + "=", 0) == 0) return arg.substr(flag.size() + 1);
  }
  return "";
}

}  // namespace dtp::train_app
