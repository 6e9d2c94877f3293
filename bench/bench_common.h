// What every benchmark program writes about the run it measured: the build's
// revision, the machine, the time, and one JSON object per line.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "dtp/error.h"
#include "dtp/gpt_config.h"
#include "dtp/json.h"
#include "dtp/launch.h"
#include "dtp/trainer.h"
#include "number_text.h"

namespace dtp::bench {

using dtp::JsonLine;  // one JSON object per line (dtp/json.h)

/// The build's revision: the DTP_GIT_REV compile definition (bench/CMakeLists.txt
/// sets it at configure time), the DTP_GIT_REV environment variable, or git
/// asked about this source's checkout; "unknown" when none answers.
inline std::string git_revision() {
#ifdef DTP_GIT_REV
  if (std::string rev = DTP_GIT_REV; !rev.empty()) return rev;
#endif
  if (const char* rev = std::getenv("DTP_GIT_REV"); rev && *rev) return rev;
  std::string folder = __FILE__;
  folder = folder.substr(0, folder.find_last_of('/') + 1);
  std::string out;
  if (FILE* p =
          popen(("git -C '" + folder + "' rev-parse --short HEAD 2>/dev/null").c_str(), "r")) {
    char buf[64];
    if (std::fgets(buf, sizeof buf, p)) out = buf;
    pclose(p);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out.empty() ? "unknown" : out;
}

/// The CPU's model name from /proc/cpuinfo, or "unknown".
inline std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) {
      std::string model = line.substr(line.find(':') + 1);
      model.erase(0, model.find_first_not_of(" \t"));
      return model;
    }
  return "unknown";
}

/// This machine's host name, or "unknown".
inline std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) return "unknown";
  return name;
}

/// Now, as 2026-11-23T16:44:32Z.
inline std::string utc_now() {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text;
}

/// The median of @p values (of an even count, the upper middle one); 0 when empty.
inline double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values.empty() ? 0 : values[values.size() / 2];
}

/// The mean of the last @p n values of @p v (all of them when it has fewer;
/// 0 when empty): "the loss at the end" of a training run.
inline double mean_of_last(const std::vector<double>& v, std::size_t n) {
  n = std::min(n, v.size());
  double sum = 0;
  for (std::size_t i = v.size() - n; i < v.size(); ++i) sum += v[i];
  return n ? sum / static_cast<double>(n) : 0;
}

/// Replicas that must hold the same values (each rank's parameters, flat):
/// the first rank r >= 1 whose values differ from rank 0's and the first
/// index where they do, or nothing when every replica equals rank 0's.
struct ReplicaDifference {
  int rank = 0;           ///< the replica that differs
  std::size_t index = 0;  ///< the first element that does
};
inline std::optional<ReplicaDifference> first_replica_difference(
    const std::vector<std::vector<double>>& replicas) {
  for (std::size_t r = 1; r < replicas.size(); ++r)
    if (replicas[r] != replicas[0]) {
      std::size_t i = 0;
      while (i < replicas[r].size() && i < replicas[0].size() && replicas[r][i] == replicas[0][i])
        ++i;
      return ReplicaDifference{static_cast<int>(r), i};
    }
  return std::nullopt;
}

/// The items of a comma list, empty ones dropped: "1,2,,4" gives 1, 2, 4.
inline std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

/// Where and when a run measured: written into every JSON line of it.
struct RunContext {
  std::string backend, device, date, git, host, cpu;
  /// glibc's malloc settings (the GLIBC_TUNABLES environment variable): they
  /// move CPU times measurably (see bench/README.md), so a result says them.
  std::string glibc_tunables;
  int cores = 0;
};

/// This process's context: backend and device from DTP_BACKEND and DTP_DEVICE.
inline RunContext make_context() {
  RunContext ctx;
  const World env = World::from_env(1);
  ctx.backend = backend_name(env.backend);
  ctx.device = env.device.is_cuda() ? "cuda" : "cpu";
  ctx.date = utc_now();
  ctx.git = git_revision();
  ctx.host = host_name();
  ctx.cpu = cpu_model();
  ctx.cores = static_cast<int>(std::thread::hardware_concurrency());
  if (const char* tunables = std::getenv("GLIBC_TUNABLES")) ctx.glibc_tunables = tunables;
  return ctx;
}

