// Puzzles 4.5 and 4.6: the vocabulary split over ranks. The token ids sit on
// every slice edge for t = 1 to 4, so a mask that is off by one shows, and
// the message says which id and which ranks.
#include "tp_checks.h"

namespace dtp::testing::ch04 {
namespace {

// 12 ids: the first and last id of every rank's slice for t = 1, 2, 3 and 4
// (slices of 24, 12, 8 and 6 ids).
const std::vector<double> kEdgeIds = {0, 5, 6, 7, 8, 11, 12, 15, 16, 17, 18, 23};

Tensor edge_ids() {
  Tensor ids = Tensor::empty(Shape{kB, kT}, DType::i32);
  for (std::int64_t i = 0; i < kN; ++i) ids.set_item(i, kEdgeIds[static_cast<std::size_t>(i)]);
  return ids;
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
                       const std::vector<double>& position_table, int t) {
  const auto id = static_cast<std::int64_t>(kEdgeIds[static_cast<std::size_t>(row)]);
  auto row_is = [&](double token_times, double position_times) {
    for (std::int64_t c = 0; c < kC; ++c) {
      const double want = token_times * token_table[id * kC + c] +
                          position_times * position_table[position * kC + c];
      if (!close_enough(want, got[row * kC + c])) return false;
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
  const GPTConfig config = layer_config();
  Embedding serial(config);
  Tensor ids = edge_ids();
  const std::vector<double> dx_values = values(random_tensor(Shape{kB, kT, kC}, 51));
  EmbeddingSaved serial_saved;
  const std::vector<double> y_full = values(serial.forward(ids, serial_saved));
  serial.backward(tensor_of(dx_values, Shape{kB, kT, kC}), serial_saved);

  VocabParallelEmbedding layer(comm, config, sp);
  const std::int64_t n = kVocab / t;
  layer.tokens = tensor_of(rows_of(values(serial.tokens), kC, r * n, n), Shape{n, kC});
  layer.tokens_grad = Tensor::zeros(Shape{n, kC}, DType::f64);
  layer.positions = serial.positions.clone();
  layer.positions_grad = Tensor::zeros(serial.positions.shape(), DType::f64);
  VocabParallelEmbeddingSaved saved;
  const CommStats s0 = comm.stats();
  Tensor y = layer.forward(ids, saved);
  const CommStats s1 = comm.stats();
  Tensor dx = sp ? tensor_of(my_tokens(dx_values, kC, t, r), Shape{kN / t, kC})
                 : tensor_of(dx_values, Shape{kB, kT, kC});
  layer.backward(dx, saved);
  const CommStats s2 = comm.stats();

  std::string m;
  // The forward, row by row for a decoded message.
  const std::vector<double> got = values(y);
  const std::vector<double> want = sp ? my_tokens(y_full, kC, t, r) : y_full;
  std::string forward = check_values(
      std::string("4.5 embedding output") + (sp ? " (this rank's tokens)" : ""), r, want, got);
  if (!forward.empty() && got.size() == want.size()) {
    const std::int64_t first_token = sp ? r * (kN / t) : 0;
    for (std::int64_t row = 0; row < static_cast<std::int64_t>(got.size()) / kC; ++row) {
      bool wrong = false;
      for (std::int64_t c = 0; c < kC; ++c)
        wrong = wrong || !close_enough(want[row * kC + c], got[row * kC + c]);
      if (!wrong) continue;
      std::vector<double> full_row_view(static_cast<std::size_t>(kN * kC), 0.0);
      std::copy(got.begin(), got.end(), full_row_view.begin() + first_token * kC);
      const std::string why = decode_row(first_token + row, (first_token + row) % kT, full_row_view,
                                         values(serial.tokens), values(serial.positions), t);
      if (!why.empty()) forward += "\n      = " + why;
      break;
    }
  }
  m += forward;
  const std::vector<double> token_grad = rows_of(values(serial.tokens_grad), kC, r * n, n);
  m += check_values("4.5 token-table gradient (this rank's rows)", r, token_grad,
                    values(layer.tokens_grad),
                    {{std::to_string(t) +
                          "x the gradient: dx was all-reduced in backward, but it is already whole "
                          "on every rank",
                      times(token_grad, t)}});
  m += check_values("4.5 positions gradient (replicated: the same on every rank)", r,
                    values(serial.positions_grad), values(layer.positions_grad),
                    {{"0: every rank must add dx into the replicated positions' gradient (only the "
                      "forward adds the "
                      "positions on one rank)",
                      times(values(serial.positions_grad), 0)},
                     {std::to_string(t) +
                          "x the gradient: dx was all-reduced in backward, but it is already whole "
                          "on every rank",
                      times(values(serial.positions_grad), t)}});
  const std::int64_t bytes = kN * kC * 8;
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

std::string cross_entropy_on(Comm& comm) {
  const int t = comm.size(), r = comm.rank();
  const std::int64_t n = kVocab / t;
  Tensor targets = edge_ids();
  const std::vector<double> logits = values(random_tensor(Shape{kB, kT, kVocab}, 61, -4.0, 4.0));
  double expected_loss = 0;
  std::vector<double> expected_grad;
  {
    CrossEntropy serial;
    CrossEntropySaved serial_saved;
    expected_loss =
        serial.forward(tensor_of(logits, Shape{kB, kT, kVocab}).clone(), targets, serial_saved);
    expected_grad = values(serial.backward(serial_saved, 0.5));
  }
  std::shared_ptr<MemoryTracker> tracker = current_memory_tracker();
  const std::int64_t before = tracker->total_live();
  tracker->reset_peaks();
  Tensor slice =
      Tensor::from_values(columns_of(logits, kVocab, r * n, n), DType::f64).view(Shape{kB, kT, n});
  VocabParallelCrossEntropy loss(comm, kVocab);
  VocabParallelCrossEntropySaved saved;
  const CommStats s0 = comm.stats();
  const double got_loss = loss.forward(slice, targets, saved);
  const CommStats s1 = comm.stats();
  Tensor dlogits = loss.backward(saved, 0.5);
  const CommStats s2 = comm.stats();
  const std::int64_t held = tracker->total_peak() - before;
  std::string m;
  if (!close_enough(expected_loss, got_loss))
    m += "\n    rank " + std::to_string(r) + ": 4.6 loss: expected " + number(expected_loss) +
         ", got " + number(got_loss) +
         ". The three steps: the max over the WHOLE vocabulary (all-reduce with ReduceOp::max), "
         "then the sums of exp(logit - max) and the target logits over all ranks (all-reduce, "
         "sum), then the mean "
         "of log(sum) + max - target logit";
  m += check_values("4.6 logits gradient (this rank's vocabulary slice, loss_scale 0.5)", r,
                    columns_of(expected_grad, kVocab, r * n, n), values(dlogits),
                    {{std::to_string(t) + "x the gradient: loss_scale / N, N = B*T rows, once",
                      times(columns_of(expected_grad, kVocab, r * n, n), t)}});
  const CommUse forward = comm_use(s0, s1), backward = comm_use(s1, s2);
  const bool only_small_all_reduces =
      forward.calls.size() == 1 && forward.count("all_reduce") >= 2 &&
      forward.count("all_reduce") <= 3 && forward.bytes <= 3 * kN * 8;
  if (!only_small_all_reduces)
    m += "\n    rank " + std::to_string(r) + ": 4.6 forward made " + forward.str() +
         ", expected 2 or 3 all-reduces of per-row numbers (at most 3 x N x 8 = " +
         std::to_string(3 * kN * 8) +
         " bytes): the max, the sum of exponentials and the target logit of each of the N rows; "
         "nothing of the "
         "vocabulary's size";
  m += check_comm("4.6 backward", r, backward, {}, 0,
                  "the gradient of a slice needs only that slice and the row statistics");
  if (t > 1 && held >= kN * kVocab * 8)
    m += "\n    rank " + std::to_string(r) + ": 4.6 held " + std::to_string(held) +
         " bytes during the loss (its logits slice included), as much as one whole [B, T, V] "
         "logits tensor (" +
         std::to_string(kN * kVocab * 8) +
         " bytes): a rank must never build the full logits. Expected about the slice (" +
         std::to_string(kN * n * 8) + ") plus a few numbers per row";
  return m;
}

TEST(Puzzle4_5_vocab_parallel_embedding, EqualsTheSerialEmbeddingAtEverySliceEdge) {
  for (bool sp : {false, true})
    for (int t : tp_sizes())
      run_and_report(
          std::string("4.5 VocabParallelEmbedding, ") + (sp ? "sequence-parallel" : "plain"), t,
          [sp](Comm& comm) { return embedding_on(comm, sp); });
}

TEST(Puzzle4_6_vocab_parallel_cross_entropy, EqualsTheSerialLossWithoutTheFullLogits) {
  for (int t : tp_sizes())
    run_and_report("4.6 VocabParallelCrossEntropy", t,
                   [](Comm& comm) { return cross_entropy_on(comm); });
}

}  // namespace
}  // namespace dtp::testing::ch04
