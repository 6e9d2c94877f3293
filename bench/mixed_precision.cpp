// dtp-bench-mixed-precision: the default `dtp train` model trained in fp32,
// bf16 and fp16 (f32 master weights, fp16 with the dynamic loss scale) from
// the same seed in one run; prints the loss at a few steps, the final loss
// and tokens/s of each precision against fp32's, and writes a JSON line per
// step (loss, loss scale, skipped). It also records, at a few steps of the
// fp32 run, how many gradient elements have each binary exponent
// (floor(log2 |g|)): where f16 would flush them to zero. On the CPU the
// 16-bit runs compute in f32 and round every stored value, so their speed
// here is the cost of that rounding, not a GPU's speed-up.
//   dtp-bench-mixed-precision [--steps 300] [--batch 16] [--seq 64]
//                             [--histogram-steps 1,50,300] [--json FILE]
//                             [--layers 2] [--d-model 64] [--heads 4] [--optimizer adamw|sgd]
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "07_mixed_precision/mixed_precision.h"
#include "bench_common.h"
#include "bench_flags.h"
#include "drivers/07_mixed_precision/mixed_strategy.h"
#include "dtp/error.h"
#include "dtp/memory.h"
#include "dtp/train_run.h"
#include "dtp/trainer.h"
#include "dtp_cli.h"

namespace {

using namespace dtp;
using namespace dtp::bench;

// Exponent -> count over every gradient element of @p model (zeros apart).
std::map<int, std::int64_t> exponent_counts(GPT& model, std::int64_t& zeros) {
  std::map<int, std::int64_t> counts;
  zeros = 0;
  for (Unit* unit : model.units()) {
    const std::vector<double> g = unit->grads().to_vector();
    for (double v : g) {
      if (v == 0) {
        ++zeros;
        continue;
      }
      ++counts[std::ilogb(v)];
    }
  }
  return counts;
}

}  // namespace

