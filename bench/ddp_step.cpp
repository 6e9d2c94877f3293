// dtp-bench-ddp-step: the step time of data-parallel training on this machine.
//   dtp-bench-ddp-step [--world 4] [--steps 20] [--device cpu|cuda[:k]] [--json FILE]
// Compares, for one small model and the same per-rank batch:
//   single x N   N times the single-rank step (the compute-only bound when N
//                ranks share the CPU cores: N ranks must do N times the work)
//   naive        2.1, one all-reduce per parameter
//   flat         2.2, one all-reduce per unit
//   bucketed     2.3, buckets overlapped with backward
// Prints a table and writes one JSON object per measurement. Times are the
// median of the steps after two warm-up steps, of rank 0. With --device cuda
// every rank (a thread) works on the one GPU: N ranks against N times the
// single-rank step shows what sharing the GPU and synchronizing cost.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <vector>

#include "02_ddp/ddp.h"
#include "bench_common.h"
#include "drivers/02_ddp/ddp_strategy.h"
#include "dtp/device.h"
#include "dtp/error.h"
#include "dtp/train_run.h"
#include "dtp/trainer.h"
#include "dtp_cli.h"

namespace {

using dtp::bench::close_json;
using dtp::bench::context_from_env;
using dtp::bench::git_revision;
using dtp::bench::open_json;
using dtp::bench::RunContext;

// Runs the four configurations and prints (and appends to @p json) the table.
void measure(int world, std::int64_t steps, dtp::Device device, FILE* json);

double median_step_seconds(const dtp::TrainResult& result) {
  std::vector<double> t;
  for (std::size_t i = 2; i < result.steps.size(); ++i) t.push_back(result.steps[i].seconds);
  std::sort(t.begin(), t.end());
  return t.empty() ? 0 : t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int world = 4;
  std::int64_t steps = 20;
  std::string json_path;
  dtp::Device device = dtp::Device::cpu();
  CLI::App app{
      "The step time of data-parallel training (chapter 02): naive, flat and bucketed DDP against "
      "N "
      "times the single-rank step, for one small model and the same per-rank batch.",
      "dtp-bench-ddp-step"};
  app.add_option("--world", world, "data-parallel ranks (threads)")
      ->check(dtp::cli::Range(1, 1024))
      ->capture_default_str();
  app.add_option("--steps", steps, "steps per run; the median of those after two warm-up steps")
      ->check(dtp::cli::Range(std::int64_t{3}, std::int64_t{1000000}))
      ->capture_default_str();
  dtp::cli::add_device_option(app, device);
  app.add_option("--json", json_path, "append one JSON object per measurement to FILE");
  if (auto status = dtp::cli::parse(app, argc, argv)) return *status;
  if (device.is_cuda() && dtp::cuda_device_count() == 0) {
    std::fprintf(stderr, "dtp-bench-ddp-step: --device %s: no usable CUDA device here\n",
                 device.str().c_str());
    return 2;
  }
  const std::optional<RunContext> context = context_from_env("dtp-bench-ddp-step");
  if (!context) return 2;
  // Opened before minutes of measuring, so that a path that cannot be written is said at once.
  FILE* json = nullptr;
  if (!open_json("dtp-bench-ddp-step", json_path, json)) return 2;
  try {
    measure(world, steps, device, json);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dtp-bench-ddp-step: error: %s\n", e.what());
    close_json(json, "dtp-bench-ddp-step", 1);
    return 1;
  }
  return close_json(json, "dtp-bench-ddp-step", 0);
}

namespace {

void measure(int world, std::int64_t steps, dtp::Device device, FILE* json) {
  const std::int64_t per_rank_batch = 4;
  dtp::TrainConfig config;
  config.model.d_model = 64;
  config.model.heads = 4;
  config.model.layers = 4;
  config.seq = 64;
  config.steps = steps;
  config.synthetic.length = 1 << 16;
  config.model.device = device;

  struct Row {
    std::string what;
    double seconds;
    std::int64_t all_reduces;
    std::int64_t bytes;
    double exposed;
  };
  std::vector<Row> rows;

  dtp::TrainConfig single = config;
  single.batch = per_rank_batch;
  const double single_s = median_step_seconds(dtp::train(single));
  rows.push_back({"single x " + std::to_string(world), single_s * world, 0, 0, 0});

  const std::int64_t bucket_bytes = 256 * 1024;
  for (auto mode :
       {dtp::ch02::DdpMode::naive, dtp::ch02::DdpMode::flat, dtp::ch02::DdpMode::bucketed}) {
    dtp::ch02::DdpOptions options;
    options.world = world;
    options.mode = mode;
    options.bucket_bytes = bucket_bytes;
    std::vector<double> exposed;
    std::int64_t calls = 0, bytes = 0;
    dtp::TrainConfig ddp = config;
    ddp.batch = per_rank_batch * world;
    const double s = median_step_seconds(dtp::drivers::run_strategy(
        ddp, dtp::ch02::DdpStrategy(options), [&](const dtp::drivers::StepReport& report) {
          if (report.record.step <= 2) return;
          exposed.push_back(report.ranks.at(0, "exposed"));
          calls = static_cast<std::int64_t>(report.ranks.at(0, "all-reduces"));
          bytes = static_cast<std::int64_t>(report.ranks.at(0, "all-reduced"));
        }));
    std::sort(exposed.begin(), exposed.end());
    const char* names[] = {"naive", "flat", "bucketed"};
    rows.push_back({names[static_cast<int>(mode)], s, calls, bytes,
                    exposed.empty() ? 0 : exposed[exposed.size() / 2]});
  }

  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  const std::string rev = git_revision();
  std::printf("# ddp step, thread backend on %s, %d ranks, %lld sequences x %lld tokens per rank\n",
              device.str().c_str(), world, static_cast<long long>(per_rank_batch),
              static_cast<long long>(config.seq));
  std::printf(
      "# model: d_model %d, %d layers, %d heads (%s), bucket %lld KiB, median of %lld steps\n",
      config.model.d_model, config.model.layers, config.model.heads, "f32",
      static_cast<long long>(bucket_bytes / 1024), static_cast<long long>(steps - 2));
  std::printf("%-12s %12s %12s %14s %18s %10s\n", "what", "step ms", "all-reduces", "bytes/rank",
              "exposed comm ms", "vs bound");
  for (const Row& r : rows) {
    std::printf("%-12s %12.2f %12lld %14lld %18.2f %9.2fx\n", r.what.c_str(), r.seconds * 1e3,
                static_cast<long long>(r.all_reduces), static_cast<long long>(r.bytes),
                r.exposed * 1e3, r.seconds / rows[0].seconds);
    if (json)
      std::fprintf(
          json,
          "{\"what\":\"ddp_step\",\"variant\":\"%s\",\"backend\":\"thread\",\"device\":\"%s\","
          "\"world\":%d,\"per_rank_batch\":%lld,\"seq\":%lld,\"d_model\":%d,\"layers\":%d,"
          "\"bucket_bytes\":%lld,\"step_s\":%.6g,\"all_reduces\":%lld,\"bytes\":%lld,"
          "\"exposed_comm_s\":%.6g,\"vs_compute_bound\":%.4f,\"date\":\"%s\",\"git\":\"%s\"}\n",
          r.what.c_str(), device.str().c_str(), world, static_cast<long long>(per_rank_batch),
          static_cast<long long>(config.seq), config.model.d_model, config.model.layers,
          static_cast<long long>(bucket_bytes), r.seconds, static_cast<long long>(r.all_reduces),
          static_cast<long long>(r.bytes), r.exposed, r.seconds / rows[0].seconds, date,
          rev.c_str());
  }
}

}  // namespace
