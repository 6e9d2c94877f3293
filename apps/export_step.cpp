// dtp-export-step: one forward/backward of a small seeded GPT on fixed
// tokens, written to JSON so that tools/torch_crosscheck.py can redo it in
// PyTorch and compare the loss, the logits and every gradient.
//   dtp-export-step --out step.json [--device cpu|cuda] [--attention naive|flash]
//                   [--dtype f32|f64] [--seed 1234] [--layers 2] [--d-model 64] [--heads 4]
//                   [--vocab 96] [--context 48] [--batch 3] [--seq 40]
// Format: {"config": {...}, "tokens": [[...]], "targets": [[...]],
// "loss": L, "logits": {"shape": [B, T, V], "value": [...]}, "params":
// [{"name": "block.0.attn.q.weight", "shape": [...], "value": [...],
// "grad": [...]}, ...]}, floats printed with 9 significant digits for f32 and
// 17 for f64 (exact either way). Parameter names are "<unit>.<parameter>".
// The logits come from GPT::logits on the same tokens and weights (the math
// of forward(), which keeps its own logits only as the loss gradient).
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "dtp/device.h"
#include "dtp/dtype.h"
#include "dtp/error.h"
#include "dtp/nn.h"
#include "dtp_cli.h"

namespace {

// Significant digits that print a value of this dtype exactly.
int g_digits = 9;

void write_numbers(std::FILE* f, const std::vector<double>& values, bool integers) {
  std::fputc('[', f);
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (i) std::fputc(',', f);
    if (integers)
      std::fprintf(f, "%lld", static_cast<long long>(values[i]));
    else
      std::fprintf(f, "%.*g", g_digits, values[i]);
  }
  std::fputc(']', f);
}

void write_rows(std::FILE* f, const dtp::Tensor& t) {
  const std::vector<double> v = t.to_vector();
  const std::int64_t rows = t.size(0), cols = t.size(1);
  std::fputc('[', f);
  for (std::int64_t r = 0; r < rows; ++r) {
    if (r) std::fputc(',', f);
    write_numbers(f, std::vector<double>(v.begin() + r * cols, v.begin() + (r + 1) * cols), true);
  }
  std::fputc(']', f);
}

}  // namespace

