// The planner's activations for the runtime's GPT (ModelShape::runtime_kernels),
// to the byte: the tensors chapter 04's reference units allocate as
// MemoryCategory::activations on the runtime's layers (runtime/src/nn/layers.cpp),
// when each is freed, and the order in which chapter 05's executor runs a
// rank's actions (reference/05_pipeline/executor.cpp, drivers/05_pipeline/
// stage_module.cpp, the 3D runner of drivers/12_3d_parallelism/three_d_model.cpp).
//
// Sizes are in elements of one micro-batch on one TP rank, with b sequences
// of s tokens, N = b s, t TP ranks, n = N / t under sequence parallelism (a
// rank's token shard of the residual stream) and N without it, C the width,
// a heads, F the MLP width and V the vocabulary.
//
// A block keeps (the serial table of dtp/activation_memory.h, split by t):
//
//     LayerNorm 1 and 2   mean and rstd per token               4 n
//     q, k and v's input  ln1 output; under SP its gathered copy  n C | N C
//     q, k, v             this rank's heads                     3 N C / t
//     attention output    the projection's input                N C / t
//     probabilities       naive attention                       b (a/t) s^2
//     (or row max, sum)   flash attention                       2 b (a/t) s
//     x + attention       ln2's input                           n C
//     fc's input          ln2 output; under SP its gathered copy  n C | N C
//     fc, GELU outputs    this rank's hidden units              2 N F / t
//     block output        the next unit's input                 n C
//
// Under sequence parallelism ln1's and ln2's own [n, C] outputs are dropped
// once gathered; each row-parallel projection writes an [N, C] partial sum
// and reduce-scatters it into an [n, C] output. The block's forward is at
// its fullest in the MLP's reduce-scatter: all it keeps, plus ln2's [n, C]
// output and the [N, C] partial sum.
#include <algorithm>

#include "drivers/12_3d_parallelism/plan.h"
#include "dtp/error.h"

