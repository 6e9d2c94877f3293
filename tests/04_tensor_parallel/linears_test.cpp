// Puzzles 4.1 and 4.2: each rank's outputs and gradients equal its slice of
// the unsharded layer's (in f64, or f32: tp_checks.h), for t = 1 to 4, with
// and without sequence parallelism; and each call communicates exactly what
// the lesson says.
#include "tp_checks.h"

namespace dtp::testing::ch04 {
namespace {

// The sum over ranks of every rank's slice: what an all-reduce of slices gives.
std::vector<double> sum_of_slices(const std::vector<double>& full, std::int64_t K, int t) {
  const std::int64_t n = K / t;
  std::vector<double> sum = columns_of(full, K, 0, n);
  for (int r = 1; r < t; ++r) sum = plus(sum, columns_of(full, K, r * n, n));
  return sum;
}

std::string column_parallel_on(Comm& comm, bool sp) {
  const int t = comm.size(), r = comm.rank();
  const Device on = comm.device();
  const Closeness within = layer_tolerance(checker_dtype(on));
  Block block(layer_config(on), 0);
  randomize(block, 7);
  const Linear& full = block.mlp.fc;  // [96, 24] with bias
  const std::int64_t in = full.in_features, out = full.out_features, n = out / t;
  Tensor x = random_tensor(Shape{kB, kT, in}, 11, on),
         dy = random_tensor(Shape{kB, kT, out}, 12, on);
  LinearSaved serial;
  const std::vector<double> y_full = values(full.forward(x, serial));
  const std::vector<double> dx_full = values(full.backward(dy, serial));

  ColumnParallelLinear layer(comm, in, out, true, sp);
  load_rows(layer, full, t, r);
  // b_r on every token: what a mistake's output is built from.
  const std::vector<double> my_bias = every_token(rows_of(values(full.bias), 1, r * n, n));
  Tensor my_x = sp ? tensor_of(my_tokens(values(x), in, t, r), Shape{kN / t, in}, on) : x;
  Tensor my_dy = tensor_of(columns_of(values(dy), out, r * n, n), Shape{kN, n}, on);
  LinearSaved saved;
  const CommStats s0 = comm.stats();
  Tensor y = layer.forward(my_x, saved);
  const CommStats s1 = comm.stats();
  Tensor dx = layer.backward(my_dy, saved);
  const CommStats s2 = comm.stats();

  std::string m;
  m += check_values(
      "4.1 forward output (this rank's columns of y)", r, columns_of(y_full, out, r * n, n),
      values(y), within,
      {{"the sum over ranks of every rank's columns: the output was all-reduced, but a "
        "column-parallel "
        "forward needs no communication (its reduction is in the backward)",
        sum_of_slices(y_full, out, t)},
       {"t x W_r^T + b_r: the input was all-reduced in forward (it is already whole on every "
        "rank); "
        "the column-parallel forward needs no communication",
        plus(times(plus(columns_of(y_full, out, r * n, n), my_bias, -1.0), t), my_bias)}});
  // This rank's part of dx, the all-reduce's input.
  Tensor partial = Tensor::empty(Shape{kN, in}, checker_dtype(on), on);
  ops::matmul(my_dy, layer.local.weight, partial);
  const std::vector<double> expected_dx = sp ? my_tokens(dx_full, in, t, r) : dx_full;
  m += check_values(
      std::string("4.1 input gradient dx") + (sp ? " (this rank's tokens)" : ""), r, expected_dx,
      values(dx), within,
      {{"this rank's part dy_r W_r alone: dx must be summed over the group (all-reduce in "
        "backward)",
        sp ? my_tokens(values(partial), in, t, r) : values(partial)},
       {std::to_string(t) + "x the true gradient: summed twice?", times(expected_dx, t)}});
  m += check_values(
      "4.1 weight gradient (this rank's rows)", r, grad_rows(full, t, r),
      values(layer.local.weight_grad), within,
      {{std::to_string(t) +
            "x: the weight gradient needs no reduction (each rank owns its rows); or the "
            "saved input was t x (an all-reduce of the input in forward)",
        times(grad_rows(full, t, r), t)}});
  m += check_values("4.1 bias gradient (this rank's rows)", r,
                    rows_of(values(full.bias_grad), 1, r * n, n), values(layer.local.bias_grad),
                    within);
  const std::int64_t activation_bytes = kN * in * element_bytes(on);
  if (!sp) {
    m += check_comm("4.1 forward", r, comm_use(s0, s1), {}, 0,
                    "a column-parallel forward needs no communication (identity forward)");
    m += check_comm("4.1 backward", r, comm_use(s1, s2), {{"all_reduce", 1}}, activation_bytes,
                    "one all-reduce of dx [N, in] (all-reduce backward)");
  } else {
    m +=
        check_comm("4.1 sequence-parallel forward", r, comm_use(s0, s1), {{"all_gather", 1}},
                   activation_bytes, "one all-gather of the tokens into [N, in] before the matmul");
    m += check_comm("4.1 sequence-parallel backward", r, comm_use(s1, s2), {{"reduce_scatter", 1}},
                    activation_bytes, "one reduce-scatter of dx [N, in] into this rank's tokens");
  }
  return m;
}

std::string row_parallel_on(Comm& comm, bool sp) {
  const int t = comm.size(), r = comm.rank();
  const Device on = comm.device();
  const Closeness within = layer_tolerance(checker_dtype(on));
  Block block(layer_config(on), 0);
  randomize(block, 7);
  const Linear& full = block.mlp.proj;  // [24, 96] with bias
  const std::int64_t in = full.in_features, out = full.out_features, n = in / t;
  Tensor x = random_tensor(Shape{kB, kT, in}, 13, on),
         dy = random_tensor(Shape{kB, kT, out}, 14, on);
  LinearSaved serial;
  const std::vector<double> y_full = values(full.forward(x, serial));
  const std::vector<double> dx_full = values(full.backward(dy, serial));

  RowParallelLinear layer(comm, in, out, sp);
  load_columns(layer, full, t, r);
  Tensor my_x = tensor_of(columns_of(values(x), in, r * n, n), Shape{kN, n}, on);
  Tensor my_dy = sp ? tensor_of(my_tokens(values(dy), out, t, r), Shape{kN / t, out}, on) : dy;
  LinearSaved saved;
  const CommStats s0 = comm.stats();
  Tensor y = layer.forward(my_x, saved);
  const CommStats s1 = comm.stats();
  Tensor dx = layer.backward(my_dy, saved);
  const CommStats s2 = comm.stats();

  // What the mistakes give: the bias added on every rank before the sum; no sum at all.
  const std::vector<double> bias_rows = every_token(values(full.bias));
  Tensor partial = Tensor::empty(Shape{kN, out}, checker_dtype(on), on);
  ops::matmul(my_x, layer.local.weight, partial, false, true);
  auto mine = [&](const std::vector<double>& v) { return sp ? my_tokens(v, out, t, r) : v; };
  std::string m;
  m += check_values(
      std::string("4.2 forward output y") + (sp ? " (this rank's tokens)" : ""), r, mine(y_full),
      values(y), within,
      {{"y plus " + std::to_string(t - 1) +
            " extra biases: the bias was added on every rank before "
            "the reduction (add it once, after)",
        mine(plus(y_full, bias_rows, t - 1))},
       {"this rank's partial sum x_r W_r^T + b: the partial outputs were not summed over the group",
        mine(plus(values(partial), bias_rows))}});
  m += check_values("4.2 input gradient dx_r (this rank's columns)", r,
                    columns_of(dx_full, in, r * n, n), values(dx), within,
                    {{"the sum over ranks of every rank's columns: dx was all-reduced, but a "
                      "row-parallel backward "
                      "needs no communication (its reduction is in the forward)",
                      sum_of_slices(dx_full, in, t)}});
  m += check_values("4.2 weight gradient (this rank's columns)", r, grad_columns(full, t, r),
                    values(layer.local.weight_grad), within);
  if (!sp) {
    m += check_values("4.2 bias gradient (replicated: the whole dy's column sums)", r,
                      values(full.bias_grad), values(layer.bias_grad), within,
                      {{std::to_string(t) + "x: the bias gradient needs no reduction here",
                        times(values(full.bias_grad), t)}});
  } else {
    m += check_values(
        "4.2 sequence-parallel bias gradient (column sums of this rank's tokens of dy only; the "
        "block "
        "sums them over the group in 4.7)",
        r, column_sums(values(my_dy), out), values(layer.bias_grad), within,
        {{"the whole batch's bias gradient: under sequence parallelism it is summed over the group "
          "once per step by the block (4.7), not in the linear",
          values(full.bias_grad)}});
  }
  const std::int64_t activation_bytes = kN * out * element_bytes(on);
  if (!sp) {
    m += check_comm("4.2 forward", r, comm_use(s0, s1), {{"all_reduce", 1}}, activation_bytes,
                    "one all-reduce of the partial output [N, out] (all-reduce forward)");
    m += check_comm("4.2 backward", r, comm_use(s1, s2), {}, 0,
                    "a row-parallel backward needs no communication (identity backward)");
  } else {
    m += check_comm("4.2 sequence-parallel forward", r, comm_use(s0, s1), {{"reduce_scatter", 1}},
                    activation_bytes,
                    "one reduce-scatter of the partial output [N, out] into this rank's tokens");
    m += check_comm("4.2 sequence-parallel backward", r, comm_use(s1, s2), {{"all_gather", 1}},
                    activation_bytes, "one all-gather of dy's token shards into [N, out]");
  }
  return m;
}

TEST(Puzzle4_1_column_parallel_linear, EqualsTheUnshardedLinearForwardAndBackward) {
  expect_refusal_on_4_ranks([](Comm& tp) { ColumnParallelLinear(tp, 8, 10, true, false); },
                            "output features: 10 do not split over 4 tensor-parallel ranks");
  for (int t : tp_sizes())
    run_and_report("4.1 ColumnParallelLinear, plain", t,
                   [](Comm& comm) { return column_parallel_on(comm, false); });
}

TEST(Puzzle4_1_column_parallel_linear, SequenceParallelGathersTokensForwardAndScattersBackward) {
  for (int t : tp_sizes())
    run_and_report("4.1 ColumnParallelLinear, sequence-parallel", t,
                   [](Comm& comm) { return column_parallel_on(comm, true); });
}

TEST(Puzzle4_2_row_parallel_linear, EqualsTheUnshardedLinearForwardAndBackward) {
  expect_refusal_on_4_ranks([](Comm& tp) { RowParallelLinear(tp, 10, 8, false); },
                            "input features: 10 do not split over 4 tensor-parallel ranks");
  for (int t : tp_sizes())
    run_and_report("4.2 RowParallelLinear, plain", t,
                   [](Comm& comm) { return row_parallel_on(comm, false); });
}

TEST(Puzzle4_2_row_parallel_linear, SequenceParallelScattersTokensForwardAndGathersBackward) {
  for (int t : tp_sizes())
    run_and_report("4.2 RowParallelLinear, sequence-parallel", t,
                   [](Comm& comm) { return row_parallel_on(comm, true); });
}

}  // namespace
}  // namespace dtp::testing::ch04
