// dtp-bench-sequence-expert: chapter 06 measured. Sequence-parallel attention
// (the reference Ulysses, ring, zigzag and hybrid) against single-device flash
// attention; what Ulysses and the ring send, on the alpha-beta clock; and how
// many tokens a mixture of experts drops at each capacity factor; and whole
// training steps of sp and ep against one device.
//   dtp-bench-sequence-expert [--only attention|tiers|moe|train] [--seqs 256,512,1024,2048]
//       [--degrees 1,2,4,8] [--methods flash,ulysses,ring,zigzag,hybrid] [--batch 1]
//       [--heads 8] [--head-dim 32] [--dtype f32|f64] [--warmup 1] [--repeats 3]
//       [--nvlink 3,450] [--infiniband 8,50] [--tier-shape 1,16,32,8192]
//       [--moe-experts 4,8] [--moe-top-k 1,2] [--moe-coefs 0,0.01] [--moe-steps 300]
//       [--train-shape 2,128,8,256,4] [--train-moe 4,2] [--train-steps 4] [--quick] [--json FILE]
// (--help lists them with their defaults.)
//
// One file per part, named as --only names it: attention.cpp (part 1,
// "sp_attention"), tiers.cpp (part 2, "sp_comm_tiers"), moe.cpp (part 3,
// "moe_capacity") and train.cpp (part 4, "sp_ep_train_step"), each with
// what its numbers mean; parts.h is what they share. The runs themselves
// are in bench/sp_attention.h (parts 1 and 2), bench/moe_capacity.h (part 3)
// and bench/sp_ep_training.h (part 4). This file reads the command line and
// runs the parts it asks for.
//
// Thread backend on the CPU only: every rank's numbers are written into
// memory the process shares, and the timings assume no device queue.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_common.h"
#include "bench_flags.h"
#include "parts.h"

