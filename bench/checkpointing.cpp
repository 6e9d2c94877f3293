// dtp-bench-checkpointing: what activation checkpointing (chapter 09) saves in
// memory and costs in compute and time, for one GPT on one device.
//   dtp-bench-checkpointing [--policies none,full,every:2,every:4,selective]
//                           [--attention naive,flash] [--steps 8] [--repeats 5]
//                           [--layers 8] [--d-model 128] [--heads 4] [--seq 128]
//                           [--batch 4] [--vocab 256] [--dtype f32|f64]
//                           [--device cpu|cuda[:k]] [--json FILE]
// (--help lists them with their defaults.)
// Policies, each the reference's (dtp_reference), installed on the blocks:
//   none        no policy: every block keeps what its layers saved
//   full        9.1 FullRecomputation on every block
//   every:K     9.2 checkpoint_every(layers, K), FullRecomputation on those blocks
//   selective   9.3 SelectiveRecomputation on every block (naive attention only:
//               flash keeps no probabilities, so it is skipped there with a note)
//   offload     9.4 OffloadedActivations on every block (not run unless named:
//               on the CPU its host copies share the one memory)
// Every policy trains --steps steps (forward, backward, optimizer) of a fresh
// Trainer from the same seed, with a fresh memory tracker. After each step it
// reads the tracker's peaks (Trainer::step() resets them when it starts) and
// the FLOP counter (reset before the step), and compares them with the
// lesson's formula (predicted_activation_peaks, dtp/activation_memory.h) and
// with this program's count of the matrix products. Any difference, or a loss
// that differs from the plain step's by a bit, fails the run (exit 1) after
// the table. Step time: median over the steps after two warm-up steps of
// every repeat; the policies run in turn, --repeats times round-robin, so a
// machine that speeds up or slows down moves them alike and the ratios to
// the plain step hold. Prints a table and appends one JSON object per
// (attention, policy).
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "09_activation_checkpointing/checkpointing.h"
#include "bench_common.h"
#include "bench_flags.h"
#include "dtp/activation_memory.h"
#include "dtp/device.h"
#include "dtp/flops.h"
#include "dtp/memory.h"
#include "dtp/parallel.h"
#include "dtp/trainer.h"
#include "dtp_cli.h"