int main(int argc, char** argv) {
  dtp::GPTConfig config;
  config.vocab_size = 96;
  config.context = 48;
  config.d_model = 64;
  config.heads = 4;
  config.layers = 2;
  std::int64_t batch = 3, seq = 40;
  std::string out_path = "step.json", attention = "naive", dtype = "f32";
  CLI::App app{
      "One forward/backward of a small seeded GPT on fixed random tokens, written to a JSON file "
      "(the "
      "config, tokens, targets, loss, logits, and every parameter with its gradient) so that "
      "tools/torch_crosscheck.py can redo it in PyTorch and compare.",
      "dtp-export-step"};
  app.add_option("--out", out_path, "the JSON file to write")
      ->type_name("FILE")
      ->capture_default_str();
  dtp::cli::add_device_option(app, config.device, "cpu or cuda[:k] (default cpu)");
  app.add_option("--attention", attention, "the attention kernel")
      ->check(CLI::IsMember({"naive", "flash"}))
      ->capture_default_str();
  app.add_option("--dtype", dtype, "weights and math")
      ->check(CLI::IsMember({"f32", "f64"}))
      ->capture_default_str();
  app.add_option("--seed", config.seed,
                 "seeds the weights; the tokens and targets use seed + 1 and seed + 2")
      ->check(dtp::cli::Range(std::uint64_t{0},
                              static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())))
      ->capture_default_str();
  app.add_option("--layers", config.layers, "transformer blocks")
      ->check(dtp::cli::Range(1, 64))
      ->capture_default_str();
  app.add_option("--d-model", config.d_model, "width C (must divide by --heads)")
      ->check(dtp::cli::Range(1, 4096))
      ->capture_default_str();
  app.add_option("--heads", config.heads, "attention heads")
      ->check(dtp::cli::Range(1, 256))
      ->capture_default_str();
  app.add_option("--vocab", config.vocab_size, "vocabulary size")
      ->check(dtp::cli::Range(2, 1 << 20))
      ->capture_default_str();
  app.add_option("--context", config.context, "learned positions (at least --seq)")
      ->check(dtp::cli::Range(1, 1 << 16))
      ->capture_default_str();
  app.add_option("--batch", batch, "sequences")
      ->check(dtp::cli::Range(std::int64_t{1}, std::int64_t{1024}))
      ->capture_default_str();
  app.add_option("--seq", seq, "tokens per sequence")
      ->check(dtp::cli::Range(std::int64_t{1}, std::int64_t{1} << 16))
      ->capture_default_str();
  app.footer(
      "Floats are printed with 9 significant digits for f32 and 17 for f64 (exact either way); "
      "parameter "
      "names are \"<unit>.<parameter>\".");
  dtp::cli::require_heads_divide_width(app, config.d_model, config.heads);
  if (auto status = dtp::cli::parse(app, argc, argv)) return *status;
  if (seq > config.context) {
    std::fprintf(stderr,
                 "dtp-export-step: error: --seq %lld is longer than --context %d (see --help)\n",
                 static_cast<long long>(seq), config.context);
    return 2;
  }
  try {
    config.attention = dtp::parse_attention_kind(attention);
    config.dtype = dtp::parse_dtype(dtype);
    if (config.device.is_cuda() && dtp::cuda_device_count() == 0) {
      std::fprintf(stderr, "dtp-export-step: error: --device %s: no usable CUDA device here\n",
                   config.device.str().c_str());
      return 2;
    }
    config.validate();
    // Opened before the work, so that a path that cannot be written is said at once.
    std::FILE* f = std::fopen(out_path.c_str(), "w");
    if (f == nullptr) {
      std::fprintf(stderr, "dtp-export-step: error: cannot write --out '%s': %s\n",
                   out_path.c_str(), std::strerror(errno));
      return 2;
    }
    g_digits = config.dtype == dtp::DType::f64 ? 17 : 9;
    dtp::GPT model(config);
    const dtp::Tensor tokens = dtp::Tensor::random_uniform(
        {batch, seq}, config.seed + 1, 0, config.vocab_size, dtp::DType::i32, config.device);
    const dtp::Tensor targets = dtp::Tensor::random_uniform(
        {batch, seq}, config.seed + 2, 0, config.vocab_size, dtp::DType::i32, config.device);
    // The logits first: GPT::logits keeps no activations, so forward() and
    // backward() below run exactly as they would without it.
    const dtp::Tensor logits = model.logits(tokens);
    model.zero_grad();
    const double loss = model.forward(tokens, targets);
    model.backward();

    std::fprintf(
        f,
        "{\"config\":{\"vocab_size\":%d,\"context\":%d,\"d_model\":%d,\"heads\":%d,\"layers\":%d,"
        "\"mlp_ratio\":%d,\"layernorm_eps\":%.9g,\"attention\":\"%s\",\"dtype\":\"%s\",\"device\":"
        "\"%s\","
        "\"seed\":%llu},",
        config.vocab_size, config.context, config.d_model, config.heads, config.layers,
        config.mlp_ratio, config.layernorm_eps, dtp::attention_kind_name(config.attention),
        dtp::dtype_name(config.dtype), config.device.str().c_str(),
        static_cast<unsigned long long>(config.seed));
    std::fprintf(f, "\n\"tokens\":");
    write_rows(f, tokens);
    std::fprintf(f, ",\n\"targets\":");
    write_rows(f, targets);
    std::fprintf(f, ",\n\"loss\":%.17g,\n\"logits\":{\"shape\":[%lld,%lld,%lld],\"value\":", loss,
                 static_cast<long long>(logits.size(0)), static_cast<long long>(logits.size(1)),
                 static_cast<long long>(logits.size(2)));
    write_numbers(f, logits.to_vector(), false);
    std::fprintf(f, "},\n\"params\":[");
    bool first = true;
    for (dtp::Unit* unit : model.units()) {
      for (const dtp::ParamView& p : unit->parameters()) {
        std::fprintf(f, "%s\n{\"name\":\"%s.%s\",\"shape\":[", first ? "" : ",",
                     unit->name().c_str(), p.name.c_str());
        first = false;
        for (int d = 0; d < p.shape.ndim(); ++d)
          std::fprintf(f, "%s%lld", d ? "," : "", static_cast<long long>(p.shape[d]));
        std::fprintf(f, "],\"value\":");
        write_numbers(f, p.value.to_vector(), false);
        std::fprintf(f, ",\"grad\":");
        write_numbers(f, p.grad.to_vector(), false);
        std::fputc('}', f);
      }
    }
    std::fprintf(f, "\n]}\n");
    const bool failed = std::ferror(f) != 0;
    if (std::fclose(f) != 0 || failed) {
      std::fprintf(stderr, "dtp-export-step: error: writing '%s' failed: %s\n", out_path.c_str(),
                   std::strerror(errno));
      return 1;
    }
    std::printf("wrote %s: %s, loss %.6f\n", out_path.c_str(), config.describe().c_str(), loss);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dtp-export-step: error: %s\n", e.what());
    return 1;
  }
}
