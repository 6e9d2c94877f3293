// check_ranks_agree: every rank's settings, as text, gathered to every rank.
#include "dtp/agreement.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "dtp/error.h"

namespace dtp {
namespace {

// FNV-1a over the bit patterns of a unit's parameters: equal replicas give
// equal fingerprints on every backend (parameters are copied to the host).
std::string fingerprint(const Tensor& params) {
  std::uint64_t hash = 1469598103934665603ULL;
  for (double v : params.to_vector()) {
    std::uint64_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    for (int i = 0; i < 8; ++i) {
      hash ^= (bits >> (8 * i)) & 0xff;
      hash *= 1099511628211ULL;
    }
  }
  char text[24];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(hash));
  return text;
}

// "flag\tvalue\n" per setting: flags and values never hold tabs or newlines
// that matter here (a path with one only makes the message odd).
std::string serialize(const std::vector<RunSetting>& settings) {
  std::string text;
  for (const RunSetting& s : settings) text += s.flag + '\t' + s.value + '\n';
  return text;
}

std::vector<RunSetting> parse(const std::string& text) {
  std::vector<RunSetting> settings;
  std::size_t at = 0;
  while (at < text.size()) {
    const std::size_t tab = text.find('\t', at);
    const std::size_t end = text.find('\n', at);
    if (tab == std::string::npos || end == std::string::npos || tab > end) break;
    settings.push_back({text.substr(at, tab - at), text.substr(tab + 1, end - tab - 1)});
    at = end + 1;
  }
  return settings;
}

// How many of @p unit's leading parameters every rank holds: all of them,
// but for expert parallelism (GPTConfig::expert_shards), where each rank
// holds other experts and a block's experts come last in its layout.
std::int64_t shared_prefix(const Unit& unit, const GPTConfig& config) {
  if (config.expert_shards > 1)
    for (const ParamView& view : unit.parameters())
      if (view.name.find(".expert.") != std::string::npos) return view.offset;
  return unit.numel();
}

}  // namespace

std::vector<RunSetting> run_settings(const TrainConfig& c) {
  char number[64];
  auto real = [&](double v) {
    std::snprintf(number, sizeof number, "%.17g", v);
    return std::string(number);
  };
  return {
      {"--strategy", c.strategy},
      {"--device", c.model.device.is_cuda() ? "cuda" : "cpu"},  // ranks may use different GPUs
      {"--steps", std::to_string(c.steps)},
      {"--batch", std::to_string(c.batch)},
      {"--seq", std::to_string(c.seq)},
      {"--data", c.data_path.empty() ? "(synthetic)" : c.data_path},
      {"--seed", std::to_string(c.seed)},
      {"--layers", std::to_string(c.model.layers)},
      {"--d-model", std::to_string(c.model.d_model)},
      {"--heads", std::to_string(c.model.heads)},
      {"--vocab", std::to_string(c.model.vocab_size)},
      {"--attention", c.model.attention == AttentionKind::flash ? "flash" : "naive"},
      {"--dtype", dtype_name(c.model.dtype)},
      {"--optimizer", c.optimizer},
      {"--lr", real(c.lr)},
      {"--warmup", std::to_string(c.warmup)},
      {"--min-lr-ratio", real(c.min_lr_ratio)},
      {"--weight-decay", real(c.weight_decay)},
      {"--momentum", real(c.momentum)},
      {"--clip", real(c.grad_clip)},
  };
}

std::vector<RunSetting> run_settings(const TrainConfig& config,
                                     const std::vector<RunSetting>& own) {
  std::vector<RunSetting> settings = run_settings(config);
  settings.insert(settings.end(), own.begin(), own.end());
  return settings;
}

void check_ranks_agree(Comm& comm, const std::vector<RunSetting>& settings, const GPT& model) {
  std::vector<RunSetting> mine = settings;
  for (const Unit* unit : model.units())
    mine.push_back({"initial parameters of unit '" + unit->name() + "' (fingerprint)",
                    fingerprint(unit->params().slice(0, shared_prefix(*unit, model.config())))});
  const std::string text = serialize(mine);

  // Pad every rank's text to the longest, then all-gather the bytes (one f64
  // each: exact on every backend, and a few hundred bytes once per run).
  Tensor length = Tensor::from_values({static_cast<double>(text.size())});
  comm.all_reduce(length, ReduceOp::max);
  const auto width = static_cast<std::int64_t>(length.item(0));
  std::vector<double> bytes(static_cast<std::size_t>(width), 0.0);
  for (std::size_t i = 0; i < text.size(); ++i) bytes[i] = static_cast<unsigned char>(text[i]);
  Tensor shard = Tensor::from_values(bytes);
  Tensor all = Tensor::zeros(Shape{width * comm.size()}, DType::f64);
  comm.all_gather(shard, all);
  const std::vector<double> gathered = all.to_vector();

  auto text_of = [&](int rank) {
    std::string out;
    for (std::int64_t i = 0; i < width; ++i) {
      const double b = gathered[static_cast<std::size_t>(rank * width + i)];
      if (b == 0) break;
      out += static_cast<char>(static_cast<unsigned char>(b));
    }
    return out;
  };
  const std::vector<RunSetting> first = parse(text_of(0));
  for (int rank = 1; rank < comm.size(); ++rank) {
    const std::vector<RunSetting> other = parse(text_of(rank));
    for (std::size_t i = 0; i < std::max(first.size(), other.size()); ++i) {
      const RunSetting none{"(nothing)", "(missing)"};
      const RunSetting& a = i < first.size() ? first[i] : none;
      const RunSetting& b = i < other.size() ? other[i] : none;
      if (a.flag == b.flag && a.value == b.value) continue;
      DTP_CHECK(false, "the ranks were started differently: rank ", rank, " has ", b.flag, " ",
                b.value, " but rank 0 has ", a.flag, " ", a.value,
                " (every process of one run needs the same settings, or the replicas diverge)");
    }
  }
}

}  // namespace dtp
