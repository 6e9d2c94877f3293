// The planner's model side: named models and clusters, what one rank holds
// (parameters by chapter 04's slicing, activations) and the collectives
// chapter 04's tensor-parallel units issue.
#include <algorithm>
#include <cmath>
#include <sstream>

#include "drivers/12_3d_parallelism/plan.h"
#include "dtp/error.h"

namespace dtp::plan {

namespace {

ModelShape gpt2_like(const std::string& name, int layers, int hidden, int heads) {
  ModelShape m;
  m.name = name;
  m.layers = layers;
  m.hidden = hidden;
  m.heads = m.kv_heads = heads;
  m.ffn = 4LL * hidden;
  m.vocab = 50257;
  m.seq = m.positions = 1024;
  m.dropout = true;
  m.vocab_multiple = 128;
  return m;
}

// Megatron-LM's GPT rows (arXiv 2104.04473, Table 1): V 51200, s 2048.
ModelShape megatron_gpt(const std::string& name, int layers, int hidden, int heads) {
  ModelShape m = gpt2_like(name, layers, hidden, heads);
  m.vocab = 51200;
  m.seq = m.positions = 2048;
  return m;
}

ModelShape llama(const std::string& name, int layers, int hidden, int heads, int kv_heads,
                 std::int64_t ffn, std::int64_t vocab, int seq) {
  ModelShape m;
  m.name = name;
  m.layers = layers;
  m.hidden = hidden;
  m.heads = heads;
  m.kv_heads = kv_heads;
  m.ffn = ffn;
  m.vocab = vocab;
  m.seq = seq;
  m.positions = 0;
  m.biases = false;
  m.gated_mlp = true;
  m.vocab_multiple = 128;
  return m;
}

std::vector<ModelShape> all_models() {
  return {gpt2_like("gpt2-small", 12, 768, 12),
          gpt2_like("gpt2-medium", 24, 1024, 16),
          gpt2_like("gpt2-large", 36, 1280, 20),
          gpt2_like("gpt2-xl", 48, 1600, 25),
          llama("llama2-7b", 32, 4096, 32, 32, 11008, 32000, 4096),
          llama("llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192),
          llama("llama3-70b", 80, 8192, 64, 8, 28672, 128256, 8192),
          llama("llama3-405b", 126, 16384, 128, 8, 53248, 128256, 8192),
          megatron_gpt("megatron-1.7b", 24, 2304, 24),
          megatron_gpt("megatron-3.6b", 30, 3072, 32),
          megatron_gpt("megatron-7.5b", 36, 4096, 32),
          megatron_gpt("megatron-18.4b", 40, 6144, 48),
          megatron_gpt("megatron-39.1b", 48, 8192, 64),
          megatron_gpt("megatron-76.1b", 60, 10240, 80),
          megatron_gpt("megatron-145.6b", 80, 12288, 96),
          megatron_gpt("megatron-310.1b", 96, 16384, 128),
          megatron_gpt("megatron-529.6b", 105, 20480, 128),
          megatron_gpt("megatron-1t", 128, 25600, 160),
          megatron_gpt("gpt3-175b", 96, 12288, 96)};
}

std::int64_t norm_parameters(const ModelShape& m) { return m.biases ? 2LL * m.hidden : m.hidden; }

std::int64_t kv_width(const ModelShape& m) {
  return static_cast<std::int64_t>(m.kv_heads) * m.head_dim();
}

std::int64_t even_part(const char* what, std::int64_t size, int parts) {
  DTP_CHECK(parts >= 1 && size % parts == 0, "plan: ", what, " ", size,
            " do not split over tp = ", parts, " tensor-parallel ranks (", size, " % ", parts,
            " != 0)");
  return size / parts;
}

// The parameters a block holds whole on every TP rank: its two norms and,
// with biases, the two row-parallel projections' biases.
std::vector<std::int64_t> replicated_block_parameters(const ModelShape& m) {
  std::vector<std::int64_t> sizes;
  for (int norm = 0; norm < 2; ++norm) {
    sizes.push_back(m.hidden);                // weight
    if (m.biases) sizes.push_back(m.hidden);  // bias
    if (m.biases) sizes.push_back(m.hidden);  // the projection after it: attn.proj, mlp.proj
  }
  return sizes;
}

}  // namespace

// --- the model ---------------------------------------------------------------------

std::int64_t ModelShape::padded_vocab(int tp) const {
  const std::int64_t multiple = static_cast<std::int64_t>(vocab_multiple) * tp;
  return (vocab + multiple - 1) / multiple * multiple;
}

std::int64_t ModelShape::parameters() const {
  ModelShape whole = *this;
  whole.vocab_multiple = 1;
  std::int64_t total = 0;
  for (int unit = 0; unit <= layers + 1; ++unit) total += unit_parameters_per_rank(whole, unit, 1);
  return total;
}

void ModelShape::validate() const {
  DTP_CHECK(layers >= 1 && hidden >= 1 && heads >= 1 && kv_heads >= 1 && ffn >= 1 && vocab >= 1 &&
                seq >= 1 && positions >= 0 && vocab_multiple >= 1,
            "plan: model '", name,
            "' needs layers, hidden, heads, kv heads, ffn, vocab and seq of ",
            "at least 1, got layers ", layers, ", hidden ", hidden, ", heads ", heads,
            ", kv heads ", kv_heads, ", ffn ", ffn, ", vocab ", vocab, ", seq ", seq);
  DTP_CHECK(hidden % heads == 0, "plan: model '", name, "': hidden ", hidden,
            " does not split into ", heads, " heads");
  DTP_CHECK(heads % kv_heads == 0, "plan: model '", name, "': ", heads, " heads do not share ",
            kv_heads, " kv heads evenly");
  DTP_CHECK(positions == 0 || positions >= seq, "plan: model '", name, "' has ", positions,
            " learned positions, fewer than seq ", seq);
  DTP_CHECK(!runtime_kernels || (biases && !gated_mlp && kv_heads == heads), "plan: model '", name,
            "' counts the runtime GPT's activations (runtime_kernels), which has biases, a GELU "
            "MLP and as many kv heads as heads");
}

ModelShape model_of(const GPTConfig& config, int seq) {
  ModelShape m;
  m.name = "runtime gpt";
  m.layers = config.layers;
  m.hidden = config.d_model;
  m.heads = m.kv_heads = config.heads;
  m.ffn = static_cast<std::int64_t>(config.mlp_ratio) * config.d_model;
  m.vocab = config.vocab_size;
  m.seq = seq;
  m.positions = config.context;
  m.runtime_kernels = true;
  m.flash_attention = config.attention == AttentionKind::flash;
  return m;
}

std::vector<std::string> model_names() {
  std::vector<std::string> names;
  for (const ModelShape& m : all_models()) names.push_back(m.name);
  return names;
}

ModelShape named_model(const std::string& name) {
  std::string known;
  for (const ModelShape& m : all_models()) {
    if (m.name == name) return m;
    known += (known.empty() ? "" : ", ") + m.name;
  }
  DTP_CHECK(false, "plan: unknown model '", name, "'; the models are: ", known,
            " (or give --layers, --hidden, --heads, ... for your own)");
  return {};
}

// --- the cluster and the layout ----------------------------------------------------

CostModel Cluster::cost_model() const {
  return CostModel{alpha, beta}.with_nodes(gpus_per_node, node_alpha, node_beta);
}

double default_efficiency(const std::string& gpu) {
  if (gpu == "a100") return 0.60;
  if (gpu == "h100") return 0.50;
  DTP_CHECK(false, "plan: unknown GPU '", gpu, "'; the GPUs are: a100, h100");
  return 0;
}

Cluster named_cluster(const std::string& gpu, int gpus_per_node, int nodes) {
  DTP_CHECK(gpus_per_node >= 1 && nodes >= 1,
            "plan: a cluster needs at least 1 GPU per node and 1 node, got ", gpus_per_node,
            " GPUs per node and ", nodes, " nodes");
  Cluster c;
  c.gpu = gpu;
  c.gpus_per_node = gpus_per_node;
  c.nodes = nodes;
  c.efficiency = default_efficiency(gpu);
  c.node_alpha = 5e-6;
  c.alpha = 10e-6;
  if (gpu == "a100") {
    c.hbm_bytes = 80.0 * (1 << 30);
    c.peak_flops = 312e12;
    c.node_beta = 1.0 / 300e9;  // NVLink 3: 600 GB/s both ways together
    c.beta = 1.0 / 25e9;        // 200 Gb/s InfiniBand per GPU
  } else {
    c.hbm_bytes = 80.0 * (1 << 30);
    c.peak_flops = 989e12;
    c.node_beta = 1.0 / 450e9;  // NVLink 4: 900 GB/s both ways together
    c.beta = 1.0 / 50e9;        // 400 Gb/s InfiniBand per GPU
  }
  return c;
}

const char* recompute_name(Recompute recompute) {
  switch (recompute) {
    case Recompute::none:
      return "none";
    case Recompute::selective:
      return "selective";
    case Recompute::full:
      return "full";
  }
  return "?";
}

Recompute parse_recompute(const std::string& name) {
  for (Recompute r : {Recompute::none, Recompute::selective, Recompute::full})
    if (name == recompute_name(r)) return r;
  DTP_CHECK(false, "plan: unknown recomputation '", name, "'; expected none, selective or full");
  return Recompute::none;
}

std::string Layout::text() const {
  std::ostringstream out;
  out << "tp " << tp << " pp " << pp << " dp " << dp << ", mb " << microbatch << " x "
      << (dp * microbatch > 0 ? global_batch / (dp * microbatch) : 0) << ", "
      << ch05::schedule_kind_name(schedule);
  if (schedule == ch05::ScheduleKind::interleaved) out << " v " << chunks;
  if (sequence_parallel) out << ", sp";
  if (recompute != Recompute::none) out << ", recompute " << recompute_name(recompute);
  if (zero != 0) out << ", zero " << zero;
  return out.str();
}

Precision Precision::uniform(DType dtype) {
  const int e = static_cast<int>(dtype_size(dtype));
  return {e, e, 2 * e, e};
}

void PlanInput::validate() const {
  model.validate();
  const Layout& l = layout;
  DTP_CHECK(l.tp >= 1 && l.pp >= 1 && l.dp >= 1 && l.microbatch >= 1 && l.global_batch >= 1 &&
                l.chunks >= 1,
            "plan: tp, pp, dp, micro-batch, global batch and chunks must be at least 1, got ",
            l.text(), ", global batch ", l.global_batch, ", chunks ", l.chunks);
  DTP_CHECK(static_cast<std::int64_t>(l.tp) * l.pp * l.dp == cluster.gpus(), "plan: dp ", l.dp,
            " x pp ", l.pp, " x tp ", l.tp, " = ", static_cast<std::int64_t>(l.tp) * l.pp * l.dp,
            " GPUs, but the cluster has ", cluster.gpus(), " (", cluster.gpus_per_node,
            " per node x ", cluster.nodes, " nodes)");
  DTP_CHECK(l.tp <= cluster.gpus_per_node, "plan: tp ", l.tp, " is more than the ",
            cluster.gpus_per_node,
            " GPUs of a node; a tensor-parallel group talks at every layer and stays in one node");
  DTP_CHECK(model.heads % l.tp == 0 && model.kv_heads % l.tp == 0, "plan: tp ", l.tp,
            " does not divide the ", model.heads, " heads and ", model.kv_heads,
            " kv heads of model '", model.name, "'");
  even_part("MLP width", model.ffn, l.tp);
  even_part("vocabulary", model.padded_vocab(l.tp), l.tp);
  DTP_CHECK(l.global_batch % (l.dp * l.microbatch) == 0, "plan: the global batch of ",
            l.global_batch, " sequences does not split into dp ", l.dp, " x micro-batches of ",
            l.microbatch, " (", l.global_batch, " % ", l.dp * l.microbatch, " != 0)");
  DTP_CHECK(l.zero == 0 || l.zero == 1 || l.zero == 3, "plan: zero must be 0, 1 or 3, got ",
            l.zero);
  DTP_CHECK(!model.runtime_kernels || l.recompute != Recompute::selective,
            "plan: the runtime's GPT recomputes whole blocks (full) or nothing (none); selective "
            "recomputation is counted for production kernels only");
  const bool interleaved = l.schedule == ch05::ScheduleKind::interleaved;
  DTP_CHECK(interleaved || l.chunks == 1, "plan: --chunks ", l.chunks,
            " needs the interleaved schedule");
  DTP_CHECK(l.schedule == ch05::ScheduleKind::one_f_one_b || interleaved ||
                l.schedule == ch05::ScheduleKind::afab,
            "plan: the planner runs afab, 1f1b and interleaved schedules, got ",
            ch05::schedule_kind_name(l.schedule));
  DTP_CHECK(!interleaved || (l.pp >= 2 && l.chunks >= 2 && l.microbatches() % l.pp == 0),
            "plan: the interleaved schedule needs pp >= 2, chunks >= 2 and micro-batches a "
            "multiple of pp; got pp ",
            l.pp, ", chunks ", l.chunks, ", ", l.microbatches(), " micro-batches");
  const std::int64_t blocks_per_stage = model.layers / (static_cast<std::int64_t>(l.pp) * l.chunks);
  DTP_CHECK(!units.empty() || blocks_per_stage >= 1, "plan: ", model.layers, " layers over pp ",
            l.pp, " x chunks ", l.chunks, " virtual stages leaves a stage without a layer");
  DTP_CHECK(
      l.microbatch * static_cast<std::int64_t>(model.seq) % (l.sequence_parallel ? l.tp : 1) == 0,
      "plan: sequence parallelism needs the ", l.microbatch * model.seq,
      " tokens of a micro-batch to split over tp ", l.tp);
  if (!units.empty()) {
    DTP_CHECK(static_cast<int>(units.size()) == l.pp * l.chunks, "plan: ", units.size(),
              " unit ranges given for ", l.pp * l.chunks, " virtual stages");
    int next = 0;
    for (const ch05::UnitRange& range : units) {
      DTP_CHECK(range.first == next && range.count >= 1, "plan: the unit ranges must cover units ",
                "0 .. ", model.layers + 1, " in order, each non-empty; a range starts at ",
                range.first, " where ", next, " was next");
      next += range.count;
    }
    DTP_CHECK(next == model.layers + 2, "plan: the unit ranges cover ", next, " units, not the ",
              model.layers + 2, " of the model (embedding, ", model.layers, " blocks, head)");
  }
}

std::vector<ch05::UnitRange> stage_units(const PlanInput& input) {
  if (!input.units.empty()) return input.units;
  const int stages = input.layout.pp * input.layout.chunks, L = input.model.layers;
  std::vector<ch05::UnitRange> ranges;
  int next = 1;  // the first block
  for (int v = 0; v < stages; ++v) {
    const int blocks = L / stages + (v < L % stages ? 1 : 0);
    ch05::UnitRange range{next, blocks};
    if (v == 0) range = {0, blocks + 1};
    if (v == stages - 1) range.count += 1;
    next += blocks;
    ranges.push_back(range);
  }
  return ranges;
}

// --- what one rank holds ------------------------------------------------------------

std::int64_t unit_parameters_per_rank(const ModelShape& m, int unit, int tp) {
  const std::int64_t h = m.hidden;
  const std::int64_t vocab_rows = even_part("vocabulary", m.padded_vocab(tp), tp);
  if (unit == 0) return vocab_rows * h + static_cast<std::int64_t>(m.positions) * h;
  if (unit == m.layers + 1) return norm_parameters(m) + vocab_rows * h;
  DTP_CHECK(unit >= 1 && unit <= m.layers, "plan: unit ", unit, " is outside 0 .. ", m.layers + 1);
  const std::int64_t q_rows = even_part("attention width", h, tp);
  const std::int64_t kv_rows = even_part("key/value width", kv_width(m), tp);
  const std::int64_t ffn_rows = even_part("MLP width", m.ffn, tp);
  const std::int64_t bias = m.biases ? 1 : 0;
  std::int64_t n = 2 * norm_parameters(m);
  n += 2 * q_rows * h + 2 * kv_rows * h;      // q, o; k, v
  n += bias * (q_rows + 2 * kv_rows + h);     // q, k, v biases (sliced), o bias (whole)
  n += (m.gated_mlp ? 3 : 2) * ffn_rows * h;  // gate/up/down or fc/proj
  n += bias * (ffn_rows + h);                 // fc bias (sliced), proj bias (whole)
  return n;
}

std::int64_t block_activation_bytes_per_rank(const PlanInput& input) {
  const ModelShape& m = input.model;
  const Layout& l = input.layout;
  const std::int64_t e = input.precision.activation_bytes, t = l.tp;
  const std::int64_t N = static_cast<std::int64_t>(l.microbatch) * m.seq, h = m.hidden;
  const std::int64_t shared_div = l.sequence_parallel ? t : 1;
  if (l.recompute == Recompute::full) return N * h * e / shared_div;
  // Held whole by every TP rank (sharded under sequence parallelism): the
  // inputs of the two norms, of q/k/v and of the MLP, and the dropout masks.
  std::int64_t shared = 4 * N * h * e + (m.dropout ? 2 * N * h : 0);
  // Sharded by t: q, k, v, the attention output and the MLP's hidden tensors.
  std::int64_t sharded = (2 * N * h + 2 * N * kv_width(m)) * e;  // q and output; k and v
  sharded += (m.gated_mlp ? 3 : 2) * N * m.ffn * e;
  std::int64_t scores = 0;
  if (l.recompute == Recompute::none) {
    const std::int64_t s2 = static_cast<std::int64_t>(l.microbatch) * m.heads * m.seq * m.seq;
    scores = s2 * e + (m.dropout ? s2 * (1 + e) : 0);
  }
  return shared / shared_div + (sharded + scores) / t;
}

namespace {

// Micro-batches (x chunks) holding activations at once on @p stage.
int alive_at_peak(const ch05::Schedule& schedule, int stage) {
  return ch05::peak_alive(schedule.actions[static_cast<std::size_t>(stage)],
                          schedule.split_backward);
}

std::int64_t ceil_divide(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

}  // namespace

Memory stage_memory(const PlanInput& input, int stage) {
  return stage_memory_under(input, stage, layout_schedule(input));
}

Memory stage_memory_under(const PlanInput& input, int stage, const ch05::Schedule& schedule) {
  const ModelShape& m = input.model;
  const Layout& l = input.layout;
  const Precision& p = input.precision;
  const std::vector<ch05::UnitRange> ranges = stage_units(input);
  std::int64_t params = 0, largest_unit = 0, blocks_in_chunk = 0;
  bool holds_head = false;
  for (int c = 0; c < l.chunks; ++c) {
    const ch05::UnitRange& range = ranges[static_cast<std::size_t>(c * l.pp + stage)];
    std::int64_t blocks = 0;
    for (int u = range.first; u < range.first + range.count; ++u) {
      const std::int64_t n = unit_parameters_per_rank(m, u, l.tp);
      params += n;
      largest_unit = std::max(largest_unit, n);
      if (u >= 1 && u <= m.layers) ++blocks;
      if (u == m.layers + 1) holds_head = true;
    }
    blocks_in_chunk = std::max(blocks_in_chunk, blocks);
  }
  Memory memory;
  memory.params = params * p.param_bytes;
  memory.grads = params * p.grad_bytes;
  memory.optimizer = params * p.optimizer_bytes;
  if (l.zero >= 1) memory.optimizer = ceil_divide(params, l.dp) * p.optimizer_bytes;
  if (l.zero == 3) {
    // The shards, plus one unit's gathered parameters and gradient.
    memory.params = (ceil_divide(params, l.dp) + largest_unit) * p.param_bytes;
    memory.grads = (ceil_divide(params, l.dp) + largest_unit) * p.grad_bytes;
  }
  if (m.runtime_kernels) {
    memory.activations = runtime_activation_peaks(input, stage, schedule).combined;
    return memory;
  }
  const std::int64_t per_block = block_activation_bytes_per_rank(input);
  memory.activations = alive_at_peak(schedule, stage) * blocks_in_chunk * per_block;
  if (l.recompute != Recompute::none) {
    // The block whose backward runs holds what recomputation made again.
    PlanInput plain = input;
    plain.layout.recompute = Recompute::none;
    memory.activations += block_activation_bytes_per_rank(plain) - per_block;
  }
  if (holds_head) {  // one micro-batch's logits slice
    memory.activations += static_cast<std::int64_t>(l.microbatch) * m.seq *
                          (m.padded_vocab(l.tp) / l.tp) * p.activation_bytes;
  }
  return memory;
}

// --- what one rank sends -------------------------------------------------------------

std::vector<CollectiveCall> tensor_parallel_unit_collectives(const ModelShape& m, int unit,
                                                             Pass pass, std::int64_t tokens,
                                                             int element, bool sp) {
  const std::int64_t hidden = tokens * m.hidden * element;  // one [N, h] activation
  const CollectiveCall all_reduce{"all_reduce", hidden}, gather{"all_gather", hidden},
      scatter{"reduce_scatter", hidden};
  // A column-parallel linear followed by a row-parallel one: attention, the MLP.
  const std::vector<CollectiveCall> pair =
      sp ? std::vector<CollectiveCall>{gather, scatter} : std::vector<CollectiveCall>{all_reduce};
  std::vector<CollectiveCall> calls;
  if (unit == 0) {  // vocabulary-parallel embedding: partial sums forward
    if (pass == Pass::forward) calls.push_back(sp ? scatter : all_reduce);
    if (pass == Pass::backward && sp) calls.push_back(gather);
    return calls;
  }
  if (unit == m.layers + 1) {  // norm, column-parallel LM head, vocabulary-parallel loss
    if (pass == Pass::forward) {
      if (sp) calls.push_back(gather);
      calls.push_back({"all_reduce", tokens * element});      // each row's max
      calls.push_back({"all_reduce", 2 * tokens * element});  // sum of exp and target logit
    }
    if (pass == Pass::backward) calls.push_back(sp ? scatter : all_reduce);
    if (pass == Pass::reduction && sp)
      for (int i = 0; i < (m.biases ? 2 : 1); ++i)
        calls.push_back({"all_reduce", static_cast<std::int64_t>(m.hidden) * element});
    return calls;
  }
  if (pass == Pass::reduction) {
    if (sp)
      for (std::int64_t size : replicated_block_parameters(m))
        calls.push_back({"all_reduce", size * element});
    return calls;
  }
  // Forward: attention then the MLP; backward: the MLP then attention. Each
  // pair is the same forward and backward (AR; or AG then RS).
  for (int sublayer = 0; sublayer < 2; ++sublayer)
    calls.insert(calls.end(), pair.begin(), pair.end());
  return calls;
}

std::int64_t boundary_bytes(const PlanInput& input) {
  const Layout& l = input.layout;
  const std::int64_t tokens = static_cast<std::int64_t>(l.microbatch) * input.model.seq;
  return tokens * input.model.hidden * input.precision.activation_bytes /
         (l.sequence_parallel ? l.tp : 1);
}

double forward_flops_per_token(const ModelShape& m) {
  const double h = m.hidden;
  const double matrices = 2 * h * h + 2 * h * static_cast<double>(kv_width(m)) +
                          (m.gated_mlp ? 3 : 2) * h * static_cast<double>(m.ffn);
  return m.layers * (2 * matrices + 4.0 * m.seq * h) + 2 * h * static_cast<double>(m.vocab);
}

}  // namespace dtp::plan