namespace dtp::bench::sequence_expert {
namespace {

// "ALPHA_US,GBPS" into @p tier (--nvlink, --infiniband); a bad value throws
// CLI::ValidationError naming @p flag.
void set_tier(sp::Tier& tier, const std::string& flag, const std::string& text) {
  const LinkCost link = parse_link(flag, text);
  tier.alpha_s = link.alpha_s;
  tier.bandwidth_Bps = link.bandwidth_Bps;
}

/// What the command line asks for: each part's options, and which parts run.
struct Request {
  AttentionOptions attention;
  TierOptions tiers;
  MoeOptions moe;
  TrainOptions training;
  std::string only;       // --only: one part; empty: all four
  std::string json_path;  // --json
  bool runs(const char* part) const { return only.empty() || only == part; }
};

/// Reads the command line into @p r. Returns the exit status when the
/// program must stop (help: 0, a bad command line: 2).
std::optional<int> parse_command_line(Request& r, int argc, char** argv) {
  AttentionOptions& attention = r.attention;
  TierOptions& tiers = r.tiers;
  MoeOptions& moe = r.moe;
  TrainOptions& training = r.training;
  std::string dtype = "f32";
  bool quick = false;
  // What the command line says; applied after --quick's values, so that flags given with it win.
  std::vector<std::int64_t> seqs = attention.seqs,
                            tier_shape = {tiers.dims.B, tiers.dims.T, tiers.dims.H, tiers.dims.D};
  std::vector<int> degrees = attention.degrees;
  std::vector<std::string> methods = {"flash", "ulysses", "ring", "zigzag", "hybrid"};
  int warmup = attention.warmup, repeats = attention.repeats, moe_trials = moe.trials;
  std::int64_t moe_steps = moe.steps, train_steps = training.steps;
  const dtp::TrainConfig& tc = training.model.config;
  std::vector<std::int64_t> train_shape = {tc.model.layers, tc.model.d_model, tc.model.heads,
                                           tc.seq, tc.batch};
  std::vector<std::int64_t> train_moe = {training.model.experts, training.model.top_k};
  const std::int64_t kMaxSize = std::int64_t{1} << 20;

  CLI::App app{
      "Chapter 06 measured, in four parts. attention (sp_attention): the reference Ulysses, ring, "
      "zigzag "
      "and hybrid attention against single-device flash attention, forward and backward: time, CPU "
      "time "
      "of the busiest rank, memory, error. tiers (sp_comm_tiers): what Ulysses and the ring send, "
      "on the "
      "alpha-beta clock of NVLink and InfiniBand, against the lesson's formulas. moe "
      "(moe_capacity): how "
      "many tokens a mixture of experts drops at each capacity factor, at init and after training, "
      "against a uniform random router. train (sp_ep_train_step): whole training steps of sp and "
      "ep "
      "against one device. bench/README.md says what each number is.",
      "dtp-bench-sequence-expert"};
  app.add_option("--only", r.only,
                 "one part: attention (time and memory), tiers (bytes and the alpha-beta clock), "
                 "moe, or train (sp "
                 "and ep training steps against one device); default all four")
      ->check(CLI::IsMember({"attention", "tiers", "moe", "train"}));
  dtp::cli::add_list_option(app, "--seqs", seqs, "sequence lengths T, a comma list", "T,...")
      ->check(dtp::cli::Range(std::int64_t{1}, kMaxSize))
      ->capture_default_str();
  dtp::cli::add_list_option(app, "--degrees", degrees,
                            "sequence-parallel degrees n, a comma list (the tiers use those >= 2, "
                            "train those >= 2 with its "
                            "own default 2,4)",
                            "N,...")
      ->check(dtp::cli::Range(1, 64))
      ->capture_default_str();
  dtp::cli::add_list_option(
      app, "--methods", methods,
      "which to run, a comma list; flash is the one-rank peer the others are checked against",
      "METHOD,...")
      ->check(CLI::IsMember({"flash", "ulysses", "ring", "zigzag", "hybrid"}))
      ->capture_default_str();
  app.add_option("--batch", attention.dims.B, "B of q, k, v [B, T/n, H, D]")
      ->check(dtp::cli::Range(std::int64_t{1}, kMaxSize))
      ->capture_default_str();
  app.add_option("--heads", attention.dims.H, "H of q, k, v")
      ->check(dtp::cli::Range(std::int64_t{1}, kMaxSize))
      ->capture_default_str();
  app.add_option("--head-dim", attention.dims.D, "D of q, k, v")
      ->check(dtp::cli::Range(std::int64_t{1}, kMaxSize))
      ->capture_default_str();
  app.add_option("--dtype", dtype, "of q, k, v (and of the trained GPT)")
      ->check(CLI::IsMember({"f32", "f64"}))
      ->capture_default_str();
  app.add_option("--warmup", warmup, "untimed passes (train: steps) per run; default 1")
      ->check(dtp::cli::Range(0, 1000));
  app.add_option("--repeats", repeats, "runs per case, round-robin; default 3, train 6")
      ->check(dtp::cli::Range(1, 1000));
  app.add_option_function<std::string>(
         "--nvlink",
         [&tiers](const std::string& text) { set_tier(tiers.tiers[0], "--nvlink", text); },
         "the NVLink tier's alpha (us) and bandwidth (GB/s)")
      ->type_name("US,GBPS")
      ->default_str("3,450");
  app.add_option_function<std::string>(
         "--infiniband",
         [&tiers](const std::string& text) { set_tier(tiers.tiers[1], "--infiniband", text); },
         "the InfiniBand tier's alpha (us) and bandwidth (GB/s)")
      ->type_name("US,GBPS")
      ->default_str("8,50");
  dtp::cli::add_list_option(
      app, "--tier-shape", tier_shape,
      "B,T,H,D of the tiers part (default 1,16,32,8192: one q is 16 MiB in f32)", "B,T,H,D")
      ->expected(4)
      ->check(dtp::cli::Range(std::int64_t{1}, kMaxSize));
  dtp::cli::add_list_option(app, "--moe-experts", moe.experts,
                            "the MoE models' numbers of experts E, a comma list", "E,...")
      ->check(dtp::cli::Range(std::int64_t{1}, std::int64_t{1024}))
      ->capture_default_str();
  dtp::cli::add_list_option(app, "--moe-top-k", moe.top_k,
                            "their experts per token k, a comma list", "K,...")
      ->check(dtp::cli::Range(std::int64_t{1}, std::int64_t{1024}))
      ->capture_default_str();
  dtp::cli::add_list_option(app, "--moe-coefs", moe.coefs,
                            "their load-balancing loss weights aux_loss_coef, a comma list",
                            "C,...")
      ->check(dtp::cli::Range(0.0, 100.0))
      ->capture_default_str();
  app.add_option("--moe-steps", moe_steps, "training steps before the second look at the router")
      ->check(dtp::cli::Range(std::int64_t{1}, std::int64_t{1000000}))
      ->capture_default_str();
  app.add_option("--moe-trials", moe_trials,
                 "random routings behind the uniform router's load balance")
      ->check(dtp::cli::Range(1, 1000000))
      ->capture_default_str();
  dtp::cli::add_list_option(
      app, "--train-shape", train_shape,
      "layers, d_model, heads, seq, batch of the trained GPT (default 2,128,8,256,4)", "L,C,H,T,B")
      ->expected(5)
      ->check(dtp::cli::Range(std::int64_t{1}, std::int64_t{1} << 16));
  dtp::cli::add_list_option(app, "--train-moe", train_moe,
                            "experts and top_k of its MoE variant, for ep (default 4,2)", "E,K")
      ->expected(2)
      ->check(dtp::cli::Range(std::int64_t{1}, std::int64_t{1024}));
  app.add_option("--train-steps", train_steps, "timed optimizer steps per run")
      ->check(dtp::cli::Range(std::int64_t{1}, std::int64_t{1000000}))
      ->capture_default_str();
  app.add_flag("--quick", quick,
               "a smoke test: T 256,512; n 1,2,4; no warm-up, 1 repeat; tiers at D = 2048 on n "
               "2,4; MoE 20 steps, "
               "50 trials; train 2 steps after 1, n 2,4 (flags given win)");
  app.add_option("--json", r.json_path, "append one JSON object per measurement to FILE")
      ->type_name("FILE");
  app.footer(
      "Runs on the thread backend on the CPU (DTP_BACKEND=thread, DTP_DEVICE=cpu, the defaults).");
  if (auto status = dtp::cli::parse(app, argc, argv)) return status;

  auto given = [&app](const char* flag) { return app.count(flag) > 0; };
  if (quick) {
    attention.seqs = {256, 512};
    attention.degrees = {1, 2, 4};
    attention.warmup = 0;
    attention.repeats = 1;
    tiers.dims.D = 2048;
    tiers.degrees = {2, 4};
    moe.steps = 20;
    moe.trials = 50;
    training.warmup = 1;
    training.steps = 2;
    training.repeats = 1;
  }
  if (given("--seqs")) attention.seqs = seqs;
  if (given("--degrees")) {
    attention.degrees = degrees;
    tiers.degrees.clear();
    training.degrees.clear();
    for (int n : degrees)
      if (n >= 2) tiers.degrees.push_back(n), training.degrees.push_back(n);
  }
  if (given("--methods")) {
    attention.methods.clear();
    for (const std::string& name : methods) attention.methods.push_back(sp::parse_method(name));
  }
  attention.dims.dtype = tiers.dims.dtype = training.model.config.model.dtype =
      dtp::parse_dtype(dtype);
  if (given("--warmup")) attention.warmup = warmup, training.warmup = warmup;
  if (given("--repeats")) attention.repeats = repeats, training.repeats = repeats;
  if (given("--tier-shape"))
    tiers.dims.B = tier_shape[0], tiers.dims.T = tier_shape[1], tiers.dims.H = tier_shape[2],
    tiers.dims.D = tier_shape[3];
  if (given("--moe-steps")) moe.steps = moe_steps;
  if (given("--moe-trials")) moe.trials = moe_trials;
  if (given("--train-shape")) {
    dtp::TrainConfig& c = training.model.config;
    c.model.layers = static_cast<int>(train_shape[0]),
    c.model.d_model = static_cast<int>(train_shape[1]);
    c.model.heads = static_cast<int>(train_shape[2]), c.seq = train_shape[3],
    c.batch = train_shape[4];
  }
  if (given("--train-moe"))
    training.model.experts = static_cast<int>(train_moe[0]),
    training.model.top_k = static_cast<int>(train_moe[1]);
  if (given("--train-steps")) training.steps = train_steps;
  try {
    if (attention.seqs.empty() || attention.degrees.empty() || attention.methods.empty() ||
        moe.experts.empty() || moe.top_k.empty() || moe.coefs.empty())
      throw std::invalid_argument(
          "--seqs, --degrees, --methods, --moe-experts, --moe-top-k and --moe-coefs need "
          "at least one value");
    // A (E, k) pair with k > E is skipped; a list of only such pairs would measure nothing.
    const std::int64_t most_experts = *std::max_element(moe.experts.begin(), moe.experts.end());
    const std::int64_t fewest_k = *std::min_element(moe.top_k.begin(), moe.top_k.end());
    if (r.runs("moe") && fewest_k > most_experts)
      throw std::invalid_argument(
          "every --moe-top-k is above every --moe-experts (k of E experts needs k <= E)");
    if (r.runs("train")) train_setups(training);  // a shape the strategies refuse, named now
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dtp-bench-sequence-expert: error: %s (see --help)\n", e.what());
    return 2;
  }
  return std::nullopt;
}

}  // namespace
}  // namespace dtp::bench::sequence_expert

