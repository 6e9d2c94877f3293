/// @file train_run.h
/// @brief A whole training run: its result, its outputs (the JSON-lines log
/// and the Chrome trace, written as it goes) and the single-device train()
/// behind `dtp train`; the progress line and the summary it prints.
#pragma once

#include <cstdint>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "dtp/memory.h"
#include "dtp/trainer.h"

namespace dtp {

/// A finished run.
struct TrainResult {
  std::vector<StepRecord> steps;  ///< one per step
  double seconds = 0;             ///< wall time, setup included
  std::int64_t parameters = 0;    ///< model size
  std::string data_name;          ///< what it trained on
  /// Peak bytes per MemoryCategory over the run (index = category).
  std::vector<std::int64_t> peak_by_category;
  std::int64_t peak_bytes = 0;  ///< highest tracked memory of any step
  /// Appends @p record and folds the tracker's peaks into the run's peaks.
  void add_step(const StepRecord& record, const MemoryTracker& tracker);
  /// Steps averaged by first_loss() and last_loss(): 10, or half of a
  /// shorter run (so the two never overlap), or 1 for a one-step run.
  std::int64_t loss_window() const;
  /// Mean loss of the first loss_window() steps.
  double first_loss() const;
  /// Mean loss of the last loss_window() steps.
  double last_loss() const;
};

/// Called after every step with its record.
using StepCallback = std::function<void(const StepRecord&)>;
/// A run's training: calls its StepCallback after every step, returns the result.
using RunBody = std::function<TrainResult(const StepCallback&)>;

/// Runs @p body with the run's outputs around it: config.json_path's log
/// (the config line, a line per step, the summary) and config.trace_path's
/// Chrome trace. Both are opened before the first step (a bad path fails at
/// once) and written as the run goes; a run that fails still leaves its
/// spans and a {"kind":"failed"} log line naming the error, which is then
/// rethrown. @p on_step is called after each logged step.
TrainResult train_with_outputs(const TrainConfig& config, const RunBody& body,
                               const StepCallback& on_step = {});

/// Trains on one device: Trainer steps from config.load_path or
/// config.resume_path to config.stop_after (or config.steps), saves
/// config.save_path, with train_with_outputs()'s outputs.
TrainResult train(const TrainConfig& config, const StepCallback& on_step = {});

/// The run's settings as the log's config line writes them (a JSON object).
std::string config_json(const TrainConfig& config);
/// The model's settings as the config line's "model" object writes them.
std::string model_json(const GPTConfig& model);

/// One progress line: "step   10/200  loss 3.2145  lr 1.50e-03  ...".
std::string format_step(const StepRecord& record, std::int64_t total_steps);
/// The closing summary: time, throughput, loss before and after, memory.
std::string format_summary(const TrainResult& result);
/// {"kind":"step","step":10,"loss":...} (one line, no newline).
std::string step_json(const StepRecord& record);

/// Writes one JSON object per line; flushes each line.
class JsonLinesWriter {
 public:
  /// Throws dtp::Error naming @p path when it cannot be opened.
  explicit JsonLinesWriter(const std::string& path);
  /// Writes @p json_object and a newline.
  void write(const std::string& json_object);

 private:
  std::ofstream out_;
  std::string path_;
};

}  // namespace dtp
