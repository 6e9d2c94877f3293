// Reference for puzzle 6.7: expert parallelism. Experts [j E/m, (j+1) E/m)
// live on rank j, so a send buffer packed in expert order is already packed
// by destination rank: one all_to_all_v carries every kept choice's row to
// its expert, a second brings the outputs home. Each local expert's rows
// arrive in pieces, one per source rank, and are gathered into one batch so
// the expert runs once.
#include "06_sequence_expert/sequence_expert.h"
#include "moe_gradients.h"

namespace dtp::ch06 {

Tensor ExpertParallelMoe::forward(const Tensor& x) {
  const int m = ep_.size(), E = static_cast<int>(w_.experts.size());
  probs_ = router_probabilities(w_, x, router_saved_);
  routing_ = route_tokens(probs_.to_vector(), E, w_.top_k, w_.capacity_factor);
  aux_loss_ = w_.aux_loss_coef * routing_.balance_loss();
  const std::int64_t C = x.size(1);

  // Counts first: a receiver sizes its buffer and splits it by expert.
  std::vector<double> mine(static_cast<std::size_t>(E));
  std::vector<std::int32_t> packed;  // this rank's token rows in expert order = destination order
  for (int e = 0; e < E; ++e) {
    const auto& rows = routing_.rows[static_cast<std::size_t>(e)];
    mine[static_cast<std::size_t>(e)] = static_cast<double>(rows.size());
    packed.insert(packed.end(), rows.begin(), rows.end());
  }
  Tensor theirs = Tensor::empty({E}, DType::f64, x.device(), MemoryCategory::other);
  ep_.all_to_all(Tensor::from_values(mine, DType::f64, x.device()),
                 theirs);  // block i: rank i's rows per local expert
  const std::vector<double> got = theirs.to_vector();

  send_counts_.assign(static_cast<std::size_t>(m), 0),
      recv_counts_.assign(static_cast<std::size_t>(m), 0);
  recv_rows_.assign(static_cast<std::size_t>(local_), {});
  std::int32_t at = 0;
  for (int j = 0; j < m; ++j)
    for (int l = 0; l < local_; ++l) {
      const auto sent = static_cast<std::int64_t>(mine[static_cast<std::size_t>(j * local_ + l)]);
      const auto came = static_cast<std::int64_t>(got[static_cast<std::size_t>(j * local_ + l)]);
      send_counts_[static_cast<std::size_t>(j)] += sent * C;
      recv_counts_[static_cast<std::size_t>(j)] += came * C;
      for (std::int64_t i = 0; i < came; ++i)
        recv_rows_[static_cast<std::size_t>(l)].push_back(at++);
    }

  // Dispatch, run each local expert once on all its rows, combine.
  Tensor received = Tensor::empty({at, C}, x.dtype(), x.device(), MemoryCategory::activations);
  ep_.all_to_all_v(gather_rows(x, packed), send_counts_, received, recv_counts_);
  Tensor results =
      Tensor::zeros(received.shape(), x.dtype(), x.device(), MemoryCategory::activations);
  saved_.assign(static_cast<std::size_t>(local_), MlpSaved{});
  for (int l = 0; l < local_; ++l) {
    const auto& rows = recv_rows_[static_cast<std::size_t>(l)];
    if (rows.empty()) continue;
    scatter_add_rows(w_.experts[static_cast<std::size_t>(first_ + l)].forward(
                         gather_rows(received, rows), saved_[static_cast<std::size_t>(l)]),
                     rows, results);
  }
  Tensor home = Tensor::empty({static_cast<std::int64_t>(packed.size()), C}, x.dtype(), x.device(),
                              MemoryCategory::activations);
  ep_.all_to_all_v(results, recv_counts_, home, send_counts_);

  Tensor y = Tensor::zeros(x.shape(), x.dtype(), x.device(), MemoryCategory::activations);
  outputs_.assign(static_cast<std::size_t>(E), Tensor());
  std::int64_t first = 0;
  for (int e = 0; e < E; ++e) {
    const auto& rows = routing_.rows[static_cast<std::size_t>(e)];
    if (rows.empty()) continue;
    outputs_[static_cast<std::size_t>(e)] =
        row_block(home, first, static_cast<std::int64_t>(rows.size()));
    first += static_cast<std::int64_t>(rows.size());
    Tensor weighted = outputs_[static_cast<std::size_t>(e)].clone();
    ops::scale_rows(weighted, Tensor::from_values(routing_.weights[static_cast<std::size_t>(e)],
                                                  x.dtype(), x.device()));
    scatter_add_rows(weighted, rows, y);
  }
  return y;
}

Tensor ExpertParallelMoe::backward(const Tensor& dy) {
  DTP_CHECK(probs_.defined(),
            "ExpertParallelMoe backward: no forward to go back through (or backward already ran)");
  const int E = static_cast<int>(w_.experts.size());
  const std::int64_t C = dy.size(1);
  std::vector<double> d_probs = balance_loss_gradient(routing_, w_.aux_loss_coef);

  // dy's rows in the forward's packed order; the combine weights' gradient
  // is local (the outputs came home), then the rows are scaled and sent.
  std::vector<std::int32_t> packed;
  for (const auto& rows : routing_.rows) packed.insert(packed.end(), rows.begin(), rows.end());
  Tensor send = gather_rows(dy, packed);
  std::int64_t first = 0;
  for (int e = 0; e < E; ++e) {
    const auto& rows = routing_.rows[static_cast<std::size_t>(e)];
    if (rows.empty()) continue;
    Tensor block = row_block(send, first, static_cast<std::int64_t>(rows.size()));
    first += static_cast<std::int64_t>(rows.size());
    add_combine_weight_gradient(routing_, e, block, outputs_[static_cast<std::size_t>(e)], d_probs);
    ops::scale_rows(block, Tensor::from_values(routing_.weights[static_cast<std::size_t>(e)],
                                               dy.dtype(), dy.device()));
  }
  std::int64_t arrived = 0;  // elements, as the forward received
  for (std::int64_t count : recv_counts_) arrived += count;
  Tensor received = Tensor::empty({arrived / C, C}, dy.dtype(), dy.device(), MemoryCategory::other);
  ep_.all_to_all_v(send, send_counts_, received, recv_counts_);

  Tensor d_results =
      Tensor::zeros(received.shape(), dy.dtype(), dy.device(), MemoryCategory::other);
  for (int l = 0; l < local_; ++l) {
    const auto& rows = recv_rows_[static_cast<std::size_t>(l)];
    if (rows.empty()) continue;
    scatter_add_rows(w_.experts[static_cast<std::size_t>(first_ + l)].backward(
                         gather_rows(received, rows), saved_[static_cast<std::size_t>(l)]),
                     rows, d_results);
  }
  Tensor home = Tensor::empty(send.shape(), dy.dtype(), dy.device(), MemoryCategory::other);
  ep_.all_to_all_v(d_results, recv_counts_, home, send_counts_);

  Tensor dx = Tensor::zeros(dy.shape(), dy.dtype(), dy.device(), MemoryCategory::other);
  first = 0;
  for (const auto& rows : routing_.rows) {
    if (rows.empty()) continue;
    scatter_add_rows(row_block(home, first, static_cast<std::int64_t>(rows.size())), rows, dx);
    first += static_cast<std::int64_t>(rows.size());
  }
  ops::axpy(dx, 1.0, router_backward(w_, probs_, d_probs, router_saved_));
  probs_ = Tensor();
  outputs_.clear();
  return dx;
}

}  // namespace dtp::ch06