/// Adds the context's fields to @p line.
inline JsonLine& add_context(JsonLine& line, const RunContext& c) {
  return line.add("backend", c.backend)
      .add("device", c.device)
      .add("date", c.date)
      .add("git", c.git)
      .add("hostname", c.host)
      .add("cpu", c.cpu)
      .add("cores", c.cores)
      .add("glibc_tunables", c.glibc_tunables);
}

/// Adds the model's shape and the batch to @p line: dtype, d_model, layers,
/// heads, vocab, seq and batch, under the names the plots read.
inline JsonLine& add_shape(JsonLine& line, const dtp::GPTConfig& model, std::int64_t seq,
                           std::int64_t batch) {
  return line.add("dtype", dtp::dtype_name(model.dtype))
      .add("d_model", model.d_model)
      .add("layers", model.layers)
      .add("heads", model.heads)
      .add("vocab", model.vocab_size)
      .add("seq", seq)
      .add("batch", batch);
}

/// Writes @p line and a newline to @p json (nothing when null), flushed so a
/// run that stops early keeps what it measured. Throws dtp::Error when the
/// line could not be written (a full disk): a result is never lost quietly.
inline void write_line(FILE* json, const JsonLine& line) {
  if (json == nullptr) return;
  std::fprintf(json, "%s\n", line.str().c_str());
  if (std::fflush(json) != 0 || std::ferror(json))
    throw dtp::Error(std::string("cannot write the --json file: ") + std::strerror(errno));
}

/// Opens @p path (the --json flag) for appending into @p json, or leaves it
/// null when the path is empty. False, after "PROGRAM: error: cannot append
/// to --json PATH: REASON" on stderr, when it cannot be opened: the caller
/// exits 2 before measuring anything.
inline bool open_json(const char* program, const std::string& path, FILE*& json) {
  json = path.empty() ? nullptr : std::fopen(path.c_str(), "a");
  if (path.empty() || json != nullptr) return true;
  std::fprintf(stderr, "%s: error: cannot append to --json %s: %s\n", program, path.c_str(),
               std::strerror(errno));
  return false;
}

/// Closes a --json file (nothing when null). Returns @p status, or 1 after
/// saying so on stderr when the file's last lines could not be written.
inline int close_json(FILE* json, const char* program, int status) {
  if (json == nullptr) return status;
  const bool failed = std::ferror(json) != 0;
  if (std::fclose(json) != 0 || failed) {
    std::fprintf(stderr, "%s: error: cannot write the --json file: %s\n", program,
                 std::strerror(errno));
    return 1;
  }
  return status;
}

/// How a benchmark that checks what it measures ends: closes @p json; then
/// either prints every one of @p problems and "N check(s) failed: @p
/// failed_because" on stderr and returns 1, or prints "# @p all_good" and
/// returns 0.
inline int finish_checked_run(FILE* json, const char* program,
                              const std::vector<std::string>& problems, const char* failed_because,
                              const char* all_good) {
  if (close_json(json, program, 0) != 0) return 1;
  if (!problems.empty()) {
    for (const std::string& p : problems)
      std::fprintf(stderr, "%s: FAILED: %s\n", program, p.c_str());
    std::fprintf(stderr, "%s: %zu check(s) failed: %s\n", program, problems.size(), failed_because);
    return 1;
  }
  std::printf("# %s\n", all_good);
  return 0;
}

/// make_context(), or std::nullopt after printing "PROGRAM: error: ..." when
/// DTP_BACKEND, DTP_DEVICE or DTP_TIMEOUT is not one the runtime accepts.
inline std::optional<RunContext> context_from_env(const char* program) {
  try {
    return make_context();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", program, e.what());
    return std::nullopt;
  }
}

}  // namespace dtp::bench