namespace dtp::plan {

namespace {

// One unit's forward for one micro-batch, in elements.
struct UnitActivations {
  std::int64_t kept = 0;  // held until its backward, its output included
  std::int64_t peak = 0;  // the most its forward holds at once: kept + transients
};

struct Sizes {
  std::int64_t N = 0, n = 0, C = 0;
  std::int64_t heads_width = 0;  // C / t: q, k, v and the attention output
  std::int64_t ffn_width = 0;    // F / t
  std::int64_t vocab_width = 0;  // V / t: the logits
  std::int64_t attention = 0;    // probabilities, or flash's row max and sum
  bool sp = false;
};

Sizes sizes_of(const PlanInput& input) {
  const ModelShape& m = input.model;
  const Layout& l = input.layout;
  Sizes z;
  z.N = static_cast<std::int64_t>(l.microbatch) * m.seq;
  z.sp = l.sequence_parallel;
  z.n = l.sequence_parallel ? z.N / l.tp : z.N;
  z.C = m.hidden;
  z.heads_width = z.C / l.tp;
  z.ffn_width = m.ffn / l.tp;
  z.vocab_width = m.padded_vocab(l.tp) / l.tp;
  const std::int64_t sequence_heads = static_cast<std::int64_t>(l.microbatch) * (m.heads / l.tp);
  z.attention = m.flash_attention ? 2 * sequence_heads * m.seq : sequence_heads * m.seq * m.seq;
  return z;
}

// A block that keeps everything (the table above).
UnitActivations block(const Sizes& z) {
  const std::int64_t norm_stats = 4 * z.n;
  const std::int64_t linear_inputs = 2 * (z.sp ? z.N : z.n) * z.C;  // q/k/v's and fc's
  const std::int64_t heads = 4 * z.N * z.heads_width + z.attention;
  const std::int64_t residual = 2 * z.n * z.C;  // x + attention, the block output
  const std::int64_t mlp = 2 * z.N * z.ffn_width;
  UnitActivations u;
  u.kept = norm_stats + linear_inputs + heads + residual + mlp;
  // In the MLP's reduce-scatter: ln2's own output and the partial sum.
  u.peak = u.kept + (z.sp ? z.n * z.C + z.N * z.C : 0);
  return u;
}

// The vocabulary-parallel embedding: its output. Under SP it first fills
// an [N, C] partial sum, then reduce-scatters it into the [n, C] output.
UnitActivations embedding(const Sizes& z) {
  UnitActivations u;
  u.kept = z.n * z.C;
  u.peak = u.kept + (z.sp ? z.N * z.C : 0);
  return u;
}

// The head: the final LayerNorm's mean and rstd (2 n), the LM head's input
// (ln's [N, C] output, or under SP its gathered copy, ln's own [n, C]
// output dropped after the loss), this rank's logits (N V/t), and the loss's
// row max (N) and [2N] sums. It returns no tensor.
UnitActivations head(const Sizes& z) {
  UnitActivations u;
  u.kept = 2 * z.n + z.N * z.C + z.N * z.vocab_width + 3 * z.N;
  u.peak = u.kept + (z.sp ? z.n * z.C : 0);
  return u;
}

// One micro-batch on one virtual stage, in elements.
struct StageActivations {
  std::int64_t forward_peak = 0;  // what its F holds at once: input, then units
  std::int64_t kept = 0;          // held from its F to its B
  std::int64_t recompute = 0;     // a recomputed block's forward made again in the B
  std::int64_t freed_first = 0;   // freed by the head's backward before any recomputation
};

StageActivations virtual_stage(const PlanInput& input, const ch05::UnitRange& range, bool first) {
  const ModelShape& m = input.model;
  const bool full = input.layout.recompute == Recompute::full;
  const Sizes z = sizes_of(input);
  const std::int64_t boundary = z.n * z.C;  // a received activation, or a unit's output
  StageActivations s;
  // The received input is kept by the first unit (the first stage reads tokens).
  const std::int64_t input_bytes = first ? 0 : boundary;
  std::int64_t kept = input_bytes, peak = input_bytes, last_input = input_bytes;
  bool ends_with_head = false;
  for (int u = range.first; u < range.first + range.count; ++u) {
    UnitActivations a;
    if (u == 0) {
      a = embedding(z);
    } else if (u == m.layers + 1) {
      a = head(z);
      ends_with_head = true;
      s.freed_first = a.kept + last_input;  // and ln's input: the unit before's output
    } else {
      a = block(z);
      if (full) {
        // Keeps its input alone (counted as the unit before's output);
        // what its forward saved is freed as it returns.
        s.recompute = a.peak;
        a.kept = boundary;
      }
    }
    peak = std::max(peak, kept + a.peak);
    kept += a.kept;
    last_input = boundary;
  }
  // A stage's last output is sent and dropped; the head's loss is a number.
  s.kept = ends_with_head ? kept : kept - boundary;
  s.forward_peak = peak;
  return s;
}

}  // namespace

ActivationPeaks runtime_activation_peaks(const PlanInput& input, int stage,
                                         const ch05::Schedule& schedule) {
  const Layout& l = input.layout;
  DTP_CHECK(input.model.runtime_kernels, "runtime_activation_peaks: model '", input.model.name,
            "' is not the runtime's GPT (runtime_kernels is false)");
  DTP_CHECK(stage >= 0 && stage < l.pp && schedule.stages == l.pp && schedule.chunks == l.chunks,
            "runtime_activation_peaks: stage ", stage, " of a schedule of ", schedule.stages,
            " stages x ", schedule.chunks, " chunks, layout pp ", l.pp, " x chunks ", l.chunks);
  const std::vector<ch05::UnitRange> ranges = stage_units(input);
  std::vector<StageActivations> chunks;
  for (int c = 0; c < l.chunks; ++c) {
    const int v = schedule.virtual_stage(stage, c);
    chunks.push_back(virtual_stage(input, ranges[static_cast<std::size_t>(v)], v == 0));
  }
  // Elements live on the rank; each action in its list's order.
  std::int64_t live = 0, activations = 0, recompute = 0, combined = 0;
  for (const ch05::Action& a : schedule.actions[static_cast<std::size_t>(stage)]) {
    const StageActivations& s = chunks[static_cast<std::size_t>(a.chunk)];
    if (a.kind == ch05::ActionKind::forward) {
      activations = std::max(activations, live + s.forward_peak);
      live += s.kept;
      continue;
    }
    if (a.kind == ch05::ActionKind::backward && s.recompute > 0) {
      // Blocks recompute one at a time, after the head (if here) freed its part.
      recompute = std::max(recompute, s.recompute);
      combined = std::max(combined, live - s.freed_first + s.recompute);
    }
    const bool frees = a.kind == ch05::ActionKind::weight || !schedule.split_backward;
    if (frees) live -= s.kept;
  }
  const std::int64_t e = input.precision.activation_bytes;
  ActivationPeaks peaks;
  peaks.activations = activations * e;
  peaks.recompute = recompute * e;
  peaks.combined = std::max(activations, combined) * e;
  return peaks;
}

}  // namespace dtp::plan
