// Reference for puzzle 6.1: Ulysses. One all-to-all turns "my positions,
// every head" into "every position, my heads"; ops::permute first makes each
// peer's block contiguous, because an all-to-all sends contiguous chunks.
#include "06_sequence_expert/sequence_expert.h"

namespace dtp::ch06 {

Tensor sequence_to_heads(Comm& sp, const Tensor& x) {
  const int n = sp.size();
  DTP_CHECK(x.defined() && x.ndim() == 4, "sequence_to_heads: x must be [B, T/n, H, D], got ",
            x.describe());
  const std::int64_t B = x.size(0), Tl = x.size(1), H = x.size(2), D = x.size(3);
  DTP_CHECK(H % n == 0, "sequence_to_heads: H = ", H, " heads do not split over n = ", n, " ranks");
  const std::int64_t HlD = H / n * D;
  // [B, Tl, n, Hl D] -> [n, B, Tl, Hl D]: block j holds head group j of my positions.
  Tensor send = Tensor::empty({n, B, Tl, HlD}, x.dtype(), x.device(), MemoryCategory::activations);
  ops::permute(x.view({B, Tl, n, HlD}), {2, 0, 1, 3}, send);
  Tensor recv = Tensor::empty(send.shape(), x.dtype(), x.device(), MemoryCategory::activations);
  sp.all_to_all(send, recv);  // block j now: rank j's positions, my head group
  // [n, B, Tl, Hl D] -> [B, n, Tl, Hl D] = [B, T, Hl, D]: positions in rank order.
  Tensor out =
      Tensor::empty({B, n * Tl, H / n, D}, x.dtype(), x.device(), MemoryCategory::activations);
  Tensor out_blocks = out.view({B, n, Tl, HlD});
  ops::permute(recv, {1, 0, 2, 3}, out_blocks);
  return out;
}

Tensor heads_to_sequence(Comm& sp, const Tensor& x) {
  const int n = sp.size();
  DTP_CHECK(x.defined() && x.ndim() == 4, "heads_to_sequence: x must be [B, T, H/n, D], got ",
            x.describe());
  const std::int64_t B = x.size(0), T = x.size(1), Hl = x.size(2), D = x.size(3);
  DTP_CHECK(T % n == 0, "heads_to_sequence: T = ", T, " positions do not split over n = ", n,
            " ranks");
  const std::int64_t Tl = T / n, HlD = Hl * D;
  // [B, n, Tl, Hl D] -> [n, B, Tl, Hl D]: block j holds rank j's positions of my heads.
  Tensor send = Tensor::empty({n, B, Tl, HlD}, x.dtype(), x.device(), MemoryCategory::activations);
  ops::permute(x.view({B, n, Tl, HlD}), {1, 0, 2, 3}, send);
  Tensor recv = Tensor::empty(send.shape(), x.dtype(), x.device(), MemoryCategory::activations);
  sp.all_to_all(send, recv);  // block j now: my positions, rank j's head group
  // [n, B, Tl, Hl D] -> [B, Tl, n, Hl D] = [B, Tl, H, D]: head groups in rank order.
  Tensor out =
      Tensor::empty({B, Tl, n * Hl, D}, x.dtype(), x.device(), MemoryCategory::activations);
  Tensor out_groups = out.view({B, Tl, n, HlD});
  ops::permute(recv, {1, 2, 0, 3}, out_groups);
  return out;
}

Tensor UlyssesAttention::forward(const Tensor& q, const Tensor& k, const Tensor& v) {
  DTP_CHECK(q.defined() && q.ndim() == 4 && q.size(2) == heads_,
            "Ulysses forward: q must be [B, T/n, ", heads_, ", D], got ", q.describe());
  q_ = sequence_to_heads(sp_, q);
  k_ = sequence_to_heads(sp_, k);
  v_ = sequence_to_heads(sp_, v);
  const Shape stats{q_.size(0), q_.size(2), q_.size(1)};
  out_ = Tensor::empty(q_.shape(), q.dtype(), q.device(), MemoryCategory::activations);
  row_max_ = Tensor::empty(stats, q.dtype(), q.device(), MemoryCategory::activations);
  row_sum_ = Tensor::empty(stats, q.dtype(), q.device(), MemoryCategory::activations);
  ops::flash_attention_forward(q_, k_, v_, out_, row_max_, row_sum_);  // causal, positions from 0
  return heads_to_sequence(sp_, out_);
}

void UlyssesAttention::backward(const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv) {
  DTP_CHECK(q_.defined(), "Ulysses backward: call forward first");
  Tensor dout_heads = sequence_to_heads(sp_, dout);
  Tensor dq_heads = Tensor::empty(q_.shape(), q_.dtype(), q_.device());
  Tensor dk_heads = Tensor::empty(q_.shape(), q_.dtype(), q_.device());
  Tensor dv_heads = Tensor::empty(q_.shape(), q_.dtype(), q_.device());
  ops::flash_attention_backward(q_, k_, v_, out_, row_max_, row_sum_, dout_heads, dq_heads,
                                dk_heads, dv_heads);
  dq = heads_to_sequence(sp_, dq_heads);
  dk = heads_to_sequence(sp_, dk_heads);
  dv = heads_to_sequence(sp_, dv_heads);
  q_ = k_ = v_ = out_ = row_max_ = row_sum_ = Tensor();
}

}  // namespace dtp::ch06
