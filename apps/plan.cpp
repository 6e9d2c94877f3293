// dtp-plan: the cluster planner of chapter 12 (drivers/12_3d_parallelism/plan.h).
//   dtp-plan --model llama3-405b --gpu h100 --nodes 1024 --tp 8 --pp 16 --global-batch 2048
//   dtp-plan --model llama3-70b --gpu h100 --nodes 64 --global-batch 1024 --search
//   dtp-plan --validate
//   dtp-plan --model llama3-70b --sweep --json plan.jsonl
// Prints memory per GPU by category, the step's time (compute, communication
// per group, bubble), tokens/s and MFU, on the runtime's alpha-beta clock.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "drivers/12_3d_parallelism/plan.h"
#include "dtp/error.h"
#include "dtp/json.h"
#include "dtp_cli.h"

namespace {

using dtp::plan::Candidate;
using dtp::plan::Plan;
using dtp::plan::PlanInput;

double gib(std::int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0); }

void print_plan(const PlanInput& input, const Plan& plan) {
  const dtp::plan::Memory& m = plan.memory;
  std::printf("%s: %.2fB parameters, seq %d\n", input.model.name.c_str(),
              static_cast<double>(input.model.parameters()) / 1e9, input.model.seq);
  std::printf("cluster: %d x %d %s (%.0f TFLOP/s peak, efficiency %.2f, %.0f GB HBM)\n",
              input.cluster.nodes, input.cluster.gpus_per_node, input.cluster.gpu.c_str(),
              input.cluster.peak_flops / 1e12, input.cluster.efficiency,
              gib(static_cast<std::int64_t>(input.cluster.hbm_bytes)));
  std::printf("layout: %s, global batch %d sequences\n\n", input.layout.text().c_str(),
              input.layout.global_batch);
  std::printf("memory per GPU (fullest stage)   GiB\n");
  std::printf("  parameters                 %8.2f\n", gib(m.params));
  std::printf("  gradients                  %8.2f\n", gib(m.grads));
  std::printf("  optimizer state            %8.2f\n", gib(m.optimizer));
  std::printf("  activations                %8.2f\n", gib(m.activations));
  std::printf("  total                      %8.2f  %s %.1f GiB HBM\n\n", gib(m.total()),
              plan.fits ? "fits in" : "DOES NOT FIT in", input.cluster.hbm_bytes / (1 << 30));
  std::printf("step time (slowest stage)      seconds   share\n");
  const double t = plan.step_seconds;
  auto row = [&](const char* name, double seconds) {
    std::printf("  %-26s %9.4f  %5.1f%%\n", name, seconds, 100 * seconds / t);
  };
  row("compute", plan.compute_seconds);
  row("tensor-parallel comm", plan.tp_seconds);
  row("pipeline sends", plan.pp_seconds);
  row("data-parallel comm", plan.dp_seconds);
  row("pipeline bubble (idle)", plan.bubble_seconds);
  row("step", t);
  std::printf("\ntokens/s %.0f (%.1f per GPU), MFU %.1f%%, HFU %.1f%%\n", plan.tokens_per_second,
              plan.tokens_per_second / input.cluster.gpus(), 100 * plan.mfu, 100 * plan.hfu);
}

std::string json_line(const PlanInput& input, const Plan& plan) {
  const dtp::plan::Layout& l = input.layout;
  return dtp::JsonLine()
      .add("what", "plan")
      .add("model", input.model.name)
      .add("gpu", input.cluster.gpu)
      .add("gpus", input.cluster.gpus())
      .add("tp", l.tp)
      .add("pp", l.pp)
      .add("dp", l.dp)
      .add("microbatch", l.microbatch)
      .add("global_batch", l.global_batch)
      .add("schedule", dtp::ch05::schedule_kind_name(l.schedule))
      .add("chunks", l.chunks)
      .add("sp", l.sequence_parallel)
      .add("recompute", dtp::plan::recompute_name(l.recompute))
      .add("zero", l.zero)
      .add("layout", l.text())
      .add("params_bytes", plan.memory.params)
      .add("grads_bytes", plan.memory.grads)
      .add("optimizer_bytes", plan.memory.optimizer)
      .add("activations_bytes", plan.memory.activations)
      .add("hbm_bytes", input.cluster.hbm_bytes)
      .add("fits", plan.fits)
      .add("step_s", plan.step_seconds)
      .add("compute_s", plan.compute_seconds)
      .add("tp_s", plan.tp_seconds)
      .add("pp_s", plan.pp_seconds)
      .add("dp_s", plan.dp_seconds)
      .add("bubble_s", plan.bubble_seconds)
      .add("tokens_per_s", plan.tokens_per_second)
      .add("mfu", plan.mfu)
      .add("hfu", plan.hfu)
      .str();
}

