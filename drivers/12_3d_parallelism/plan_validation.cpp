// The planner against published cluster runs. Every row uses the GPU's
// default efficiency (default_efficiency): nothing here is fitted per row.
#include <cmath>
#include <cstdio>
#include <string>

#include "drivers/12_3d_parallelism/plan.h"

namespace dtp::plan {

namespace {

PlanInput published_run(const std::string& model, const std::string& gpu, int gpus, int tp, int pp,
                        int microbatch, int global_batch) {
  PlanInput input;
  input.model = named_model(model);
  input.cluster = named_cluster(gpu, 8, gpus / 8);
  input.layout.tp = tp;
  input.layout.pp = pp;
  input.layout.dp = gpus / (tp * pp);
  input.layout.microbatch = microbatch;
  input.layout.global_batch = global_batch;
  return input;
}

std::string setup_text(const PlanInput& input) {
  return input.model.name + " on " + std::to_string(input.cluster.gpus()) + " " +
         input.cluster.gpu + ", " + input.layout.text();
}

// Megatron-LM (Narayanan et al., SC21): TFLOP/s per GPU as their eq. 3
// counts it, the recomputed forward included; full recomputation, no
// sequence parallelism, A100 80 GB, micro-batch 1.
ValidationRow megatron_row(const std::string& source, const std::string& model, int gpus, int tp,
                           int pp, int batch, double tflops) {
  PlanInput input = published_run(model, "a100", gpus, tp, pp, 1, batch);
  input.layout.recompute = Recompute::full;
  const Plan plan = make_plan(input);
  return {source, "TFLOP/s per GPU", setup_text(input), tflops, plan.hfu * 312.0, 0.15};
}

std::string billions(std::int64_t count) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2fB", static_cast<double>(count) / 1e9);
  return text;
}

// The state a model's training holds at 16 bytes per parameter, on one GPU.
ValidationRow playbook_state_row(const std::string& model, double published_gb) {
  PlanInput input = published_run(model, "h100", 8, 1, 1, 1, 8);
  input.cluster = named_cluster("h100", 1, 1);
  input.layout.dp = 1;
  const Memory memory = stage_memory(input, 0);
  const double state = static_cast<double>(memory.params + memory.grads + memory.optimizer);
  return {"Ultra-Scale Playbook (2025), memory: 16 bytes per parameter",
          "GB of parameters, gradients and AdamW state",
          input.model.name + " (" + billions(input.model.parameters()) + " parameters)",
          published_gb,
          state / 1e9,
          0.05};
}

}  // namespace

bool ValidationRow::within_goal() const { return std::abs(error()) <= goal; }

std::vector<ValidationRow> validation_rows() {
  std::vector<ValidationRow> rows;
  const std::string table1 = "Megatron-LM SC21 (arXiv 2104.04473) Table 1";
  rows.push_back(megatron_row(table1, "megatron-1.7b", 32, 1, 1, 512, 137));
  rows.push_back(megatron_row(table1, "megatron-3.6b", 64, 2, 1, 512, 138));
  rows.push_back(megatron_row(table1, "megatron-7.5b", 128, 4, 1, 512, 142));
  rows.push_back(megatron_row(table1, "megatron-18.4b", 256, 8, 1, 1024, 135));
  rows.push_back(megatron_row(table1, "megatron-39.1b", 512, 8, 2, 1536, 138));
  rows.push_back(megatron_row(table1, "megatron-76.1b", 1024, 8, 4, 1792, 140));
  rows.push_back(megatron_row(table1, "megatron-145.6b", 1536, 8, 8, 2304, 148));
  rows.push_back(megatron_row(table1, "megatron-310.1b", 1920, 8, 16, 2160, 155));
  rows.push_back(megatron_row(table1, "megatron-529.6b", 2520, 8, 35, 2520, 163));
  rows.push_back(megatron_row(table1, "megatron-1t", 3072, 8, 64, 3072, 163));
  const std::string table2 = "Megatron-LM SC21 (arXiv 2104.04473) Table 2, PTD-P";
  rows.push_back(megatron_row(table2, "gpt3-175b", 384, 8, 12, 1536, 153));
  rows.push_back(megatron_row(table2, "gpt3-175b", 768, 8, 12, 1536, 149));
  rows.push_back(megatron_row(table2, "gpt3-175b", 1536, 8, 12, 1536, 141));

  // Llama 3 (arXiv 2407.21783) Table 4: 405B, seq 8192, 16M tokens per
  // step, TP 8 with sequence parallelism, PP 16 interleaved (2 chunks
  // assumed), parameters kept gathered between micro-batches (ZeRO-1),
  // flash attention (the scores are recomputed in the backward, never
  // kept: selective recomputation).
  for (const auto& [gpus, mfu] : {std::pair{8192, 0.43}, std::pair{16384, 0.41}}) {
    PlanInput input = published_run("llama3-405b", "h100", gpus, 8, 16, 1, 2048);
    input.layout.sequence_parallel = true;
    input.layout.schedule = ch05::ScheduleKind::interleaved;
    input.layout.chunks = 2;
    input.layout.zero = 1;
    input.layout.recompute = Recompute::selective;
    const Plan plan = make_plan(input);
    rows.push_back(
        {"Llama 3 (arXiv 2407.21783) Table 4", "MFU", setup_text(input), mfu, plan.mfu, 0.15});
  }

  // torchtitan benchmarks/llama3_h100_202412_torchtitan.md: Llama 3.1 8B on
  // 8 H100, FSDP, local batch 2, seq 8192, selective activation
  // checkpointing, no torch.compile.
  {
    PlanInput input = published_run("llama3-8b", "h100", 8, 1, 1, 2, 16);
    input.layout.zero = 3;
    input.layout.recompute = Recompute::selective;
    const Plan plan = make_plan(input);
    const std::string source = "torchtitan llama3_h100_202412 (Llama 3.1 8B, FSDP, eager)";
    rows.push_back(
        {source, "tokens/s per GPU", setup_text(input), 5762, plan.tokens_per_second / 8, 0.15});
    rows.push_back({"torchtitan llama3_h100_202412 (the same, with torch.compile)",
                    "tokens/s per GPU", setup_text(input), 6667, plan.tokens_per_second / 8, 0.15});
    rows.push_back({source, "GiB peak memory per GPU", setup_text(input), 82.4,
                    static_cast<double>(plan.memory.total()) / (1024.0 * 1024.0 * 1024.0), 0.05});
  }

  rows.push_back(playbook_state_row("llama2-7b", 112));
  rows.push_back(playbook_state_row("llama3-70b", 1120));
  rows.push_back(playbook_state_row("llama3-405b", 6480));
  return rows;
}

}  // namespace dtp::plan
