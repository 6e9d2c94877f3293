// Chapter 06 — sequence and expert parallelism.
//
// Replace each `throw dtp::NotSolved(...)` with your code, then run
//     ./dtp grade 06                  (or ./dtp grade 06 --puzzle 6.2)
// The contract is in chapters/06_sequence_expert/sequence_expert.h; the
// lesson (the layouts, the online-softmax merge, the costs) is in
// chapters/06_sequence_expert/README.md. q, k, v and outputs are
// [B, T_local, H, D]; masks use global positions.
//
// Provided (drivers/06_sequence_expert/): positions_of, block_visible,
// split_positions / join_positions (a shard <-> its ranges' pieces),
// empty_partial, attend_block, attend_block_backward, the constructors;
// for the mixture of experts (6.6, 6.7): gather_rows, scatter_add_rows,
// row_block, router_probabilities, router_backward,
// moe_capacity (dtp/moe_routing.h), MoeRouting::balance_loss and
// MoeRouting::balance_gradient.
// Tools:
//   sp.rank(), sp.size(), sp.all_to_all(in, out)
//   sp.isend(x, dst) / sp.irecv(x, src) -> Request; request.wait()
//   ops::permute(in, {a, b, c, d}, out)   out's axis i is in's axis order[i] (4-D)
//   ops::flash_attention_forward(q, k, v, out, row_max, row_sum)   causal from position 0
//   ops::flash_attention_backward(q, k, v, out, row_max, row_sum, dout, dq, dk, dv)
//   ops::axpy(y, 1.0, x), Tensor::empty / zeros(shape, dtype, device), t.view(shape),
//   t.flatten().slice(start, length), t.copy_from(other), t.clone()
//   Tensor::from_values(host_vector, dtype, device)   a small 1-D tensor on a device
//   ops::scale_rows(x, w)    x[n] *= w[n];   ops::row_dot(a, b, out)   out[n] = a[n] . b[n]
//   weights.experts[e].forward(x, MlpSaved&) / .backward(dy, MlpSaved&)  (gradients accumulate)
//   ep_.all_to_all_v(in, send_counts, out, recv_counts)   counts in elements, per peer
#include "06_sequence_expert/sequence_expert.h"

