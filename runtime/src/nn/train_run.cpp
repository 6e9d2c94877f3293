// A whole run: its outputs (log and trace, written as it goes), the
// single-device train(), and the lines it prints.
#include "dtp/train_run.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "dtp/error.h"
#include "dtp/json.h"
#include "dtp/memory.h"
#include "dtp/trace.h"

namespace dtp {

namespace {
std::string mebibytes(std::int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(bytes) / 1048576.0);
  return buf;
}

std::string rate(double tokens_per_second) {
  char buf[32];
  if (tokens_per_second >= 1e6)
    std::snprintf(buf, sizeof buf, "%.2fM", tokens_per_second / 1e6);
  else if (tokens_per_second >= 1e3)
    std::snprintf(buf, sizeof buf, "%.1fk", tokens_per_second / 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.0f", tokens_per_second);
  return buf;
}

}  // namespace

std::string model_json(const GPTConfig& m) {
  JsonLine model;
  model.add("vocab_size", m.vocab_size)
      .add("context", m.context)
      .add("d_model", m.d_model)
      .add("heads", m.heads)
      .add("layers", m.layers)
      .add("mlp_ratio", m.mlp_ratio)
      .add("init_std", m.init_std)
      .add("layernorm_eps", m.layernorm_eps)
      .add("attention", attention_kind_name(m.attention))
      .add("experts", m.experts)
      .add("top_k", m.top_k)
      .add("capacity_factor", m.capacity_factor)
      .add("aux_loss_coef", m.aux_loss_coef)
      .add("moe_groups", m.moe_groups)
      .add("parameters", m.parameter_count());
  return model.str();
}

// The config line of the log: every setting of the run, the model's whole
// configuration, the command line and the revision.
std::string config_json(const TrainConfig& config) {
  const GPTConfig m = config.resolved_model();
  JsonLine line;
  line.add("kind", "config")
      .add("strategy", config.strategy)
      .add("steps", config.steps)
      .add("batch", config.batch)
      .add("seq", config.seq)
      .add("lr", config.lr)
      .add("optimizer", config.optimizer)
      .add("min_lr_ratio", config.min_lr_ratio)
      .add("warmup", config.warmup)
      .add("weight_decay", config.weight_decay)
      .add("beta1", config.beta1)
      .add("beta2", config.beta2)
      .add("momentum", config.momentum)
      .add("grad_clip", config.grad_clip)
      .add("seed", config.seed)
      .add("device", m.device.str())
      .add("dtype", dtype_name(m.dtype))
      .add("data", config.data_path.empty() ? "synthetic" : config.data_path)
      .raw("model", model_json(m))
      .add("command_line", config.command_line)
      .add("git", config.git_revision.empty() ? "unknown" : config.git_revision);
  return line.str();
}

std::int64_t TrainResult::loss_window() const {
  // Ten steps smooth the noise of single batches; a short run takes half its
  // steps so that "first" and "last" never share a step (one step: itself).
  const auto n = static_cast<std::int64_t>(steps.size());
  return std::max<std::int64_t>(std::min<std::int64_t>(10, n / 2), std::min<std::int64_t>(n, 1));
}

double TrainResult::first_loss() const {
  const auto n = static_cast<std::size_t>(loss_window());
  double sum = 0;
  for (std::size_t i = 0; i < n; ++i) sum += steps[i].loss;
  return n ? sum / static_cast<double>(n) : 0.0;
}

double TrainResult::last_loss() const {
  const auto n = static_cast<std::size_t>(loss_window());
  double sum = 0;
  for (std::size_t i = steps.size() - n; i < steps.size(); ++i) sum += steps[i].loss;
  return n ? sum / static_cast<double>(n) : 0.0;
}

void TrainResult::add_step(const StepRecord& record, const MemoryTracker& tracker) {
  if (peak_by_category.size() < static_cast<std::size_t>(kMemoryCategoryCount))
    peak_by_category.resize(kMemoryCategoryCount, 0);
  for (int c = 0; c < kMemoryCategoryCount; ++c)
    peak_by_category[c] =
        std::max(peak_by_category[c], tracker.peak(static_cast<MemoryCategory>(c)));
  peak_bytes = std::max(peak_bytes, record.peak_bytes);
  steps.push_back(record);
}

namespace {

// One device: Trainer steps, from a checkpoint when asked, saved at the end.
TrainResult train_one_device(const TrainConfig& config, const StepCallback& on_step) {
  const auto start = std::chrono::steady_clock::now();
  Trainer trainer(config);
  const std::int64_t last = start_from_checkpoints(trainer);
  TrainResult result;
  result.parameters = trainer.model().parameter_count();
  result.data_name = trainer.sampler().data().name();
  result.peak_by_category.assign(kMemoryCategoryCount, 0);
  std::shared_ptr<MemoryTracker> tracker = current_memory_tracker();
  while (trainer.steps_done() < last) {
    StepRecord record = trainer.step();
    result.add_step(record, *tracker);
    if (on_step) on_step(record);
  }
  if (!config.save_path.empty()) trainer.save(config.save_path);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace

TrainResult train(const TrainConfig& config, const StepCallback& on_step) {
  DTP_CHECK(config.resume_path.empty() || config.load_path.empty(),
            "train: --resume continues a run (its "
            "parameters and optimizer state) and --load starts a new one from saved parameters; "
            "give one, not both");
  return train_with_outputs(
      config, [&config](const StepCallback& logged) { return train_one_device(config, logged); },
      on_step);
}

TrainResult train_with_outputs(const TrainConfig& config, const RunBody& body,
                               const StepCallback& on_step) {
  // Both outputs are opened before the first step: a bad path fails at once,
  // not after the run.
  std::unique_ptr<JsonLinesWriter> log;
  if (!config.json_path.empty()) {
    log = std::make_unique<JsonLinesWriter>(config.json_path);
    log->write(config_json(config));
  }
  std::unique_ptr<trace::ChromeTraceFile> trace_file;
  // Streams the spans recorded since the last call (every rank's, on the
  // thread backend; this process's under mpiexec) and drops them from memory.
  auto write_new_spans = [&] {
    if (trace_file) trace_file->append(trace::take_spans());
  };
  if (!config.trace_path.empty()) {
    trace_file = std::make_unique<trace::ChromeTraceFile>(config.trace_path);
    trace::enable();
  }
  std::int64_t steps_logged = 0;
  StepCallback callback = [&](const StepRecord& record) {
    if (log) log->write(step_json(record));
    ++steps_logged;
    write_new_spans();
    if (on_step) on_step(record);
  };
  TrainResult result;
  try {
    result = body(callback);
  } catch (const std::exception& e) {
    // Keep what the run recorded up to the failure: the spans and a last
    // log line that says why it stopped. Errors here must not hide the first.
    trace::disable();
    try {
      write_new_spans();
      if (trace_file) trace_file->finish();
    } catch (const std::exception&) {
    }
    try {
      if (log)
        log->write(JsonLine()
                       .add("kind", "failed")
                       .add("steps", steps_logged)
                       .add("error", e.what())
                       .str());
    } catch (const std::exception&) {
    }
    throw;
  }
  if (trace_file) {
    trace::disable();
    write_new_spans();
    trace_file->finish();
  }
  if (log) {
    log->write(JsonLine()
                   .add("kind", "summary")
                   .add("steps", static_cast<std::int64_t>(result.steps.size()))
                   .add("seconds", result.seconds)
                   .add("parameters", result.parameters)
                   .add("loss_window", result.loss_window())
                   .add("first_loss", result.first_loss())
                   .add("last_loss", result.last_loss())
                   .add("peak_bytes", result.peak_bytes)
                   .str());
  }
  return result;
}

// --- formats --------------------------------------------------------------------------------

std::string format_step(const StepRecord& r, std::int64_t total_steps) {
  const int width = static_cast<int>(std::to_string(total_steps).size());
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "step %*lld/%lld  loss %.4f  lr %.2e  grad norm %6.3f  %7s tok/s  peak %s  %.1f ms",
                width, static_cast<long long>(r.step), static_cast<long long>(total_steps), r.loss,
                r.lr, r.grad_norm, rate(r.tokens_per_second).c_str(),
                mebibytes(r.peak_bytes).c_str(), r.seconds * 1e3);
  std::string line = buf;
  if (r.loss_scale > 0) {
    std::snprintf(buf, sizeof buf, "  scale %g", r.loss_scale);
    line += buf;
  }
  if (r.skipped) line += "  SKIPPED (non-finite gradient)";
  return line;
}

std::string format_summary(const TrainResult& result) {
  std::int64_t tokens = 0;
  double step_seconds = 0;
  for (const StepRecord& r : result.steps) {
    tokens += r.tokens;
    step_seconds += r.seconds;
  }
  // Name the averaged steps by their numbers, which a resumed run starts
  // past 1: "mean of steps 1-10 -> 291-300".
  const std::int64_t n = static_cast<std::int64_t>(result.steps.size());
  const std::int64_t w = result.loss_window();
  const long long first = n > 0 ? static_cast<long long>(result.steps.front().step) : 1;
  const long long last = first + n - 1;
  char window[96];
  if (n <= 1)
    std::snprintf(window, sizeof window, "(one step)");
  else if (w == 1)
    std::snprintf(window, sizeof window, "(step %lld -> step %lld)", first, last);
  else
    std::snprintf(window, sizeof window, "(mean of steps %lld-%lld -> %lld-%lld)", first,
                  first + w - 1, last - w + 1, last);
  char buf[512];
  std::snprintf(buf, sizeof buf, "trained %zu steps in %.1f s (%s tok/s); loss %.4f -> %.4f %s\n",
                result.steps.size(), result.seconds,
                rate(step_seconds > 0 ? static_cast<double>(tokens) / step_seconds : 0).c_str(),
                result.first_loss(), result.last_loss(), window);
  std::string out = buf;
  std::int64_t skipped = 0;
  for (const StepRecord& r : result.steps) skipped += r.skipped ? 1 : 0;
  if (skipped > 0)
    out += std::to_string(skipped) + " of " + std::to_string(n) +
           " steps skipped (a non-finite gradient; the loss scale was lowered)\n";
  out += "peak memory " + mebibytes(result.peak_bytes) + ":";
  for (int c = 0; c < static_cast<int>(result.peak_by_category.size()); ++c) {
    if (result.peak_by_category[c] == 0) continue;
    out += std::string(" ") + memory_category_name(static_cast<MemoryCategory>(c)) + " " +
           mebibytes(result.peak_by_category[c]) + ",";
  }
  if (out.back() == ',') out.pop_back();
  if (n >= 2) {
    // The first step maps every buffer for the first time; the rest should not fault.
    std::int64_t later = 0;
    for (std::int64_t i = 1; i < n; ++i)
      later += result.steps[static_cast<std::size_t>(i)].page_faults;
    std::snprintf(buf, sizeof buf, "\npage faults: %lld in step 1, then %.1f per step",
                  static_cast<long long>(result.steps[0].page_faults),
                  static_cast<double>(later) / static_cast<double>(n - 1));
    out += buf;
  }
  return out;
}

std::string step_json(const StepRecord& r) {
  JsonLine line;
  line.add("kind", "step")
      .add("step", r.step)
      .add("loss", r.loss)
      .add("lr", r.lr)
      .add("grad_norm", r.grad_norm)
      .add("seconds", r.seconds)
      .add("tokens", r.tokens)
      .add("tokens_per_s", r.tokens_per_second)
      .add("peak_bytes", r.peak_bytes)
      .add("peak_activation_bytes", r.peak_activation_bytes)
      .add("page_faults", r.page_faults);
  if (r.loss_scale > 0) line.add("loss_scale", r.loss_scale);
  if (r.skipped) line.add("skipped", true);
  return line.str();
}

JsonLinesWriter::JsonLinesWriter(const std::string& path) : out_(path), path_(path) {
  DTP_CHECK(out_.good(), "cannot write the JSON log '", path, "'");
}

void JsonLinesWriter::write(const std::string& json_object) {
  out_ << json_object << '\n';
  out_.flush();
  DTP_CHECK(out_.good(), "error writing the JSON log '", path_, "'");
}

}  // namespace dtp
