// Reference for puzzles 6.2-6.4: ring attention, contiguous or zigzag. The
// queries stay; the key/value block travels to rank r + 1 while the block in
// hand is computed, so after n - 1 transfers every rank has seen every block.
// A block carries its owner's positions (positions_of), which decide what
// the causal mask lets each of this rank's query ranges see.
#include "06_sequence_expert/sequence_expert.h"

namespace dtp::ch06 {

namespace {
// k and v (and, backward, dk and dv) side by side in one flat buffer: one message per transfer.
Tensor pack(const std::vector<Tensor>& parts) {
  std::int64_t total = 0;
  for (const Tensor& p : parts) total += p.numel();
  Tensor flat =
      Tensor::empty({total}, parts[0].dtype(), parts[0].device(), MemoryCategory::activations);
  std::int64_t at = 0;
  for (const Tensor& p : parts) {
    flat.slice(at, p.numel()).copy_from(p.flatten());
    at += p.numel();
  }
  return flat;
}

// Part @p index of a buffer of equal parts shaped like @p shape (a view).
Tensor part(const Tensor& flat, int index, const Shape& shape) {
  return flat.slice(index * shape.numel(), shape.numel()).view(shape);
}

std::vector<Tensor> zeros_like(const std::vector<Tensor>& pieces) {
  std::vector<Tensor> out;
  for (const Tensor& p : pieces) out.push_back(Tensor::zeros(p.shape(), p.dtype(), p.device()));
  return out;
}
}  // namespace

Tensor RingAttention::forward(const Tensor& q, const Tensor& k, const Tensor& v) {
  DTP_CHECK(q.defined() && q.ndim() == 4 && k.shape() == q.shape() && v.shape() == q.shape(),
            "ring attention: q, k and v must be [B, T_local, H, D] alike, got ", q.describe(), ", ",
            k.describe(), ", ", v.describe());
  const int n = sp_.size(), r = sp_.rank();
  T_ = q.size(1) * n;
  const std::vector<PositionRange> mine = positions_of(T_, n, r, layout_);
  q_ = split_positions(q, mine);
  k_ = split_positions(k, mine);
  v_ = split_positions(v, mine);
  result_.clear();
  for (const Tensor& piece : q_) result_.push_back(empty_partial(piece));

  Tensor block = pack({k, v});
  for (int step = 0; step < n; ++step) {
    // Start passing the block on before computing with it: the transfer hides behind the compute.
    Tensor next;
    Request sent, received;
    if (step < n - 1) {
      next =
          Tensor::empty(block.shape(), block.dtype(), block.device(), MemoryCategory::activations);
      received = sp_.irecv(next, (r - 1 + n) % n);
      sent = sp_.isend(block, (r + 1) % n);
    }
    const std::vector<PositionRange> theirs = positions_of(T_, n, (r - step + n) % n, layout_);
    const std::vector<Tensor> keys = split_positions(part(block, 0, k.shape()), theirs);
    const std::vector<Tensor> values = split_positions(part(block, 1, k.shape()), theirs);
    for (std::size_t i = 0; i < mine.size(); ++i)
      for (std::size_t j = 0; j < theirs.size(); ++j)
        if (block_visible(mine[i], theirs[j]))
          attend_block(sp_, q_[i], mine[i], keys[j], values[j], theirs[j], result_[i]);
    if (step < n - 1) {
      sent.wait();
      received.wait();
      block = next;
    }
  }
  std::vector<Tensor> outs;
  for (const PartialAttention& p : result_) outs.push_back(p.out);
  return join_positions(outs);
}

void RingAttention::backward(const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv) {
  DTP_CHECK(!q_.empty(), "ring attention backward: call forward first");
  const int n = sp_.size(), r = sp_.rank();
  const std::vector<PositionRange> mine = positions_of(T_, n, r, layout_);
  const std::vector<Tensor> douts = split_positions(dout, mine);
  std::vector<Tensor> dqs = zeros_like(q_);
  const Tensor k_local = join_positions(k_), v_local = join_positions(v_);
  const Shape shape = k_local.shape();
  // The travelling block: k, v, and the dk, dv it has collected so far.
  Tensor block = pack({k_local, v_local, Tensor::zeros(shape, k_local.dtype(), k_local.device()),
                       Tensor::zeros(shape, k_local.dtype(), k_local.device())});
  for (int step = 0; step < n; ++step) {
    const std::vector<PositionRange> theirs = positions_of(T_, n, (r - step + n) % n, layout_);
    const std::vector<Tensor> keys = split_positions(part(block, 0, shape), theirs);
    const std::vector<Tensor> values = split_positions(part(block, 1, shape), theirs);
    std::vector<Tensor> dkeys = zeros_like(keys), dvalues = zeros_like(values);
    for (std::size_t i = 0; i < mine.size(); ++i)
      for (std::size_t j = 0; j < theirs.size(); ++j)
        if (block_visible(mine[i], theirs[j]))
          attend_block_backward(sp_, q_[i], mine[i], keys[j], values[j], theirs[j], result_[i],
                                douts[i], dqs[i], dkeys[j], dvalues[j]);
    Tensor block_dk = part(block, 2, shape), block_dv = part(block, 3, shape);
    ops::axpy(block_dk, 1.0, join_positions(dkeys));
    ops::axpy(block_dv, 1.0, join_positions(dvalues));
    if (step < n - 1) {
      Tensor next =
          Tensor::empty(block.shape(), block.dtype(), block.device(), MemoryCategory::activations);
      Request received = sp_.irecv(next, (r - 1 + n) % n);
      Request sent = sp_.isend(block, (r + 1) % n);
      sent.wait();
      received.wait();
      block = next;
    }
  }
  // The block in hand belongs to rank r + 1 and has every rank's share: send its dk, dv home.
  Tensor gradients = block.slice(2 * shape.numel(), 2 * shape.numel());
  if (n > 1) {
    Tensor home = Tensor::empty(gradients.shape(), gradients.dtype(), gradients.device());
    Request received = sp_.irecv(home, (r - 1 + n) % n);
    Request sent = sp_.isend(gradients, (r + 1) % n);
    sent.wait();
    received.wait();
    gradients = home;
  }
  dq = join_positions(dqs);
  dk = part(gradients, 0, shape).clone();
  dv = part(gradients, 1, shape).clone();
  q_.clear(), k_.clear(), v_.clear(), result_.clear();
}

}  // namespace dtp::ch06
