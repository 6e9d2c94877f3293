// Puzzle 4.4: attention with the heads split. q, k and v are column-parallel
// (this rank's heads), the output projection row-parallel. The three
// projections share one input, so it is gathered once (sequence parallelism)
// and its gradient is reduced once: the sum of the three local parts.
#include "04_tensor_parallel/tensor_parallel.h"

namespace dtp::ch04 {

namespace {
// q, k and v of this rank's heads: rows of a [C, C] projection. The heads
// must split evenly, which also makes C split evenly.
ColumnParallelLinear head_projection(Comm& tp, const GPTConfig& config, bool sequence_parallel) {
  even_split("attention heads", config.heads, tp.size(), tp.rank());
  return ColumnParallelLinear(tp, config.d_model, config.d_model, true, sequence_parallel);
}
}  // namespace

TensorParallelAttention::TensorParallelAttention(Comm& tp, const GPTConfig& config,
                                                 bool sequence_parallel)
    : q(head_projection(tp, config, sequence_parallel)),
      k(head_projection(tp, config, sequence_parallel)),
      v(head_projection(tp, config, sequence_parallel)),
      proj(tp, config.d_model, config.d_model, sequence_parallel),
      local_heads(config.heads / tp.size()),
      kind(config.attention),
      tp(&tp),
      sequence_parallel(sequence_parallel) {}

Tensor TensorParallelAttention::forward(const Tensor& x, AttentionSaved& saved,
                                        std::int64_t sequences) const {
  const std::int64_t C = q.local.in_features;
  Tensor input = x;
  if (sequence_parallel) {
    const std::int64_t tokens = x.numel() / C * tp->size();
    DTP_CHECK(sequences >= 1 && tokens % sequences == 0, "tensor-parallel attention: ", tokens,
              " tokens do not make ", sequences, " equal sequences (pass B as sequences)");
    Tensor all_tokens = new_activation(Shape{tokens, C}, x);
    tp->all_gather(x, all_tokens);  // once, for q, k and v
    input = all_tokens.view(Shape{sequences, tokens / sequences, C});
  }
  DTP_CHECK(input.ndim() == 3 && input.size(2) == C,
            "tensor-parallel attention: input must be [B, T, ", C, "], got ", input.describe());
  const std::int64_t B = input.size(0), T = input.size(1), D = C / (local_heads * tp->size());
  saved.q = q.local.forward(input, saved.q_in);
  saved.k = k.local.forward(input, saved.k_in);
  saved.v = v.local.forward(input, saved.v_in);
  const Shape heads_shape{B, T, local_heads, D};
  Tensor out = new_activation(Shape{B, T, local_heads * D}, input);
  Tensor out4 = out.view(heads_shape);
  if (kind == AttentionKind::naive) {
    saved.probs = new_activation(Shape{B, local_heads, T, T}, input);
    ops::attention_forward(saved.q.view(heads_shape), saved.k.view(heads_shape),
                           saved.v.view(heads_shape), out4, saved.probs);
  } else {
    saved.row_max = new_activation(Shape{B, local_heads, T}, input);
    saved.row_sum = new_activation(Shape{B, local_heads, T}, input);
    ops::flash_attention_forward(saved.q.view(heads_shape), saved.k.view(heads_shape),
                                 saved.v.view(heads_shape), out4, saved.row_max, saved.row_sum);
  }
  return proj.forward(out, saved.proj_in);  // the one reduction of the forward
}

Tensor TensorParallelAttention::backward(const Tensor& dy, AttentionSaved& saved) const {
  DTP_CHECK(saved.q.defined(),
            "tensor-parallel attention backward: no saved activations (forward not run, or already "
            "released)");
  const std::int64_t B = saved.q.size(0), T = saved.q.size(1), D = saved.q.size(2) / local_heads;
  const Shape heads_shape{B, T, local_heads, D};
  Tensor attention_out = saved.proj_in.input;
  Tensor dout = proj.backward(dy, saved.proj_in);
  Tensor dq = new_gradient(saved.q.shape(), dout), dk = new_gradient(saved.q.shape(), dout),
         dv = new_gradient(saved.q.shape(), dout);
  Tensor dq4 = dq.view(heads_shape), dk4 = dk.view(heads_shape), dv4 = dv.view(heads_shape);
  if (kind == AttentionKind::naive) {
    ops::attention_backward(saved.q.view(heads_shape), saved.k.view(heads_shape),
                            saved.v.view(heads_shape), saved.probs, dout.view(heads_shape), dq4,
                            dk4, dv4);
  } else {
    ops::flash_attention_backward(saved.q.view(heads_shape), saved.k.view(heads_shape),
                                  saved.v.view(heads_shape), attention_out.view(heads_shape),
                                  saved.row_max, saved.row_sum, dout.view(heads_shape), dq4, dk4,
                                  dv4);
  }
  attention_out = dout = Tensor();
  saved.q = saved.k = saved.v = saved.probs = saved.row_max = saved.row_sum = Tensor();
  // This rank's part of dx: the sum over its q, k and v slices.
  Tensor dx = q.local.backward_input(dq);
  k.local.backward_input_into(dk, dx, true);
  v.local.backward_input_into(dv, dx, true);
  q.local.backward_weight(dq, saved.q_in);
  k.local.backward_weight(dk, saved.k_in);
  v.local.backward_weight(dv, saved.v_in);
  saved = AttentionSaved{};
  if (!sequence_parallel) {
    tp->all_reduce(dx);  // the one reduction of the backward
    return dx;
  }
  Tensor my_tokens = new_gradient(Shape{dx.numel() / dx.size(2) / tp->size(), dx.size(2)}, dx);
  tp->reduce_scatter(dx, my_tokens);
  return my_tokens;
}

}  // namespace dtp::ch04
