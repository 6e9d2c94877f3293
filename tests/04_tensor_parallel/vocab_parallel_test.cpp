// Puzzles 4.5 and 4.6: the vocabulary split over ranks. The token ids sit on
// every slice edge for t = 1 to 4, so a mask that is off by one shows, and
// the message says which id and which ranks. The loss also gets logits near
// +-1000 (exp() overflows unless every rank subtracts the row's global max)
// and a batch of a single row, and a wrongly scaled gradient is decoded.
#include "tp_checks.h"

namespace dtp::testing::ch04 {
namespace {

// 12 ids: the first and last id of every rank's slice for t = 1, 2, 3 and 4
// (slices of 24, 12, 8 and 6 ids).
const std::vector<double> kEdgeIds = {0, 5, 6, 7, 8, 11, 12, 15, 16, 17, 18, 23};

// Token ids i32 [rows, cols] on @p on.
Tensor ids_of(const std::vector<double>& ids, std::int64_t rows, std::int64_t cols, Device on) {
  return Tensor::from_values(ids, DType::i32, on).view(Shape{rows, cols});
}

// Which rank's slice id falls in, as "rank 2's slice [12, 18)".
std::string slice_of(std::int64_t id, int t) {
  const std::int64_t n = kVocab / t, r = id / n;
  return "rank " + std::to_string(r) + "'s slice [" + std::to_string(r * n) + ", " +
         std::to_string(r * n + n) + ")";
}

// Decodes row `row` of an embedding output: the token's row looked up twice,
// never, or the positions counted t times.
std::string decode_row(std::int64_t row, std::int64_t position, const std::vector<double>& got,
                       const std::vector<double>& token_table,
                       const std::vector<double>& position_table, int t, const Closeness& within) {
  const auto id = static_cast<std::int64_t>(kEdgeIds[static_cast<std::size_t>(row)]);
  auto row_is = [&](double token_times, double position_times) {
    for (std::int64_t c = 0; c < kC; ++c) {
      const double want = token_times * token_table[id * kC + c] +
                          position_times * position_table[position * kC + c];
      if (!within.holds(want, got[row * kC + c])) return false;
    }
    return true;
  };
  const std::string where = "token id " + std::to_string(id) + " (in " + slice_of(id, t) +
                            ") at token " + std::to_string(row) + ": ";
  if (row_is(2, 1))
    return where +
           "its row came twice: two ranks looked it up. Is a slice's upper bound inclusive, or its "
           "start off by one?";
  if (row_is(0, 1))
    return where +
           "only the position: no rank looked it up. Is a slice edge excluded (off by one)?";
  if (row_is(1, t))
    return where + "the position " + std::to_string(t) +
           " times: add the replicated positions on one rank only, before the reduction";
  if (row_is(1, 0)) return where + "no position added";
  return "";
}

std::string embedding_on(Comm& comm, bool sp) {
  const int t = comm.size(), r = comm.rank();
  const Device on = comm.device();
  const DType dtype = checker_dtype(on);
  const Closeness within = embedding_tolerance(dtype);
  const GPTConfig config = layer_config(on);
  Embedding serial(config);
  Tensor ids = ids_of(kEdgeIds, kB, kT, on);
  const std::vector<double> dx_values = values(random_tensor(Shape{kB, kT, kC}, 51, on));
  EmbeddingSaved serial_saved;
  const std::vector<double> y_full = values(serial.forward(ids, serial_saved));
  serial.backward(tensor_of(dx_values, Shape{kB, kT, kC}, on), serial_saved);

  VocabParallelEmbedding layer(comm, config, sp);
  const std::int64_t n = kVocab / t;
  layer.tokens = tensor_of(rows_of(values(serial.tokens), kC, r * n, n), Shape{n, kC}, on);
  layer.tokens_grad = Tensor::zeros(Shape{n, kC}, dtype, on);
  layer.positions = serial.positions.clone();
  layer.positions_grad = Tensor::zeros(serial.positions.shape(), dtype, on);
  VocabParallelEmbeddingSaved saved;
  const CommStats s0 = comm.stats();
  Tensor y = layer.forward(ids, saved);
  const CommStats s1 = comm.stats();
  Tensor dx = sp ? tensor_of(my_tokens(dx_values, kC, t, r), Shape{kN / t, kC}, on)
                 : tensor_of(dx_values, Shape{kB, kT, kC}, on);
  layer.backward(dx, saved);
  const CommStats s2 = comm.stats();

  std::string m;
  // The forward, row by row for a decoded message.
  const std::vector<double> got = values(y);
  const std::vector<double> want = sp ? my_tokens(y_full, kC, t, r) : y_full;
  std::string forward =
      check_values(std::string("4.5 embedding output") + (sp ? " (this rank's tokens)" : ""), r,
                   want, got, within);
  if (!forward.empty() && got.size() == want.size()) {
    const std::int64_t first_token = sp ? r * (kN / t) : 0;
    for (std::int64_t row = 0; row < static_cast<std::int64_t>(got.size()) / kC; ++row) {
      bool wrong = false;
      for (std::int64_t c = 0; c < kC; ++c)
        wrong = wrong || !within.holds(want[row * kC + c], got[row * kC + c]);
      if (!wrong) continue;
      std::vector<double> full_row_view(static_cast<std::size_t>(kN * kC), 0.0);
      std::copy(got.begin(), got.end(), full_row_view.begin() + first_token * kC);
      const std::string why =
          decode_row(first_token + row, (first_token + row) % kT, full_row_view,
                     values(serial.tokens), values(serial.positions), t, within);
      if (!why.empty()) forward += "\n      = " + why;
      break;
    }
  }
  m += forward;
  const std::vector<double> token_grad = rows_of(values(serial.tokens_grad), kC, r * n, n);
  m += check_values("4.5 token-table gradient (this rank's rows)", r, token_grad,
                    values(layer.tokens_grad), within,
                    {{std::to_string(t) +
                          "x the gradient: dx was all-reduced in backward, but it is already whole "
                          "on every rank",
                      times(token_grad, t)}});
  m += check_values("4.5 positions gradient (replicated: the same on every rank)", r,
                    values(serial.positions_grad), values(layer.positions_grad), within,
                    {{"0: every rank must add dx into the replicated positions' gradient (only the "
                      "forward adds the "
                      "positions on one rank)",
                      times(values(serial.positions_grad), 0)},
                     {std::to_string(t) +
                          "x the gradient: dx was all-reduced in backward, but it is already whole "
                          "on every rank",
                      times(values(serial.positions_grad), t)}});
  const std::int64_t bytes = kN * kC * element_bytes(on);
  if (!sp) {
    m += check_comm("4.5 forward", r, comm_use(s0, s1), {{"all_reduce", 1}}, bytes,
                    "one all-reduce of the partial lookups [B, T, C]");
    m += check_comm("4.5 backward", r, comm_use(s1, s2), {}, 0,
                    "the backward needs no communication: dx is already whole on every rank");
  } else {
    m += check_comm("4.5 sequence-parallel forward", r, comm_use(s0, s1), {{"reduce_scatter", 1}},
                    bytes, "one reduce-scatter of the partial lookups into this rank's tokens");
    m += check_comm("4.5 sequence-parallel backward", r, comm_use(s1, s2), {{"all_gather", 1}},
                    bytes, "one all-gather of dx's tokens");
  }
  return m;
}

// --- 4.6 -------------------------------------------------------------------------------

// One loss problem: the whole logits [B*T, V] (each rank takes its columns),
// the targets and the loss_scale (0.3: no 1/t, so a wrong scale has one cause).
// The logits are values the checkers' dtype holds exactly (random_tensor's,
// or rounded by stored_logits), so the serial loss, the rank's slice and the
// predicted mistakes all start from the same numbers.
struct LossCase {
  std::int64_t B = kB, T = kT;
  std::vector<double> logits;   // [B*T, V], row-major
  std::vector<double> targets;  // B*T token ids
  double loss_scale = 0.3;
};

// One rank's VocabParallelCrossEntropy next to the serial loss of the whole logits.
struct LossRun {
  double expected_loss = 0, got_loss = 0;
  std::vector<double> expected_grad, got_grad;  // this rank's columns [B*T, V/t]
  CommUse forward, backward;
  std::int64_t held = 0;  // the most bytes allocated during the loss
  DType dtype = DType::f64;
  Closeness loss_within, gradient_within;  // loss_tolerance, loss_gradient_tolerance
  // What this rank returns when every rank subtracts its own slice's max
  // instead of the row's global max: the loss log(S) + m_r - target logit,
  // with S the sum over ranks of exp(logit - that rank's max), and the
  // gradient of this rank's columns.
  double own_max_loss = 0;
  std::vector<double> own_max_grad;
};

void predict_own_max(const LossCase& c, int t, int r, LossRun& run) {
  const std::int64_t N = c.B * c.T, n = kVocab / t;
  run.own_max_grad.assign(static_cast<std::size_t>(N * n), 0.0);
  double total = 0;
  for (std::int64_t row = 0; row < N; ++row) {
    const double* l = &c.logits[static_cast<std::size_t>(row * kVocab)];
    std::vector<double> max(static_cast<std::size_t>(t));
    double sum = 0;
    for (int q = 0; q < t; ++q) {
      max[q] = *std::max_element(l + q * n, l + q * n + n);
      for (std::int64_t j = q * n; j < q * n + n; ++j) sum += std::exp(l[j] - max[q]);
    }
    const auto target = static_cast<std::int64_t>(c.targets[static_cast<std::size_t>(row)]);
    total += std::log(sum) + max[r] - l[target];
    for (std::int64_t j = 0; j < n; ++j) {
      const std::int64_t id = r * n + j;
      run.own_max_grad[static_cast<std::size_t>(row * n + j)] =
          c.loss_scale / static_cast<double>(N) *
          (std::exp(l[id] - max[r]) / sum - (id == target ? 1.0 : 0.0));
    }
  }
  run.own_max_loss = total / static_cast<double>(N);
}

// @p logits as checker_dtype(on) stores them: f32 rounds each (1000.3 to a
// multiple of 2^-14), f64 keeps them.
std::vector<double> stored_logits(const std::vector<double>& logits, Device on) {
  return values(tensor_of(logits, Shape{static_cast<std::int64_t>(logits.size())}, on));
}

// Said when the loss equals what each rank's own slice max gives.
const char* const kOwnMax =
    "looks like each rank subtracted its own slice's max: the row max must be the global one "
    "over every vocab shard (ops::row_max on this slice, then all_reduce with ReduceOp::max), "
    "the same m_n on every rank";

LossRun run_loss(Comm& comm, const LossCase& c) {
  const int t = comm.size(), r = comm.rank();
  const Device on = comm.device();
  const std::int64_t n = kVocab / t;
  Tensor targets = ids_of(c.targets, c.B, c.T, on);
  LossRun run;
  run.dtype = checker_dtype(on);
  double largest_logit = 0;
  for (double l : c.logits) largest_logit = std::max(largest_logit, std::fabs(l));
  run.loss_within = loss_tolerance(run.dtype, largest_logit);
  run.gradient_within = loss_gradient_tolerance(run.dtype, largest_logit,
                                                c.loss_scale / static_cast<double>(c.B * c.T));
  {
    CrossEntropy serial;
    CrossEntropySaved saved;
    run.expected_loss =
        serial.forward(tensor_of(c.logits, Shape{c.B, c.T, kVocab}, on), targets, saved);
    run.expected_grad = columns_of(values(serial.backward(saved, c.loss_scale)), kVocab, r * n, n);
  }
  std::shared_ptr<MemoryTracker> tracker = current_memory_tracker();
  const std::int64_t before = tracker->total_live();
  tracker->reset_peaks();
  Tensor slice = tensor_of(columns_of(c.logits, kVocab, r * n, n), Shape{c.B, c.T, n}, on);
  VocabParallelCrossEntropy loss(comm, kVocab);
  VocabParallelCrossEntropySaved saved;
  const CommStats s0 = comm.stats();
  run.got_loss = loss.forward(slice, targets, saved);
  const CommStats s1 = comm.stats();
  run.got_grad = values(loss.backward(saved, c.loss_scale));
  const CommStats s2 = comm.stats();
  run.held = tracker->total_peak() - before;
  run.forward = comm_use(s0, s1);
  run.backward = comm_use(s1, s2);
  predict_own_max(c, t, r, run);
  return run;
}

// What a gradient `ratio` times the right one means, for N rows and loss_scale s on t ranks,
// fitted from gradients of @p dtype; "" when no known mistake gives that ratio.
std::string explain_gradient_scale(double ratio, int t, std::int64_t N, double s, DType dtype) {
  const auto near = [ratio, dtype](double x) {
    return std::fabs(ratio - x) <= ratio_tolerance(dtype) * std::fabs(x);
  };
  const std::string rows = "N = B*T = " + std::to_string(N) + " rows";
  if (N > 1 && near(static_cast<double>(N)))
    return "looks like loss_scale is missing its 1/N (" + rows +
           "): the gradient of the MEAN loss is loss_scale / N times (softmax - onehot)";
  if (N > 1 && near(1.0 / static_cast<double>(N)))
    return "looks like the 1/N was applied twice (" + rows + ")";
  if (near(1.0 / s))
    return "looks like loss_scale (" + number(s) + ") was left out: it multiplies the gradient";
  if (near(static_cast<double>(N) / s))
    return "looks like loss_scale / N was left out: softmax - onehot alone";
  if (near(s)) return "looks like loss_scale was applied twice";
  if (t > 1 && near(t))
    return "looks like the gradient was summed over the " + std::to_string(t) +
           " ranks: the backward needs no communication";
  return "";
}

// "" or the gradient's first wrong element as (row, token id), with the
// cause decoded: each rank's own max, or a scale (blamed on the scale only
// while the loss is right: a wrong loss's max or sums scale the gradient too).
std::string check_loss_gradient(const std::string& what, int rank, int t, const LossCase& c,
                                const LossRun& run) {
  const Closeness& within = run.gradient_within;
  std::string m = check_values(what, rank, run.expected_grad, run.got_grad, within);
  if (m.empty() || run.got_grad.size() != run.expected_grad.size()) return m;
  const std::int64_t n = kVocab / t;
  std::size_t first = 0;
  while (within.holds(run.expected_grad[first], run.got_grad[first])) ++first;
  m += "\n      = row " + std::to_string(first / n) + ", token id " +
       std::to_string(rank * n + static_cast<std::int64_t>(first) % n);
  if (t > 1 && all_close(run.own_max_grad, run.got_grad, within))
    return m +
           "; looks like each rank subtracted its own slice's max, not the row's global max "
           "(all_reduce with ReduceOp::max)";
  const double ratio = uniform_ratio(run.expected_grad, run.got_grad, within);
  if (ratio == 0) return m;
  std::string why = explain_gradient_scale(ratio, t, c.B * c.T, c.loss_scale, run.dtype);
  if (why.empty())
    why = run.loss_within.holds(run.expected_loss, run.got_loss)
              ? "a wrong scale factor"
              : "the loss is wrong too; fix it first (the gradient reuses its row max and sums)";
  return m + "; gradients are " + times_text(ratio) + " the expected: " + why;
}

std::string cross_entropy_on(Comm& comm) {
  const int t = comm.size(), r = comm.rank();
  const Device on = comm.device();
  const std::int64_t n = kVocab / t, element = element_bytes(on);
  LossCase c;
  c.logits = values(random_tensor(Shape{kN, kVocab}, 61, on, -4.0, 4.0));
  c.targets = kEdgeIds;
  const LossRun run = run_loss(comm, c);
  std::string m;
  if (!run.loss_within.holds(run.expected_loss, run.got_loss))
    m += "\n    rank " + std::to_string(r) + ": 4.6 loss: expected " + number(run.expected_loss) +
         ", got " + number(run.got_loss) +
         (t > 1 && run.loss_within.holds(run.own_max_loss, run.got_loss)
              ? std::string(": ") + kOwnMax
              : std::string(". The three steps: the max over the WHOLE vocabulary (all-reduce "
                            "with ReduceOp::max), then the sums of exp(logit - max) and the "
                            "target logits over all ranks (all-reduce, sum), then the mean of "
                            "log(sum) + max - target logit"));
  m += check_loss_gradient("4.6 logits gradient (this rank's vocabulary slice, loss_scale 0.3)", r,
                           t, c, run);
  const bool only_small_all_reduces =
      run.forward.calls.size() == 1 && run.forward.count("all_reduce") >= 2 &&
      run.forward.count("all_reduce") <= 3 && run.forward.bytes <= 3 * kN * element;
  if (!only_small_all_reduces)
    m += "\n    rank " + std::to_string(r) + ": 4.6 forward made " + run.forward.str() +
         ", expected 2 or 3 all-reduces of per-row numbers (at most 3 x N x " +
         std::to_string(element) + " = " + std::to_string(3 * kN * element) +
         " bytes): the max, the sum of exponentials and the target logit of each of the N rows; "
         "nothing of the vocabulary's size";
  m += check_comm("4.6 backward", r, run.backward, {}, 0,
                  "the gradient of a slice needs only that slice and the row statistics");
  if (t > 1 && run.held >= kN * kVocab * element)
    m += "\n    rank " + std::to_string(r) + ": 4.6 held " + std::to_string(run.held) +
         " bytes during the loss (its logits slice included), as much as one whole [B, T, V] "
         "logits tensor (" +
         std::to_string(kN * kVocab * element) +
         " bytes): a rank must never build the full logits. Expected about the slice (" +
         std::to_string(kN * n * element) + ") plus a few numbers per row";
  return m;
}

// Logits whose exponentials overflow to inf (or all underflow to 0) unless
// every rank subtracts the same row max, the max over the whole vocabulary.
// Rows take turns: one logit raised by 1000 (on a different slice each
// time), ids [18, 24) raised by 1000 (the last rank's slice: rank 0's own max
// is ~1000 below the row's), and the whole row lowered by 1000. The test
// means the same in f32: exp(1000) overflows f32 (above 88.7) as it does f64
// (above 709.8), and exp(-1000) underflows both to 0.
LossCase large_logits_case(Device on) {
  LossCase c;
  c.logits = values(random_tensor(Shape{kN, kVocab}, 62, on, -4.0, 4.0));
  c.targets = kEdgeIds;
  for (std::int64_t row = 0; row < kN; ++row) {
    double* l = &c.logits[static_cast<std::size_t>(row * kVocab)];
    if (row % 3 == 0) l[(7 * row + 5) % kVocab] += 1000;
    for (std::int64_t id = 0; id < kVocab; ++id) {
      if (row % 3 == 1 && id >= 18) l[id] += 1000;
      if (row % 3 == 2) l[id] -= 1000;
    }
  }
  c.logits = stored_logits(c.logits, on);
  return c;
}

std::string large_logits_on(Comm& comm) {
  const int t = comm.size(), r = comm.rank();
  const LossCase c = large_logits_case(comm.device());
  const LossRun run = run_loss(comm, c);
  const std::string why =
      "\n      the max must be the global one over every vocab shard: ops::row_max on this "
      "slice, then all_reduce with ReduceOp::max, and every rank subtracts that same m_n "
      "before exp (exp(1000) overflows to inf; exp(-1000) underflows to 0, and log(0) = -inf)";
  std::string m;
  if (!run.loss_within.holds(run.expected_loss, run.got_loss))
    m += "\n    rank " + std::to_string(r) + ": 4.6 loss of logits near +-1000: expected " +
         number(run.expected_loss) + ", got " + number(run.got_loss) +
         (std::isfinite(run.got_loss) ? "" : " (not finite: exp() overflowed or log(0))") + why;
  std::string gradient = check_loss_gradient(
      "4.6 logits gradient of logits near +-1000 (this rank's slice)", r, t, c, run);
  if (!gradient.empty() && run.got_grad.size() == run.expected_grad.size()) {
    std::size_t first = 0;
    while (run.gradient_within.holds(run.expected_grad[first], run.got_grad[first])) ++first;
    const std::int64_t row = static_cast<std::int64_t>(first) / (kVocab / t);
    const auto begin = c.logits.begin() + row * kVocab;
    const std::int64_t top = std::max_element(begin, begin + kVocab) - begin;
    // A uniform scale with the right loss is decoded as a scale alone.
    if (!m.empty() || uniform_ratio(run.expected_grad, run.got_grad, run.gradient_within) == 0)
      gradient += "; that row's max, " + number(*(begin + top)) + ", is token id " +
                  std::to_string(top) + " on rank " + std::to_string(top / (kVocab / t)) +
                  "'s slice" + (m.empty() ? why : "");
  }
  return m + gradient;
}

// B*T = 1: a single row, whose max is on the last rank's slice and whose target on rank 0's.
std::string single_row_on(Comm& comm) {
  const int t = comm.size(), r = comm.rank();
  LossCase c;
  c.B = 1, c.T = 1;
  c.logits = values(random_tensor(Shape{1, kVocab}, 63, comm.device(), -2.0, 2.0));
  c.logits[kVocab - 1] = 3.0;
  c.targets = {0};
  const LossRun run = run_loss(comm, c);
  std::string m;
  if (!run.loss_within.holds(run.expected_loss, run.got_loss))
    m += "\n    rank " + std::to_string(r) + ": 4.6 loss of a single row (B = T = 1): expected " +
         number(run.expected_loss) + ", got " + number(run.got_loss) +
         (t > 1 && run.loss_within.holds(run.own_max_loss, run.got_loss)
              ? std::string(": ") + kOwnMax
              : std::string(". With N = B*T = 1 the mean is that one row's loss: every row "
                            "counted once, the sum divided by B*T"));
  return m + check_loss_gradient("4.6 logits gradient of a single row (B = T = 1)", r, t, c, run);
}

TEST(Puzzle4_5_vocab_parallel_embedding, EqualsTheSerialEmbeddingAtEverySliceEdge) {
  expect_refusal_on_4_ranks(
      [](Comm& tp) {
        GPTConfig config = layer_config(tp.device());
        config.vocab_size = 10;
        VocabParallelEmbedding(tp, config, false);
      },
      "vocabulary: 10 do not split over 4 tensor-parallel ranks");
  for (bool sp : {false, true})
    for (int t : tp_sizes())
      run_and_report(
          std::string("4.5 VocabParallelEmbedding, ") + (sp ? "sequence-parallel" : "plain"), t,
          [sp](Comm& comm) { return embedding_on(comm, sp); });
}

TEST(Puzzle4_6_vocab_parallel_cross_entropy, EqualsTheSerialLossWithoutTheFullLogits) {
  expect_refusal_on_4_ranks([](Comm& tp) { VocabParallelCrossEntropy(tp, 10); },
                            "vocabulary: 10 do not split over 4 tensor-parallel ranks");
  for (int t : tp_sizes())
    run_and_report("4.6 VocabParallelCrossEntropy", t,
                   [](Comm& comm) { return cross_entropy_on(comm); });
}

TEST(Puzzle4_6_vocab_parallel_cross_entropy, StaysFiniteWhenTheRowMaxIsOnAnotherRank) {
  for (int t : tp_sizes())
    run_and_report("4.6 VocabParallelCrossEntropy, logits near +-1000", t,
                   [](Comm& comm) { return large_logits_on(comm); });
}

TEST(Puzzle4_6_vocab_parallel_cross_entropy, ASingleRowIsItsOwnMean) {
  for (int t : tp_sizes())
    run_and_report("4.6 VocabParallelCrossEntropy, B*T = 1", t,
                   [](Comm& comm) { return single_row_on(comm); });
}

}  // namespace
}  // namespace dtp::testing::ch04