int main(int argc, char** argv) {
  TrainConfig config;
  std::string json_path;
  std::vector<std::int64_t> histogram_list = {1, 50, 300};
  CLI::App app{
      "The default `dtp train` model trained in fp32, bf16 and fp16 (f32 master weights; fp16 with "
      "the "
      "dynamic loss scale) from the same seed in one run: the loss at a few steps, the final loss "
      "and "
      "tokens/s of each precision against fp32's, and a JSON line per step (loss, loss scale, "
      "skipped). "
      "At --histogram-steps of the fp32 run it also records how many gradient elements have each "
      "binary "
      "exponent floor(log2 |g|): where f16 would flush them to zero.",
      "dtp-bench-mixed-precision"};
  app.add_option("--steps", config.steps, "optimizer steps of each run")
      ->check(dtp::cli::Range(std::int64_t{1}, std::int64_t{1000000}))
      ->capture_default_str();
  app.add_option("--batch", config.batch, "sequences per step")
      ->check(dtp::cli::Range(std::int64_t{1}, std::int64_t{1} << 20))
      ->capture_default_str();
  app.add_option("--seq", config.seq, "tokens per sequence")
      ->check(dtp::cli::Range(std::int64_t{1}, std::int64_t{1} << 16))
      ->capture_default_str();
  dtp::cli::add_list_option(app, "--histogram-steps", histogram_list,
                            "the fp32 run's steps whose gradient exponents are recorded",
                            "STEP,...")
      ->check(dtp::cli::Range(std::int64_t{1}, std::int64_t{1000000}))
      ->capture_default_str();
  dtp::bench::add_shape_options(app, config.model);
  app.add_option("--optimizer", config.optimizer, "the optimizer")
      ->check(CLI::IsMember({"adamw", "sgd"}))
      ->capture_default_str();
  app.add_option("--json", json_path, "append one JSON object per step (and per histogram) to FILE")
      ->type_name("FILE");
  app.footer(
      "On the CPU the 16-bit runs compute in f32 and round every stored value, so their speed here "
      "is the "
      "cost of that rounding, not a GPU's speed-up.");
  if (auto status = dtp::cli::parse(app, argc, argv)) return *status;
  const std::set<std::int64_t> histogram_steps(histogram_list.begin(), histogram_list.end());
  if (app.count("--histogram-steps") > 0 && !histogram_steps.empty() &&
      *histogram_steps.rbegin() > config.steps) {
    std::fprintf(stderr,
                 "dtp-bench-mixed-precision: error: --histogram-steps %lld is past --steps %lld "
                 "(see --help)\n",
                 static_cast<long long>(*histogram_steps.rbegin()),
                 static_cast<long long>(config.steps));
    return 2;
  }
  try {
    FILE* json = nullptr;
    if (!open_json("dtp-bench-mixed-precision", json_path, json)) return 2;
    const RunContext context = make_context();
    auto base_line = [&](const char* kind, const char* precision) {
      JsonLine line;
      line.add("bench", "mixed_precision").add("kind", kind).add("precision", precision);
      line.add("d_model", config.model.d_model)
          .add("layers", config.model.layers)
          .add("batch", config.batch)
          .add("seq", config.seq)
          .add("steps", config.steps);
      return line;
    };

    const ch07::MixedPrecisionStrategy mixed;
    struct Run {
      const char* name;
      DType dtype;
      TrainResult result;
    };
    std::vector<Run> runs = {
        {"fp32", DType::f32, {}}, {"bf16", DType::bf16, {}}, {"fp16", DType::f16, {}}};
    for (Run& run : runs) {
      TrainConfig c = config;
      c.model.dtype = run.dtype;
      c.strategy = run.dtype == DType::f32 ? "single" : "mixed";
      if (run.dtype == DType::f32) {
        // The fp32 run, step by step, to look at its gradients.
        Trainer trainer(c);
        std::int64_t step = 0;
        trainer.on_after_backward([&] {
          ++step;
          if (!histogram_steps.count(step)) return;
          std::int64_t zeros = 0;
          const std::map<int, std::int64_t> counts = exponent_counts(trainer.model(), zeros);
          JsonLine line = base_line("grad_exponents", run.name);
          line.add("step", step).add("zeros", zeros);
          std::vector<std::int64_t> exponents, numbers;
          for (const auto& [e, n] : counts) {
            exponents.push_back(e);
            numbers.push_back(n);
          }
          line.add("exponents", exponents).add("counts", numbers);
          write_line(json, add_context(line, context));
        });
        const auto start = std::chrono::steady_clock::now();
        for (std::int64_t s = 0; s < c.steps; ++s)
          run.result.add_step(trainer.step(), *current_memory_tracker());
        run.result.seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      } else {
        run.result = drivers::run_strategy(c, mixed);
      }
      for (const StepRecord& r : run.result.steps) {
        JsonLine line = base_line("step", run.name);
        line.add("step", r.step)
            .add("loss", r.loss)
            .add("loss_scale", r.loss_scale)
            .add("skipped", r.skipped)
            .add("seconds", r.seconds)
            .add("tokens", r.tokens);
        write_line(json, add_context(line, context));
      }
    }

    auto tokens_per_second = [](const TrainResult& r) {
      double tokens = 0, seconds = 0;
      for (const StepRecord& s : r.steps) {
        tokens += static_cast<double>(s.tokens);
        seconds += s.seconds;
      }
      return seconds > 0 ? tokens / seconds : 0.0;
    };
    std::printf(
        "mixed precision: d_model %d, %d layers, batch %lld x %lld tokens, %lld steps (%s, %d "
        "cores)\n",
        config.model.d_model, config.model.layers, static_cast<long long>(config.batch),
        static_cast<long long>(config.seq), static_cast<long long>(config.steps),
        context.device.c_str(), context.cores);
    std::printf("%-9s %12s %12s %12s %10s %12s %10s\n", "precision", "loss first", "loss last",
                "vs fp32", "skipped", "tokens/s", "vs fp32");
    const double f32_last = runs[0].result.last_loss(),
                 f32_rate = tokens_per_second(runs[0].result);
    for (const Run& run : runs) {
      std::int64_t skipped = 0;
      for (const StepRecord& r : run.result.steps) skipped += r.skipped ? 1 : 0;
      const double rate = tokens_per_second(run.result);
      std::printf("%-9s %12.4f %12.4f %+11.2f%% %10lld %12.0f %9.2fx\n", run.name,
                  run.result.first_loss(), run.result.last_loss(),
                  100 * (run.result.last_loss() / f32_last - 1), static_cast<long long>(skipped),
                  rate, rate / f32_rate);
    }
    return close_json(json, "dtp-bench-mixed-precision", 0);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dtp-bench-mixed-precision: %s\n", e.what());
    return 1;
  }
}