namespace dtp::ch06 {

// --- 6.1 Ulysses ---------------------------------------------------------------------

Tensor sequence_to_heads(Comm& sp, const Tensor& x) {
  // About 12 lines. View x [B, Tl, H, D] as [B, Tl, n, H/n * D]; permute it to
  // [n, B, Tl, H/n * D] so that the block for rank j (head group j) is
  // contiguous; all_to_all; the block from rank j holds rank j's positions:
  // permute [n, B, Tl, ..] to [B, n, Tl, ..], which is [B, T, H/n, D].
  (void)sp, (void)x;
  throw dtp::NotSolved("6.1 sequence_to_heads");
}

Tensor heads_to_sequence(Comm& sp, const Tensor& x) {
  // About 12 lines. The same three moves in reverse: [B, n, Tl, ..] ->
  // [n, B, Tl, ..], all_to_all, then [n, B, Tl, ..] -> [B, Tl, n, ..].
  (void)sp, (void)x;
  throw dtp::NotSolved("6.1 heads_to_sequence");
}

Tensor UlyssesAttention::forward(const Tensor& q, const Tensor& k, const Tensor& v) {
  // About 12 lines. Keep q_, k_, v_ (head-sharded), out_, row_max_ and
  // row_sum_ ([B, H/n, T]) for the backward.
  (void)q, (void)k, (void)v, (void)sp_, (void)heads_;
  throw dtp::NotSolved("6.1 UlyssesAttention::forward");
}

void UlyssesAttention::backward(const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv) {
  // About 10 lines: dout to heads, the flash backward, dq, dk, dv back.
  (void)dout, (void)dq, (void)dk, (void)dv;
  throw dtp::NotSolved("6.1 UlyssesAttention::backward");
}

// --- 6.2 and 6.4 ring attention forward -------------------------------------------------------

Tensor RingAttention::forward(const Tensor& q, const Tensor& k, const Tensor& v) {
  // About 30 lines. T_ = n * T_local; mine = positions_of(T_, n, r, layout_);
  // keep q, k, v split into mine's pieces and one empty_partial per query
  // piece. Pack k and v into one buffer. For step 0 .. n-1 the block in hand
  // is rank (r - step)'s: post irecv (from r - 1) and isend (to r + 1) of
  // the next block first (not on the last step), then attend_block every
  // visible (query piece, key piece) pair, then wait. Return the pieces'
  // outputs joined.
  (void)q, (void)k, (void)v, (void)sp_, (void)layout_;
  throw dtp::NotSolved("6.2 RingAttention::forward");
}

// --- 6.3 ring attention backward ------------------------------------------------------------

void RingAttention::backward(const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv) {
  // About 35 lines. The travelling block holds k, v, dk, dv (dk, dv start at
  // zero). At each step attend_block_backward every visible pair into dq's
  // pieces and the block's dk, dv; pass the block on (n - 1 times). The
  // block in hand at the end is rank r + 1's: send its dk, dv to r + 1 and
  // receive yours from r - 1.
  (void)dout, (void)dq, (void)dk, (void)dv;
  throw dtp::NotSolved("6.3 RingAttention::backward");
}

// --- 6.5 the hybrid -------------------------------------------------------------------------

Tensor HybridAttention::forward(const Tensor& q, const Tensor& k, const Tensor& v) {
  // About 4 lines: your 6.1 halves on inner_, your ring on the group's positions.
  (void)q, (void)k, (void)v, (void)ring_;
  throw dtp::NotSolved("6.5 HybridAttention::forward");
}

void HybridAttention::backward(const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv) {
  // About 6 lines.
  (void)dout, (void)dq, (void)dk, (void)dv;
  throw dtp::NotSolved("6.5 HybridAttention::backward");
}

// --- 6.6 a mixture of experts on one rank ---------------------------------------------------

MoeRouting route_tokens(const std::vector<double>& probs, int experts, int top_k,
                        double capacity_factor) {
  // About 35 lines. N = probs.size() / experts (check it divides). Size every
  // field of MoeRouting; capacity = moe_capacity(...). Per token: the k
  // largest probabilities, ties to the lower index (std::stable_sort of the
  // indices 0..E-1 does it), into choice and weight; load[e] += 1 / (N k) per
  // choice, importance[e] += p / N per token. Then admit round by round:
  // for j in 0..k-1, for every token n in order, the choice n*k+j is kept
  // if its expert has fewer than capacity rows (append n to rows[e] and its
  // weight to weights[e]), else dropped.
  (void)probs, (void)experts, (void)top_k, (void)capacity_factor;
  throw dtp::NotSolved("6.6 route_tokens");
}

Tensor MoeLayer::forward(const Tensor& x) {
  // About 15 lines. probs_ = router_probabilities(w_, x, router_saved_);
  // routing_ = route_tokens(probs_.to_vector(), ...); aux_loss_ =
  // w_.aux_loss_coef * routing_.balance_loss(). Size outputs_ and saved_ to
  // E entries. Then per expert with rows: outputs_[e] = its forward on
  // gather_rows(x, rows) (keep saved_[e]); a copy scaled by
  // Tensor::from_values(its weights, x.dtype(), x.device()) is scatter_add_rows'ed
  // into y (zeros [N, C]). Keep outputs_[e] unscaled: backward needs it.
  (void)x, (void)w_;
  throw dtp::NotSolved("6.6 MoeLayer::forward");
}

Tensor MoeLayer::backward(const Tensor& dy) {
  // About 25 lines. d_probs (host, [N, E]) starts at the balance loss's
  // share: aux_loss_coef * routing_.balance_gradient(e) in every row. Per
  // expert with rows: d_out = gather_rows(dy, rows); d_probs[n][e] +=
  // row_dot(d_out, outputs_[e]) for its rows n; scale d_out by the weights;
  // the expert's backward; scatter_add_rows into dx. Finally add
  // router_backward(w_, probs_, d_probs, router_saved_) to dx.
  (void)dy;
  throw dtp::NotSolved("6.6 MoeLayer::backward");
}

// --- 6.7 expert parallelism -----------------------------------------------------------------

Tensor ExpertParallelMoe::forward(const Tensor& x) {
  // About 50 lines. Route as in 6.6. Experts of rank j are contiguous, so
  // rows packed in expert order are packed by destination. Counts: an
  // all_to_all of E numbers (block j: how many rows for each of rank j's
  // experts), as an f64 tensor on x.device() (Tensor::from_values(
  // counts, DType::f64, x.device()); read back with to_vector()), tells you what
  // arrives from each rank, per local expert. Size outputs_ to E entries
  // and saved_ to local_ entries. Fill
  // send_counts_ / recv_counts_ (elements: rows times C) and recv_rows_[l]
  // (where expert l's rows sit in the receive buffer: from rank 0 first).
  // all_to_all_v the packed rows; run each local expert (w_.experts[first_ + l]:
  // in training this rank holds no other expert's weights) once on
  // gather_rows(received, recv_rows_[l]) and scatter its output into a
  // results buffer shaped like received; all_to_all_v it back with the
  // counts swapped; then combine as in 6.6 (outputs_[e]: row_block of what
  // came home).
  (void)x, (void)ep_, (void)first_, (void)local_;
  throw dtp::NotSolved("6.7 ExpertParallelMoe::forward");
}

Tensor ExpertParallelMoe::backward(const Tensor& dy) {
  // About 40 lines. d_probs as in 6.6 (the outputs are home, so the combine
  // weights' gradient is local). Pack dy's rows in expert order, scale each
  // expert's block (row_block) by its weights, all_to_all_v to the experts,
  // each local expert's backward on its rows, all_to_all_v the input
  // gradients home, scatter_add_rows them into dx, add router_backward.
  (void)dy;
  throw dtp::NotSolved("6.7 ExpertParallelMoe::backward");
}

}  // namespace dtp::ch06
