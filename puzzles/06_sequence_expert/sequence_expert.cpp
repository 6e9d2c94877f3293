// Chapter 06 — sequence parallelism.
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
// empty_partial, attend_block, attend_block_backward, the constructors.
// Tools:
//   sp.rank(), sp.size(), sp.all_to_all(in, out)
//   sp.isend(x, dst) / sp.irecv(x, src) -> Request; request.wait()
//   ops::permute(in, {a, b, c, d}, out)   out's axis i is in's axis order[i] (4-D)
//   ops::flash_attention_forward(q, k, v, out, row_max, row_sum)   causal from position 0
//   ops::flash_attention_backward(q, k, v, out, row_max, row_sum, dout, dq, dk, dv)
//   ops::axpy(y, 1.0, x), Tensor::empty / zeros(shape, dtype, device), t.view(shape),
//   t.flatten().slice(start, length), t.copy_from(other), t.clone()
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

}  // namespace dtp::ch06
