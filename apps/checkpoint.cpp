// dtp-checkpoint: what a checkpoint file holds, read and checked (magic,
// header, sizes, checksum) exactly as --resume and --load read it.
//   dtp-checkpoint FILE [--tensor NAME] [--values N]
// Prints the kind, the step, the settings of the run that wrote it (its
// strategy, the strategy's own settings, the model), one line per tensor
// (name, dtype, shape, bytes) and the bytes of each part: params/, extra/
// (LoRA's adapters, mixed precision's masters and loss scaler) and
// optimizer/. With --tensor NAME, that tensor's first values and its
// minimum, maximum and root mean square.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "dtp/checkpoint.h"
#include "dtp/error.h"
#include "dtp_cli.h"

namespace {

// "vocab_size 64, context 64, ..." for an object (but the members named in
// @p skip); the JSON text otherwise.
std::string listed(const dtp::JsonValue& value, const std::set<std::string>& skip = {}) {
  if (value.kind != dtp::JsonValue::Kind::object) return value.dump();
  std::string text;
  for (const auto& [key, member] : value.members) {
    if (member.kind == dtp::JsonValue::Kind::object || skip.count(key))
      continue;  // nested: on their own line
    const std::string shown =
        member.kind == dtp::JsonValue::Kind::string ? member.text : member.dump();
    text += (text.empty() ? "" : ", ") + key + " " + shown;
  }
  return text;
}

std::string megabytes(std::int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return text;
}

void print_tensor_values(const dtp::Checkpoint& checkpoint, const std::string& name, int count) {
  const dtp::Tensor& tensor = checkpoint.tensor(name);  // throws naming the file's tensors
  const std::vector<double> values = tensor.to_vector();
  std::printf("\n%s: %s %s\n  first values:", name.c_str(), dtp::dtype_name(tensor.dtype()),
              tensor.shape().str().c_str());
  for (std::size_t i = 0; i < values.size() && i < static_cast<std::size_t>(count); ++i)
    std::printf(" %.9g", values[i]);
  if (values.empty()) {
    std::printf(" (none)\n");
    return;
  }
  double squares = 0;
  for (double v : values) squares += v * v;
  std::printf("\n  min %.9g  max %.9g  rms %.9g\n", *std::min_element(values.begin(), values.end()),
              *std::max_element(values.begin(), values.end()), std::sqrt(squares / values.size()));
}

}  // namespace

int main(int argc, char** argv) {
  std::string path, tensor;
  int values = 8;
  CLI::App app{
      "What a DTP checkpoint holds (dtp train --save): its kind and step, the settings of the run "
      "that wrote "
      "it, and every tensor's name, dtype, shape and bytes. The file is read and checked as "
      "--resume reads it, "
      "so a damaged file is an error that says what is wrong.",
      "dtp-checkpoint"};
  app.add_option("FILE", path, "the checkpoint (dtp train --save FILE)")->check(CLI::ExistingFile);
  app.add_option("--tensor", tensor, "also print this tensor's first values, min, max and RMS")
      ->type_name("NAME");
  app.add_option("--values", values, "how many of its values --tensor prints")
      ->check(dtp::cli::Range(1, 1000000))
      ->capture_default_str();
  app.footer("The format is documented in runtime/include/dtp/checkpoint.h.");
  if (auto status = dtp::cli::parse(app, argc, argv)) return *status;
  if (path.empty()) {
    std::fprintf(stderr, "dtp-checkpoint: error: give the checkpoint FILE to read (see --help)\n");
    return 2;
  }
  try {
    const dtp::Checkpoint checkpoint = dtp::read_checkpoint(path);
    std::printf("%s: a %s checkpoint at step %lld, checksum verified\n", path.c_str(),
                checkpoint.kind.c_str(), static_cast<long long>(checkpoint.step));
    if (const dtp::JsonValue* strategy = checkpoint.config.find("strategy"))
      std::printf("strategy: %s\n", strategy->text.c_str());
    if (const dtp::JsonValue* own = checkpoint.config.find("strategy_settings"))
      std::printf("strategy settings: %s\n", listed(*own).c_str());
    if (const dtp::JsonValue* model = checkpoint.config.find("model"))
      std::printf("model: %s\n", listed(*model).c_str());
    std::printf("run: %s\n\n",
                listed(checkpoint.config, {"kind", "strategy", "command_line"}).c_str());
    std::map<std::string, std::int64_t> bytes_by_part;
    std::int64_t total = 0;
    std::size_t width = 4;
    for (const dtp::NamedTensor& t : checkpoint.tensors) width = std::max(width, t.name.size());
    std::printf("%-*s  %-5s  %-16s  %s\n", static_cast<int>(width), "name", "dtype", "shape",
                "bytes");
    for (const dtp::NamedTensor& t : checkpoint.tensors) {
      const auto bytes = static_cast<std::int64_t>(t.tensor.nbytes());
      std::printf("%-*s  %-5s  %-16s  %lld\n", static_cast<int>(width), t.name.c_str(),
                  dtp::dtype_name(t.tensor.dtype()), t.tensor.shape().str().c_str(),
                  static_cast<long long>(bytes));
      bytes_by_part[t.name.substr(0, t.name.find('/') + 1)] += bytes;
      total += bytes;
    }
    std::printf("\n%zu tensors, %s:", checkpoint.tensors.size(), megabytes(total).c_str());
    for (const auto& [part, bytes] : bytes_by_part)
      std::printf("  %s %s", part.c_str(), megabytes(bytes).c_str());
    std::printf("\n");
    if (!tensor.empty()) print_tensor_values(checkpoint, tensor, values);
  } catch (const std::exception& e) {  // dtp::Error, and out of memory or a file-system error
    std::fprintf(stderr, "dtp-checkpoint: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
