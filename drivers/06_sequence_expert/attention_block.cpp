// One block of attention for ring attention: flash attention of some
// queries over one key/value block under the global causal mask, merged
// into the running result; and its backward. Each call is counted (the
// balance checker reads the counts) and charged on the simulated clock, so a
// ring's clock shows compute and transfers on one time line; each call is a
// trace span too, so the overlap checker reads its place among the ring's
// transfers and waits.
#include <cmath>

#include "06_sequence_expert/sequence_expert.h"
#include "dtp/trace.h"

namespace dtp::ch06 {

namespace {
thread_local std::int64_t block_count = 0;

ops::AttentionMask causal_mask(const PositionRange& queries, const PositionRange& keys) {
  return {true, queries.start, keys.start};
}

void check_block(const char* op, const Tensor& q, const PositionRange& queries, const Tensor& k,
                 const Tensor& v, const PositionRange& keys) {
  DTP_CHECK(q.defined() && q.ndim() == 4 && k.defined() && k.ndim() == 4 && v.defined() &&
                v.shape() == k.shape(),
            op, ": q, k and v must be [B, T, H, D] (k and v alike), got ", q.describe(), ", ",
            k.describe(), ", ", v.describe());
  DTP_CHECK(q.size(1) == queries.length && k.size(1) == keys.length, op, ": q holds ", q.size(1),
            " positions and k ", k.size(1), ", but the ranges say ", queries.length, " and ",
            keys.length);
  DTP_CHECK(block_visible(queries, keys), op, ": no query at positions [", queries.start, ", ",
            queries.end(), ") can see a key at [", keys.start, ", ", keys.end(),
            ") under the causal mask; skip this block (block_visible) instead of computing it");
}
}  // namespace

PartialAttention empty_partial(const Tensor& q) {
  DTP_CHECK(q.defined() && q.ndim() == 4, "empty_partial: q must be [B, T, H, D], got ",
            q.describe());
  const Shape stats{q.size(0), q.size(2), q.size(1)};
  return {Tensor::zeros(q.shape(), q.dtype(), q.device(), MemoryCategory::activations),
          Tensor::full(stats, -INFINITY, q.dtype(), q.device(), MemoryCategory::activations),
          Tensor::zeros(stats, q.dtype(), q.device(), MemoryCategory::activations)};
}

void attend_block(Comm& clock, const Tensor& q, const PositionRange& queries, const Tensor& k,
                  const Tensor& v, const PositionRange& keys, PartialAttention& partial) {
  check_block("attend_block", q, queries, k, v, keys);
  trace::Scope span("attend_block", "compute");
  DTP_CHECK(partial.out.defined() && partial.out.shape() == q.shape(),
            "attend_block: partial must be shaped for q (start from empty_partial(q)), got ",
            partial.out.describe());
  PartialAttention block = empty_partial(q);
  ops::flash_attention_forward(q, k, v, block.out, block.row_max, block.row_sum,
                               causal_mask(queries, keys));
  ops::attention_merge(partial.out, partial.row_max, partial.row_sum, block.out, block.row_max,
                       block.row_sum);
  ++block_count;
  clock.advance_clock(1.0);
}

void attend_block_backward(Comm& clock, const Tensor& q, const PositionRange& queries,
                           const Tensor& k, const Tensor& v, const PositionRange& keys,
                           const PartialAttention& result, const Tensor& dout, Tensor& dq,
                           Tensor& dk, Tensor& dv) {
  check_block("attend_block_backward", q, queries, k, v, keys);
  trace::Scope span("attend_block backward", "compute");
  DTP_CHECK(dout.shape() == q.shape() && dq.shape() == q.shape() && dk.shape() == k.shape() &&
                dv.shape() == k.shape(),
            "attend_block_backward: dout and dq must be shaped like q ", q.shape().str(),
            ", dk and dv like k ", k.shape().str(), "; got ", dout.describe(), ", ", dq.describe(),
            ", ", dk.describe(), ", ", dv.describe());
  Tensor dq_block = Tensor::empty(q.shape(), q.dtype(), q.device());
  Tensor dk_block = Tensor::empty(k.shape(), k.dtype(), k.device());
  Tensor dv_block = Tensor::empty(k.shape(), k.dtype(), k.device());
  ops::flash_attention_backward(q, k, v, result.out, result.row_max, result.row_sum, dout, dq_block,
                                dk_block, dv_block, causal_mask(queries, keys));
  ops::axpy(dq, 1.0, dq_block);
  ops::axpy(dk, 1.0, dk_block);
  ops::axpy(dv, 1.0, dv_block);
  ++block_count;
  clock.advance_clock(2.0);
}

std::int64_t block_computations() { return block_count; }

void reset_block_computations() { block_count = 0; }

}  // namespace dtp::ch06