int main(int argc, char** argv) {
  using namespace dtp::bench;
  using namespace dtp::bench::sequence_expert;
  Request request;
  if (auto status = parse_command_line(request, argc, argv)) return *status;

  const std::optional<RunContext> context = context_from_env("dtp-bench-sequence-expert");
  if (!context) return 2;
  const RunContext& ctx = *context;
  if (ctx.backend != "thread" || ctx.device != "cpu") {
    std::fprintf(
        stderr,
        "dtp-bench-sequence-expert: runs on the thread backend on the CPU; got DTP_BACKEND=%s, "
        "DTP_DEVICE=%s\n",
        ctx.backend.c_str(), ctx.device.c_str());
    return 2;
  }
  FILE* json = nullptr;
  if (!open_json("dtp-bench-sequence-expert", request.json_path, json)) return 2;
  int status = 0;
  try {
    if (request.runs("attention")) status = run_attention_part(request.attention, ctx, json);
    if (status == 0 && request.runs("tiers")) status = run_tier_part(request.tiers, ctx, json);
    if (status == 0 && request.runs("moe")) status = run_moe_part(request.moe, ctx, json);
    if (status == 0 && request.runs("train")) status = run_train_part(request.training, ctx, json);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "dtp-bench-sequence-expert: %s\n", error.what());
    status = 1;
  }
  return close_json(json, "dtp-bench-sequence-expert", status);
}