namespace {

using dtp::ActivationPeaks;
using dtp::BlockKeeps;
using dtp::MemoryCategory;
using dtp::StepShape;
using namespace dtp::bench;

constexpr const char* kProgram = "dtp-bench-checkpointing";
constexpr std::int64_t kWarmup = 2;  // untimed steps at the start of every run
constexpr double kMiB = 1024.0 * 1024.0;

// --- policies ---------------------------------------------------------------------

// One way to keep activations: a name from --policies and what it means.
struct Policy {
  enum Kind { none, full, every, selective, offload };
  std::string name;
  Kind kind = none;
  int k = 0;  // every:K
};

// The policy @p text names, or nullopt.
std::optional<Policy> parse_policy(const std::string& text) {
  if (text == "none") return Policy{text, Policy::none, 0};
  if (text == "full") return Policy{text, Policy::full, 0};
  if (text == "selective") return Policy{text, Policy::selective, 0};
  if (text == "offload") return Policy{text, Policy::offload, 0};
  if (text.rfind("every:", 0) == 0) {
    const std::optional<long double> k = dtp::cli::parse_integer_text(text.substr(6));
    if (k && *k >= 1 && *k <= 1 << 16) return Policy{text, Policy::every, static_cast<int>(*k)};
  }
  return std::nullopt;
}

// Which blocks run a policy, and what each keeps, for @p layers blocks.
std::vector<BlockKeeps> keeps_of(const Policy& policy, int layers) {
  std::vector<BlockKeeps> keeps(static_cast<std::size_t>(layers), BlockKeeps::everything);
  if (policy.kind == Policy::full) keeps.assign(keeps.size(), BlockKeeps::input_only);
  if (policy.kind == Policy::selective) keeps.assign(keeps.size(), BlockKeeps::all_but_probs);
  if (policy.kind == Policy::offload) keeps.assign(keeps.size(), BlockKeeps::offloaded);
  if (policy.kind == Policy::every) {
    const std::vector<bool> plan = dtp::ch09::checkpoint_every(layers, policy.k);
    for (std::size_t i = 0; i < plan.size(); ++i)
      if (plan[i]) keeps[i] = BlockKeeps::input_only;
  }
  return keeps;
}

std::int64_t blocks_with_policy(const std::vector<BlockKeeps>& keeps) {
  return std::count_if(keeps.begin(), keeps.end(),
                       [](BlockKeeps k) { return k != BlockKeeps::everything; });
}

// --- this program's FLOP count ---------------------------------------------------------

// Matrix-product FLOPs of one step, as dtp/flops.h counts them: with N = B T
// tokens, width C, MLP ratio r, vocabulary V and L blocks, a block's forward
// is 2 N C^2 (4 + 2 r) for q, k, v, the projection, fc and proj, plus 4 B T^2 C
// for attention's scores and output; its backward twice the products, plus
// 8 B T^2 C (naive) or 10 B T^2 C (flash: the scores again). The head's LM
// product is 2 N C V forward and twice that backward. Full recomputation runs
// a block's forward again; selective only attention's 4 B T^2 C; offloading
// moves bytes and computes nothing again.
struct Flops {
  std::int64_t total = 0;
  std::int64_t recompute = 0;
};

Flops flop_formula(const StepShape& step, const std::vector<BlockKeeps>& keeps) {
  const std::int64_t B = step.batch, T = step.seq, N = B * T, C = step.config.d_model;
  const std::int64_t r = step.config.mlp_ratio, V = step.config.vocab_size;
  const std::int64_t products = 2 * N * C * C * (4 + 2 * r);
  const std::int64_t attention_forward = 4 * B * T * T * C;
  const std::int64_t attention_backward =
      (step.config.attention == dtp::AttentionKind::flash ? 10 : 8) * B * T * T * C;
  const std::int64_t block_forward = products + attention_forward;
  const std::int64_t block_backward = 2 * products + attention_backward;
  Flops f;
  for (BlockKeeps k : keeps) {
    f.total += block_forward + block_backward;
    if (k == BlockKeeps::input_only) f.recompute += block_forward;
    if (k == BlockKeeps::all_but_probs) f.recompute += attention_forward;
  }
  f.total += 3 * 2 * N * C * V + f.recompute;
  return f;
}

// --- one run --------------------------------------------------------------------------

// What one run of a policy measured.
struct Run {
  ActivationPeaks peaks;  // the largest of each over the steps
  std::array<std::int64_t, dtp::kMemoryCategoryCount> category_peaks{};
  std::int64_t total_peak = 0;
  Flops flops;                       // of the last step (every step counts the same)
  std::vector<double> losses;        // every step's
  std::vector<double> step_seconds;  // after the warm-up steps
  std::vector<std::string> problems;
};

std::string bytes_text(std::int64_t bytes, const StepShape& step) {
  std::ostringstream out;
  out << bytes << " bytes ("
      << static_cast<double>(bytes) / static_cast<double>(dtp::hidden_bytes(step))
      << " x a [B, T, C] activation)";
  return out.str();
}

// Appends to @p problems what differs between one step's peaks and FLOP
// counts and the formulas', decoded.
void check_step(const ActivationPeaks& got, const ActivationPeaks& want,
                const dtp::FlopCounts& counted, const Flops& want_flops, const StepShape& shape,
                const std::string& where, std::vector<std::string>& problems) {
  const ActivationPeaks plain = dtp::predicted_activation_peaks(
      shape, std::vector<BlockKeeps>(static_cast<std::size_t>(shape.config.layers),
                                     BlockKeeps::everything));
  const struct {
    const char* what;
    std::int64_t got, want;
    std::string meaning;
  } memory[] = {
      {"the combined peak (activations + recompute)", got.combined, want.combined,
       "the step held a different amount of activations at once than the lesson's formula says"},
      {"the activations peak", got.activations, want.activations,
       got.activations == plain.activations && want.activations != plain.activations
           ? "as much as the plain step's: the policy dropped nothing after the forward"
           : "the blocks kept a different set of tensors between forward and backward"},
      {"the recompute peak", got.recompute, want.recompute,
       got.recompute == 0 ? "nothing was charged as recomputed: was the forward run again "
                            "outside a RecomputeScope, or not at all?"
                          : "the backward made again a different set of tensors"},
      {"the offloaded peak (host copies)", got.offloaded, want.offloaded,
       "the forward copied a different set of tensors to the host"},
  };
  for (const auto& m : memory)
    if (m.got != m.want)
      problems.push_back(where + ": " + m.what + " is " + bytes_text(m.got, shape) +
                         ", the formula's " + bytes_text(m.want, shape) + ": " + m.meaning);
  if (counted.total != want_flops.total || counted.recompute != want_flops.recompute)
    problems.push_back(
        where + ": counted " + std::to_string(counted.total) + " matrix FLOPs, " +
        std::to_string(counted.recompute) + " of them recomputed; this program's formula " +
        std::to_string(want_flops.total) + ", " + std::to_string(want_flops.recompute) + ": " +
        (counted.total == want_flops.total
             ? "the same work, but not all of the forward run again counted as recomputed (was "
               "it outside a RecomputeScope?)"
             : "the step ran products the formula does not know of, or skipped some"));
}

// Trains @p steps steps under @p policy and checks each against the formulas.
Run run_policy(const dtp::TrainConfig& config, const Policy& policy, std::int64_t steps,
               const std::string& label) {
  Run run;
  auto tracker = std::make_shared<dtp::MemoryTracker>();
  dtp::set_current_memory_tracker(tracker);
  {
    dtp::Trainer trainer(config);
    dtp::GPT& model = trainer.model();
    const StepShape shape{trainer.config().model, config.batch, config.seq};
    const std::vector<BlockKeeps> keeps = keeps_of(policy, model.num_blocks());
    const dtp::ch09::FullRecomputation full;
    const dtp::ch09::SelectiveRecomputation selective;
    const dtp::ch09::OffloadedActivations offload;
    for (int i = 0; i < model.num_blocks(); ++i) {
      const BlockKeeps k = keeps[static_cast<std::size_t>(i)];
      if (k == BlockKeeps::input_only) model.block(i).policy = &full;
      if (k == BlockKeeps::all_but_probs) model.block(i).policy = &selective;
      if (k == BlockKeeps::offloaded) model.block(i).policy = &offload;
    }
    const ActivationPeaks want = dtp::predicted_activation_peaks(shape, keeps);
    const Flops want_flops = flop_formula(shape, keeps);
    tracker->reset_peaks();
    for (std::int64_t s = 0; s < steps; ++s) {
      dtp::reset_flop_counts();
      const dtp::StepRecord record = trainer.step();  // resets the peaks when it starts
      const dtp::FlopCounts counted = dtp::flop_counts();
      run.losses.push_back(record.loss);
      if (s >= kWarmup) run.step_seconds.push_back(record.seconds);
      const ActivationPeaks got{
          tracker->peak(MemoryCategory::activations), tracker->peak(MemoryCategory::recompute),
          tracker->peak_activations_with_recompute(), tracker->peak(MemoryCategory::offloaded)};
      run.peaks.activations = std::max(run.peaks.activations, got.activations);
      run.peaks.recompute = std::max(run.peaks.recompute, got.recompute);
      run.peaks.combined = std::max(run.peaks.combined, got.combined);
      run.peaks.offloaded = std::max(run.peaks.offloaded, got.offloaded);
      for (int c = 0; c < dtp::kMemoryCategoryCount; ++c)
        run.category_peaks[static_cast<std::size_t>(c)] =
            std::max(run.category_peaks[static_cast<std::size_t>(c)],
                     tracker->peak(static_cast<MemoryCategory>(c)));
      run.total_peak = std::max(run.total_peak, tracker->total_peak());
      run.flops = {counted.total, counted.recompute};

      if (run.problems.empty())  // the first step that differs says enough
        check_step(got, want, counted, want_flops, shape, label + ", step " + std::to_string(s + 1),
                   run.problems);
    }
  }
  dtp::set_current_memory_tracker(nullptr);
  return run;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> policy_names = {"none", "full", "every:2", "every:4", "selective"};
  std::vector<std::string> attention_names = {"naive", "flash"};
  std::int64_t steps = 8, repeats = 5;
  std::string json_path;
  dtp::Device device = dtp::Device::cpu();
  dtp::TrainConfig config;
  config.model.layers = 8;
  config.model.d_model = 128;
  config.model.heads = 4;
  config.model.vocab_size = 256;
  config.seq = 128;
  config.batch = 4;
  config.optimizer = "sgd";
  config.synthetic.length = 1 << 16;
  CLI::App app{
      "What activation checkpointing (chapter 09) saves and costs, for one GPT on one device: "
      "each policy (the reference's, on the blocks it names) trains --steps steps of a fresh "
      "Trainer; the tracker's activation and recompute peaks are compared with the lesson's "
      "formula and the FLOP counter with this program's count (a difference fails the run), and "
      "the median step time with the plain step's in the same run. Policies: none, full (9.1 on "
      "every block), every:K (9.2 checkpoint_every, full recomputation on those blocks), "
      "selective (9.3, naive attention only), offload (9.4 on every block).",
      kProgram};
  dtp::cli::add_list_option(
      app, "--policies", policy_names,
      "a comma list of none, full, every:K, selective, offload; none always runs too, as the "
      "baseline of the ratios",
      "POLICY,...")
      ->check(CLI::Validator(
          [](std::string& text) {
            return parse_policy(text)
                       ? std::string()
                       : "expects none, full, every:K (K >= 1), selective or offload, got '" +
                             text + "'";
          },
          "POLICY"))
      ->capture_default_str();
  dtp::cli::add_list_option(app, "--attention", attention_names,
                            "a comma list of attention kernels, each run with every policy",
                            "naive|flash,...")
      ->check(CLI::IsMember({"naive", "flash"}))
      ->capture_default_str();
  app.add_option("--steps", steps, "steps per run; times from the steps after 2 warm-up steps")
      ->check(dtp::cli::Range(std::int64_t{3}, std::int64_t{1000000}))
      ->capture_default_str();
  app.add_option("--repeats", repeats, "runs of every policy, in turn: times pooled over them")
      ->check(dtp::cli::Range(std::int64_t{1}, std::int64_t{1000}))
      ->capture_default_str();
  add_model_options(app, config);
  app.add_option("--batch", config.batch, "sequences per step")
      ->check(dtp::cli::Range(std::int64_t{1}, std::int64_t{1} << 20))
      ->capture_default_str();
  app.add_option("--vocab", config.model.vocab_size, "vocabulary size")
      ->check(dtp::cli::Range(2, 1 << 24))
      ->capture_default_str();
  dtp::cli::add_device_option(app, device)->default_str("cpu");
  app.add_option("--json", json_path, "append one JSON object per (attention, policy) to FILE")
      ->type_name("FILE");
  app.footer(
      "The backend's name in the results comes from DTP_BACKEND (default thread); DTP_THREADS "
      "sets the CPU ops' threads (default: every core).");
  if (auto status = dtp::cli::parse(app, argc, argv)) return *status;
  if (device.is_cuda() && dtp::cuda_device_count() == 0) {
    std::fprintf(stderr, "%s: --device %s: no usable CUDA device here\n", kProgram,
                 device.str().c_str());
    return 2;
  }
  std::optional<RunContext> context = context_from_env(kProgram);
  if (!context) return 2;
  context->device = device.str();
  config.model.device = device;
  config.steps = steps;
  config.synthetic.length = std::max<std::int64_t>(config.synthetic.length, 4 * (config.seq + 1));

  // none first: the baseline of every ratio.
  std::vector<Policy> policies = {*parse_policy("none")};
  for (const std::string& name : policy_names)
    if (name != "none") policies.push_back(*parse_policy(name));
  struct Case {
    dtp::AttentionKind attention;
    Policy policy;
  };
  std::vector<Case> cases;
  std::vector<std::string> notes;
  for (const std::string& a : attention_names) {
    const dtp::AttentionKind attention = dtp::parse_attention_kind(a);
    for (const Policy& p : policies) {
      if (attention == dtp::AttentionKind::flash && p.kind == Policy::selective) {
        notes.push_back(
            "selective skipped with flash attention: flash keeps no probabilities to drop (its "
            "backward already makes them again)");
        continue;
      }
      cases.push_back({attention, p});
    }
  }

  FILE* json = nullptr;
  if (!open_json(kProgram, json_path, json)) return 2;
  std::vector<Run> first(cases.size());
  std::vector<std::vector<double>> times(cases.size());
  try {
    for (std::int64_t round = 0; round < repeats; ++round)
      for (std::size_t i = 0; i < cases.size(); ++i) {
        dtp::TrainConfig c = config;
        c.model.attention = cases[i].attention;
        const std::string label = std::string(dtp::attention_kind_name(cases[i].attention)) +
                                  " attention, " + cases[i].policy.name + ", round " +
                                  std::to_string(round + 1);
        Run run = run_policy(c, cases[i].policy, steps, label);
        times[i].insert(times[i].end(), run.step_seconds.begin(), run.step_seconds.end());
        if (round == 0)
          first[i] = std::move(run);
        else if (first[i].problems.empty())
          first[i].problems = std::move(run.problems);
      }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", kProgram, e.what());
    close_json(json, kProgram, 1);
    return 1;
  }

  std::vector<std::string> problems;
  const dtp::GPTConfig model = config.resolved_model();
  std::printf(
      "# activation checkpointing, %s backend on %s, %s, %s, %d cores, %d compute thread(s)\n",
      context->backend.c_str(), context->device.c_str(), dtp::dtype_name(model.dtype),
      config.optimizer.c_str(), context->cores, dtp::compute_threads());
  std::printf(
      "# model: d_model %d, %d layers, %d heads, vocab %d, %lld parameters; batch %lld x seq "
      "%lld; median of %lld steps x %lld rounds\n",
      model.d_model, model.layers, model.heads, model.vocab_size,
      static_cast<long long>(model.parameter_count()), static_cast<long long>(config.batch),
      static_cast<long long>(config.seq), static_cast<long long>(steps - kWarmup),
      static_cast<long long>(repeats));
  std::printf(
      "# MiB: kept = activations peak, again = recompute peak, peak = the two together, host = "
      "offloaded peak; f: the formula's; x = against none with the same attention\n");
  std::printf("%-6s %-10s %6s %8s %8s %8s %8s %8s %8s %6s %6s %8s %7s %7s %7s %9s %6s\n", "attn",
              "policy", "blocks", "kept", "f kept", "again", "f again", "peak", "f peak", "host",
              "mem x", "GFLOP", "again%", "flops x", "f x", "step ms", "time x");
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const Case& cs = cases[i];
    const Run& run = first[i];
    // The plain run with the same attention: the first case of its attention.
    std::size_t plain_index = i;
    while (plain_index > 0 && cases[plain_index - 1].attention == cs.attention) --plain_index;
    const Run& plain = first[plain_index];
    dtp::GPTConfig m = model;
    m.attention = cs.attention;
    const StepShape shape{m, config.batch, config.seq};
    const std::vector<BlockKeeps> keeps = keeps_of(cs.policy, m.layers);
    const ActivationPeaks want = dtp::predicted_activation_peaks(shape, keeps);
    const Flops want_flops = flop_formula(shape, keeps);
    const Flops plain_flops =
        flop_formula(shape, std::vector<BlockKeeps>(keeps.size(), BlockKeeps::everything));
    const double seconds = median(times[i]), plain_seconds = median(times[plain_index]);
    const double memory_ratio =
        static_cast<double>(run.peaks.combined) / static_cast<double>(plain.peaks.combined);
    const double time_ratio = seconds / plain_seconds;
    const double flop_ratio =
        static_cast<double>(run.flops.total) / static_cast<double>(plain.flops.total);
    const double formula_flop_ratio =
        static_cast<double>(want_flops.total) / static_cast<double>(plain_flops.total);
    const char* attention = dtp::attention_kind_name(cs.attention);
    const std::string label = std::string(attention) + " attention, " + cs.policy.name;
    bool same_losses = run.losses.size() == plain.losses.size();
    for (std::size_t s = 0; same_losses && s < run.losses.size(); ++s)
      if (run.losses[s] != plain.losses[s]) {
        same_losses = false;
        char text[512];
        std::snprintf(text, sizeof text,
                      "%s, step %zu: the loss is %.17g, the plain step's %.17g: %s", label.c_str(),
                      s + 1, run.losses[s], plain.losses[s],
                      s == 0 ? "the policy changed the forward itself (it must return the block's "
                               "own output)"
                             : "the first step's loss agreed, so its gradients differed and moved "
                               "the weights elsewhere (recomputation must repeat the forward "
                               "exactly)");
        problems.push_back(text);
      }
    problems.insert(problems.end(), run.problems.begin(), run.problems.end());
    const bool memory_exact =
        run.peaks.activations == want.activations && run.peaks.recompute == want.recompute &&
        run.peaks.combined == want.combined && run.peaks.offloaded == want.offloaded;
    std::printf(
        "%-6s %-10s %6lld %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %6.2f %5.2fx %8.2f %6.1f%% %6.3fx "
        "%6.3fx %9.1f %5.2fx\n",
        attention, cs.policy.name.c_str(), static_cast<long long>(blocks_with_policy(keeps)),
        run.peaks.activations / kMiB, want.activations / kMiB, run.peaks.recompute / kMiB,
        want.recompute / kMiB, run.peaks.combined / kMiB, want.combined / kMiB,
        run.peaks.offloaded / kMiB, memory_ratio, static_cast<double>(run.flops.total) * 1e-9,
        100.0 * static_cast<double>(run.flops.recompute) / static_cast<double>(run.flops.total),
        flop_ratio, formula_flop_ratio, seconds * 1e3, time_ratio);
    if (!json) continue;
    JsonLine categories;
    for (int c = 0; c < dtp::kMemoryCategoryCount; ++c)
      categories.add(dtp::memory_category_name(static_cast<MemoryCategory>(c)),
                     run.category_peaks[static_cast<std::size_t>(c)]);
    std::vector<std::int64_t> checkpointed;
    for (std::size_t b = 0; b < keeps.size(); ++b)
      if (keeps[b] != BlockKeeps::everything) checkpointed.push_back(static_cast<std::int64_t>(b));
    JsonLine line;
    line.add("what", "checkpointing")
        .add("attention", attention)
        .add("policy", cs.policy.name)
        .add("policy_blocks", checkpointed)
        .add("dtype", dtp::dtype_name(m.dtype))
        .add("optimizer", config.optimizer)
        .add("d_model", m.d_model)
        .add("layers", m.layers)
        .add("heads", m.heads)
        .add("vocab", m.vocab_size)
        .add("mlp_ratio", m.mlp_ratio)
        .add("seq", config.seq)
        .add("batch", config.batch)
        .add("parameters", m.parameter_count())
        .add("activations_bytes", run.peaks.activations)
        .add("recompute_bytes", run.peaks.recompute)
        .add("combined_bytes", run.peaks.combined)
        .add("formula_activations_bytes", want.activations)
        .add("formula_recompute_bytes", want.recompute)
        .add("formula_combined_bytes", want.combined)
        .add("offloaded_bytes", run.peaks.offloaded)
        .add("formula_offloaded_bytes", want.offloaded)
        .add("memory_matches_formula", memory_exact)
        .raw("peak_bytes_by_category", categories.str())
        .add("total_peak_bytes", run.total_peak)
        .add("flops", run.flops.total)
        .add("recompute_flops", run.flops.recompute)
        .add("formula_flops", want_flops.total)
        .add("formula_recompute_flops", want_flops.recompute)
        .add("plain_flops", plain.flops.total)
        .add("loss_equals_plain", same_losses)
        .add("first_loss", run.losses.front())
        .add("step_s", seconds)
        .add("plain_step_s", plain_seconds)
        .add("step_s_samples", times[i])
        .add("memory_ratio", memory_ratio)
        .add("time_ratio", time_ratio)
        .add("flop_ratio", flop_ratio)
        .add("formula_flop_ratio", formula_flop_ratio)
        .add("steps", steps)
        .add("warmup", kWarmup)
        .add("repeats", repeats)
        .add("compute_threads", dtp::compute_threads());
    try {
      write_line(json, add_context(line, *context));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: error: %s\n", kProgram, e.what());
      close_json(json, kProgram, 1);
      return 1;
    }
  }
  for (const std::string& note : notes) std::printf("# %s\n", note.c_str());
  return finish_checked_run(
      json, kProgram, problems,
      "the measured step differs from the lesson's formula or from the plain step",
      "every peak equals the formula's, every FLOP count this program's, every loss the plain "
      "step's");
}