void print_validation(std::FILE* json) {
  const std::vector<dtp::plan::ValidationRow> rows = dtp::plan::validation_rows();
  int met = 0;
  for (const dtp::plan::ValidationRow& r : rows) {
    std::printf("%s\n  %s: %s\n  published %.4g, predicted %.4g, error %+.1f%% (goal %.0f%%): %s\n",
                r.source.c_str(), r.what.c_str(), r.setup.c_str(), r.published, r.predicted,
                100 * r.error(), 100 * r.goal, r.within_goal() ? "within goal" : "MISS");
    met += r.within_goal() ? 1 : 0;
    if (json != nullptr)
      std::fprintf(json,
                   "{\"what\":\"plan_validation\",\"source\":\"%s\",\"quantity\":\"%s\","
                   "\"setup\":\"%s\",\"published\":%.6g,\"predicted\":%.6g,\"error\":%.5f,"
                   "\"goal\":%.3f,\"within_goal\":%s}\n",
                   r.source.c_str(), r.what.c_str(), r.setup.c_str(), r.published, r.predicted,
                   r.error(), r.goal, r.within_goal() ? "true" : "false");
  }
  std::printf("\n%d of %zu rows within goal (memory 5%%, time 15%%)\n", met, rows.size());
}

// MFU and memory against GPU count for a few layouts of one model, the
// global batch fixed: what plots/plan.py draws.
void sweep(const PlanInput& base, std::FILE* json) {
  const std::vector<std::pair<int, int>> layouts = {{8, 1}, {8, 4}, {8, 8}, {4, 8}, {8, 16}};
  std::printf("%-6s %-56s %9s %8s %6s\n", "GPUs", "layout", "GiB/GPU", "MFU", "fits");
  for (int gpus = 8; gpus <= 8192; gpus *= 2) {
    for (const auto& [tp, pp] : layouts) {
      PlanInput input = base;
      input.cluster = dtp::plan::named_cluster(base.cluster.gpu, base.cluster.gpus_per_node,
                                               gpus / base.cluster.gpus_per_node);
      input.cluster.efficiency = base.cluster.efficiency;
      input.layout.tp = tp;
      input.layout.pp = pp;
      if (gpus % (tp * pp) != 0) continue;
      input.layout.dp = gpus / (tp * pp);
      try {
        input.validate();
      } catch (const dtp::Error&) {
        continue;  // this GPU count does not divide the batch for this layout
      }
      const Plan plan = dtp::plan::make_plan(input);
      std::printf("%-6d %-56s %9.1f %7.1f%% %6s\n", gpus, input.layout.text().c_str(),
                  gib(plan.memory.total()), 100 * plan.mfu, plan.fits ? "yes" : "no");
      if (json != nullptr) std::fprintf(json, "%s\n", json_line(input, plan).c_str());
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_name = "gpt2-small", gpu = "a100", schedule = "1f1b", recompute = "none";
  std::string json_path;
  int layers = 0, hidden = 0, heads = 0, kv_heads = 0, seq = 0;
  long long ffn = 0, vocab = 0;
  int gpus_per_node = 8, nodes = 1, tp = 1, pp = 1, dp = 0, microbatch = 1, global_batch = 0;
  int chunks = 1, zero = 0;
  double efficiency = 0, hbm_gb = 0, peak_tflops = 0;
  double node_bandwidth = 0, node_latency = 0, network_bandwidth = 0, network_latency = 0;
  bool sp = false, search = false, validate = false, do_sweep = false;
  CLI::App app{
      "The cluster planner (chapter 12): memory per GPU by category, step time split into "
      "compute, communication per group and pipeline bubble, tokens/s and MFU of one training "
      "step, on the runtime's alpha-beta clock with chapter 04's collectives and chapter 05's "
      "schedules.",
      "dtp-plan"};
  app.add_option("--model", model_name, "a named model (an unknown name lists them)")
      ->capture_default_str();
  app.add_option("--layers", layers, "override: transformer blocks")
      ->check(dtp::cli::Range(1, 4096));
  app.add_option("--hidden", hidden, "override: width h")->check(dtp::cli::Range(1, 1 << 20));
  app.add_option("--heads", heads, "override: attention heads")->check(dtp::cli::Range(1, 1 << 16));
  app.add_option("--kv-heads", kv_heads, "override: key/value heads")
      ->check(dtp::cli::Range(1, 1 << 16));
  app.add_option("--ffn", ffn, "override: MLP width")->check(dtp::cli::Range(1LL, 1LL << 30));
  app.add_option("--vocab", vocab, "override: vocabulary")->check(dtp::cli::Range(1LL, 1LL << 30));
  app.add_option("--seq", seq, "override: tokens per sequence")->check(dtp::cli::Range(1, 1 << 22));
  app.add_option("--gpu", gpu, "a100 or h100 (peak, HBM, link speeds, efficiency)")
      ->capture_default_str();
  app.add_option("--gpus-per-node", gpus_per_node, "GPUs sharing a node's NVLink")
      ->check(dtp::cli::Range(1, 1024))
      ->capture_default_str();
  app.add_option("--nodes", nodes, "nodes")
      ->check(dtp::cli::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--efficiency", efficiency,
                 "fraction of peak the model's FLOPs reach (default: a100 0.60, h100 0.50)")
      ->check(dtp::cli::Range(0.01, 1.0));
  app.add_option("--hbm-gib", hbm_gb, "override: GiB of memory per GPU")
      ->check(dtp::cli::Range(1.0, 1e6));
  app.add_option("--peak-tflops", peak_tflops, "override: dense bf16 TFLOP/s per GPU")
      ->check(dtp::cli::Range(1.0, 1e6));
  app.add_option("--node-bandwidth", node_bandwidth, "override: GB/s per GPU inside a node")
      ->check(dtp::cli::Range(0.001, 1e6));
  app.add_option("--node-latency", node_latency, "override: microseconds per message inside a node")
      ->check(dtp::cli::Range(0.0, 1e6));
  app.add_option("--network-bandwidth", network_bandwidth, "override: GB/s per GPU between nodes")
      ->check(dtp::cli::Range(0.001, 1e6));
  app.add_option("--network-latency", network_latency,
                 "override: microseconds per message between nodes")
      ->check(dtp::cli::Range(0.0, 1e6));
  app.add_option("--tp", tp, "tensor-parallel size")
      ->check(dtp::cli::Range(1, 1024))
      ->capture_default_str();
  app.add_option("--pp", pp, "pipeline stages")
      ->check(dtp::cli::Range(1, 4096))
      ->capture_default_str();
  app.add_option("--dp", dp, "data-parallel replicas (default: GPUs / (tp x pp))")
      ->check(dtp::cli::Range(1, 1 << 24));
  app.add_option("--microbatch", microbatch, "sequences per micro-batch")
      ->check(dtp::cli::Range(1, 1 << 16))
      ->capture_default_str();
  app.add_option("--global-batch", global_batch, "sequences per step (default: dp x microbatch)")
      ->check(dtp::cli::Range(1, 1 << 24));
  app.add_option("--schedule", schedule, "afab, 1f1b or interleaved")->capture_default_str();
  app.add_option("--chunks", chunks, "model chunks per rank (interleaved)")
      ->check(dtp::cli::Range(1, 64))
      ->capture_default_str();
  app.add_option("--recompute", recompute, "none, selective or full")->capture_default_str();
  app.add_option("--zero", zero, "0, 1 (optimizer state sharded) or 3 (FSDP)")
      ->check(dtp::cli::Range(0, 3))
      ->capture_default_str();
  app.add_flag("--sp", sp, "Megatron sequence parallelism over the TP group");
  app.add_flag("--search", search, "rank every layout that fits, best tokens/s first");
  app.add_flag("--validate", validate, "the planner against published cluster runs");
  app.add_flag("--sweep", do_sweep, "MFU and memory per GPU for 8 .. 8192 GPUs, a few layouts");
  app.add_option("--json", json_path, "also write JSON lines to FILE")->type_name("FILE");
  app.footer("The formulas: drivers/12_3d_parallelism/plan.h and chapters/12_3d_parallelism.");
  if (auto status = dtp::cli::parse(app, argc, argv)) return *status;

  std::FILE* json = nullptr;
  try {
    if (!json_path.empty()) {
      json = std::fopen(json_path.c_str(), "w");
      DTP_CHECK(json != nullptr, "cannot write --json ", json_path);
    }
    if (validate) {
      print_validation(json);
      if (json != nullptr) std::fclose(json);
      return 0;
    }
    PlanInput input;
    input.model = dtp::plan::named_model(model_name);
    if (layers > 0) input.model.layers = layers;
    if (hidden > 0) input.model.hidden = hidden;
    if (heads > 0) input.model.heads = input.model.kv_heads = heads;
    if (kv_heads > 0) input.model.kv_heads = kv_heads;
    if (ffn > 0) input.model.ffn = ffn;
    if (vocab > 0) input.model.vocab = vocab;
    if (seq > 0) {
      input.model.seq = seq;
      if (input.model.positions > 0) input.model.positions = seq;
    }
    input.cluster = dtp::plan::named_cluster(gpu, gpus_per_node, nodes);
    if (efficiency > 0) input.cluster.efficiency = efficiency;
    if (hbm_gb > 0) input.cluster.hbm_bytes = hbm_gb * (1 << 30);
    if (peak_tflops > 0) input.cluster.peak_flops = peak_tflops * 1e12;
    if (node_bandwidth > 0) input.cluster.node_beta = 1.0 / (node_bandwidth * 1e9);
    if (app.count("--node-latency") > 0) input.cluster.node_alpha = node_latency * 1e-6;
    if (network_bandwidth > 0) input.cluster.beta = 1.0 / (network_bandwidth * 1e9);
    if (app.count("--network-latency") > 0) input.cluster.alpha = network_latency * 1e-6;
    dtp::plan::Layout& l = input.layout;
    l.tp = tp;
    l.pp = pp;
    DTP_CHECK(dp > 0 || do_sweep || search || input.cluster.gpus() % (tp * pp) == 0, "plan: --tp ",
              tp, " x --pp ", pp, " does not divide the cluster's ", input.cluster.gpus(),
              " GPUs, so no --dp fills it (give --dp, or change --nodes)");
    l.dp = dp > 0 ? dp : std::max(1, input.cluster.gpus() / (tp * pp));
    l.microbatch = microbatch;
    l.global_batch = global_batch > 0 ? global_batch : l.dp * microbatch;
    l.schedule = dtp::ch05::parse_schedule_kind(schedule);
    l.chunks = chunks;
    l.recompute = dtp::plan::parse_recompute(recompute);
    l.zero = zero;
    l.sequence_parallel = sp;
    if (do_sweep) {
      sweep(input, json);
    } else if (search) {
      const std::vector<Candidate> ranked = dtp::plan::search_layouts(input);
      std::printf("%zu layouts of %s on %d %s fit; best first:\n", ranked.size(),
                  input.model.name.c_str(), input.cluster.gpus(), gpu.c_str());
      // The layout column as wide as its longest text.
      int width = 6;
      for (const Candidate& c : ranked)
        width = std::max(width, static_cast<int>(c.layout.text().size()));
      std::printf("%-*s %9s %12s %7s\n", width, "layout", "GiB/GPU", "tokens/s", "MFU");
      for (const Candidate& c : ranked) {
        std::printf("%-*s %9.1f %12.0f %6.1f%%\n", width, c.layout.text().c_str(),
                    gib(c.plan.memory.total()), c.plan.tokens_per_second, 100 * c.plan.mfu);
        PlanInput chosen = input;
        chosen.layout = c.layout;
        if (json != nullptr) std::fprintf(json, "%s\n", json_line(chosen, c.plan).c_str());
      }
    } else {
      const Plan plan = dtp::plan::make_plan(input);
      print_plan(input, plan);
      if (json != nullptr) std::fprintf(json, "%s\n", json_line(input, plan).c_str());
    }
  } catch (const dtp::Error& e) {
    std::fprintf(stderr, "dtp-plan: error: %s\n", e.what());
    if (json != nullptr) std::fclose(json);
    return 2;
  }
  if (json != nullptr) std::fclose(json);
  return 0;
}
