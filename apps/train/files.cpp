// The run's files, checked before it starts: inputs readable, outputs
// writable, and no file both read and written or written twice.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "train/options.h"

namespace dtp::train_app {
namespace {

// Creates (or keeps) @p path to learn now, not after the run, that it cannot
// be written. Appending leaves an existing file as it is until the run.
void check_writable(const std::string& flag, const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "a");
  if (file == nullptr)
    throw UsageError(flag + ": cannot write '" + path + "': " + std::strerror(errno));
  std::fclose(file);
}

// --save must not create FILE before the run (a failed run would leave an
// empty "checkpoint"): check that its folder takes new files instead.
void check_save_path(const std::string& flag, const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  if (fs::is_directory(target))
    throw UsageError(flag + " expects a file path, got the directory '" + path + "'");
  const fs::path folder = target.has_parent_path() ? target.parent_path() : fs::path(".");
  if (!fs::is_directory(folder))
    throw UsageError(flag + ": the folder '" + folder.string() + "' of '" + path +
                     "' does not exist");
  if (::access(folder.c_str(), W_OK) != 0)
    throw UsageError(flag + ": cannot write in '" + folder.string() + "': " + std::strerror(errno));
  // The save writes FILE.tmp first: a folder there would fail it after the run.
  const std::string temporary = path + ".tmp";
  std::error_code error;
  if (fs::exists(temporary, error) && !fs::is_regular_file(temporary, error))
    throw UsageError(flag + " '" + path + "' is written through '" + temporary +
                     "', which exists and is not a file: remove it or save elsewhere");
}

// Two flags name one file when their paths lead to the same place: "t.json"
// and "./t.json", a link and its target, or two hard links.
bool same_file(const std::string& a, const std::string& b) {
  namespace fs = std::filesystem;
  std::error_code error;
  if (fs::exists(a, error) && fs::exists(b, error)) return fs::equivalent(a, b, error);
  const fs::path x = fs::weakly_canonical(fs::absolute(a, error), error);
  const fs::path y = fs::weakly_canonical(fs::absolute(b, error), error);
  return x == y;
}

// No file is both read and written, and no two outputs share a file: the
// run would overwrite its data or checkpoint, or one output the other.
// --save writes FILE.tmp and renames it over FILE at the end, so --save may
// name the --resume or --load file (read first, replaced whole), but its
// FILE.tmp may name nothing else.
void check_files_apart(const Options& o) {
  const TrainConfig& c = o.config;
  struct File {
    std::string flag, path;
    bool output;
    bool saved = false;  // written to FILE.tmp, then renamed over FILE
  };
  std::vector<File> files;
  auto add = [&files](const std::string& flag, const std::string& path, bool output,
                      bool saved = false) {
    if (!path.empty()) files.push_back({flag, path, output, saved});
  };
  add("--data", c.data_path, false);
  add("--resume", c.resume_path, false);
  add("--load", c.load_path, false);
  add("--trace", c.trace_path, true);
  add("--json", c.json_path, true);
  add("--save", c.save_path, true, true);
  if (!c.save_path.empty()) add("--save's temporary file", c.save_path + ".tmp", true);
  // What the strategy writes beside them (LoRA's --save-merged), saved as --save is.
  for (const auto& [flag, path] : o.strategy->outputs()) {
    add(flag, path, true, true);
    if (!path.empty()) add(flag + "'s temporary file", path + ".tmp", true);
  }
  for (std::size_t i = 0; i < files.size(); ++i)
    for (std::size_t j = i + 1; j < files.size(); ++j) {
      const File &a = files[i], &b = files[j];
      if (!a.output && !b.output) continue;  // two inputs may be one file
      const bool save_replaces_input = (!a.output && b.saved) || (!b.output && a.saved);
      if (a.flag != "--data" && b.flag != "--data" && save_replaces_input) continue;
      if (!same_file(a.path, b.path)) continue;
      const char* why = a.output && b.output ? "one output would overwrite the other"
                                             : "the run would overwrite a file it reads";
      throw UsageError(a.flag + " '" + a.path + "' and " + b.flag + " '" + b.path +
                       "' are the same file: " + why + "; give each its own file");
    }
}

void check_checkpoint_file(const std::string& flag, const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code error;
  if (!fs::is_regular_file(path, error))
    throw UsageError(flag + " expects a checkpoint file (from --save), got '" + path + "' (" +
                     (fs::exists(path, error) ? "not a regular file" : "no such file") + ")");
}

void check_data_file(const std::string& path, std::int64_t seq) {
  namespace fs = std::filesystem;
  std::error_code error;
  const fs::file_status status = fs::status(path, error);
  if (!fs::exists(status))
    throw UsageError("--data expects a readable text file, got '" + path + "' (no such file)");
  if (fs::is_directory(status))
    throw UsageError("--data expects a text file, got the directory '" + path + "'");
  if (!fs::is_regular_file(status))
    throw UsageError("--data expects a regular text file, got '" + path + "'");
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr)
    throw UsageError("--data: cannot read '" + path + "': " + std::strerror(errno));
  std::fclose(file);
  const auto bytes = static_cast<std::int64_t>(fs::file_size(path, error));
  if (bytes <= seq)
    throw UsageError("--data '" + path + "' has " + std::to_string(bytes) + " bytes, but --seq " +
                     std::to_string(seq) + " needs at least " + std::to_string(seq + 1) +
                     " (a sequence and its last target)");
}

}  // namespace

void check_files(const Options& o) {
  const TrainConfig& config = o.config;
  if (!config.data_path.empty()) check_data_file(config.data_path, config.seq);
  if (!config.trace_path.empty() && config.trace_path == config.json_path)
    throw UsageError("--trace and --json name the same file '" + config.json_path + "'");
  if (!config.save_path.empty()) check_save_path("--save", config.save_path);
  for (const auto& [flag, path] : o.strategy->outputs()) {
    if (path.empty()) continue;
    check_save_path(flag, path);
    if (path == config.save_path)
      throw UsageError("--save and " + flag + " name the same file '" + config.save_path + "'");
  }
  if (!config.resume_path.empty()) check_checkpoint_file("--resume", config.resume_path);
  if (!config.load_path.empty()) check_checkpoint_file("--load", config.load_path);
  check_files_apart(o);
}

void check_outputs_writable(const Options& o) {
  if (!o.config.trace_path.empty()) check_writable("--trace", o.config.trace_path);
  if (!o.config.json_path.empty()) check_writable("--json", o.config.json_path);
}

}  // namespace dtp::train_app
