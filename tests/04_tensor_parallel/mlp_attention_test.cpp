// Puzzles 4.3 and 4.4: the MLP and attention, tensor-parallel, equal the
// serial layers (in f64, or f32: tp_checks.h) for t = 1 to 4, with exactly
// one reduction forward and one backward (an all-gather and a reduce-scatter
// each way under sequence parallelism); heads that do not split are a clear
// error.
#include "tp_checks.h"

namespace dtp::testing::ch04 {
namespace {

struct Io {
  Tensor x, dy;               // what this rank passes in
  std::vector<double> y, dx;  // what it should get back
};

// x [B, T, C] and dy: whole, or this rank's tokens under sequence parallelism.
Io inputs(bool sp, int t, int r, const std::vector<double>& x, const std::vector<double>& dy,
          const std::vector<double>& y_full, const std::vector<double>& dx_full, Device on) {
  Io io;
  if (!sp) {
    io.x = tensor_of(x, Shape{kB, kT, kC}, on);
    io.dy = tensor_of(dy, Shape{kB, kT, kC}, on);
    io.y = y_full;
    io.dx = dx_full;
  } else {
    io.x = tensor_of(my_tokens(x, kC, t, r), Shape{kN / t, kC}, on);
    io.dy = tensor_of(my_tokens(dy, kC, t, r), Shape{kN / t, kC}, on);
    io.y = my_tokens(y_full, kC, t, r);
    io.dx = my_tokens(dx_full, kC, t, r);
  }
  return io;
}

std::string check_pair_comm(const std::string& what, int r, bool sp, const CommUse& forward,
                            const CommUse& backward, const std::string& backward_why, Device on) {
  const std::int64_t bytes = kN * kC * element_bytes(on);
  std::string m;
  if (!sp) {
    m += check_comm(what + " forward", r, forward, {{"all_reduce", 1}}, bytes,
                    "exactly one all-reduce of [N, C] (the row-parallel output)");
    m += check_comm(what + " backward", r, backward, {{"all_reduce", 1}}, bytes, backward_why);
  } else {
    m += check_comm(what + " sequence-parallel forward", r, forward,
                    {{"all_gather", 1}, {"reduce_scatter", 1}}, 2 * bytes,
                    "one all-gather of the input tokens and one reduce-scatter of the output");
    m += check_comm(what + " sequence-parallel backward", r, backward,
                    {{"all_gather", 1}, {"reduce_scatter", 1}}, 2 * bytes,
                    "one all-gather of dy's tokens and one reduce-scatter of dx");
  }
  return m;
}

std::string mlp_on(Comm& comm, bool sp) {
  const int t = comm.size(), r = comm.rank();
  const Device on = comm.device();
  const Closeness within = layer_tolerance(checker_dtype(on));
  const GPTConfig config = layer_config(on);
  Block block(config, 0);
  randomize(block, 7);
  const Mlp& full = block.mlp;
  const std::vector<double> x = values(random_tensor(Shape{kB, kT, kC}, 21, on));
  const std::vector<double> dy = values(random_tensor(Shape{kB, kT, kC}, 22, on));
  MlpSaved serial;
  const std::vector<double> y_full =
      values(full.forward(tensor_of(x, Shape{kB, kT, kC}, on), serial));
  const std::vector<double> dx_full =
      values(full.backward(tensor_of(dy, Shape{kB, kT, kC}, on), serial));

  TensorParallelMlp mlp(comm, config, sp);
  load_rows(mlp.fc, full.fc, t, r);
  load_columns(mlp.proj, full.proj, t, r);
  Io io = inputs(sp, t, r, x, dy, y_full, dx_full, on);
  TensorParallelMlpSaved saved;
  const CommStats s0 = comm.stats();
  Tensor y = mlp.forward(io.x, saved);
  const CommStats s1 = comm.stats();
  Tensor dx = mlp.backward(io.dy, saved);
  const CommStats s2 = comm.stats();
  std::string m;
  m += check_values("4.3 MLP output", r, io.y, values(y), within);
  m += check_values("4.3 MLP input gradient", r, io.dx, values(dx), within,
                    {{std::to_string(t) + "x the true gradient: reduced twice?", times(io.dx, t)}});
  m += check_values("4.3 fc weight gradient (this rank's rows)", r, grad_rows(full.fc, t, r),
                    values(mlp.fc.local.weight_grad), within);
  m += check_values("4.3 proj weight gradient (this rank's columns)", r,
                    grad_columns(full.proj, t, r), values(mlp.proj.local.weight_grad), within);
  m += check_pair_comm("4.3 MLP", r, sp, comm_use(s0, s1), comm_use(s1, s2),
                       "exactly one all-reduce of [N, C] (fc's input gradient)", on);
  return m;
}

std::string attention_on(Comm& comm, bool sp, AttentionKind kind) {
  const int t = comm.size(), r = comm.rank();
  const Device on = comm.device();
  const Closeness within = layer_tolerance(checker_dtype(on));
  const GPTConfig config = layer_config(on, kind);
  Block block(config, 0);
  randomize(block, 7);
  const CausalSelfAttention& full = block.attn;
  const std::vector<double> x = values(random_tensor(Shape{kB, kT, kC}, 23, on));
  const std::vector<double> dy = values(random_tensor(Shape{kB, kT, kC}, 24, on));
  AttentionSaved serial;
  const std::vector<double> y_full =
      values(full.forward(tensor_of(x, Shape{kB, kT, kC}, on), serial));
  const std::vector<double> dx_full =
      values(full.backward(tensor_of(dy, Shape{kB, kT, kC}, on), serial));

  TensorParallelAttention attn(comm, config, sp);
  load_rows(attn.q, full.q, t, r);
  load_rows(attn.k, full.k, t, r);
  load_rows(attn.v, full.v, t, r);
  load_columns(attn.proj, full.proj, t, r);
  Io io = inputs(sp, t, r, x, dy, y_full, dx_full, on);
  AttentionSaved saved;
  const CommStats s0 = comm.stats();
  Tensor y = attn.forward(io.x, saved, kB);
  const CommStats s1 = comm.stats();
  Tensor dx = attn.backward(io.dy, saved);
  const CommStats s2 = comm.stats();
  std::string m;
  m += check_values("4.4 attention output", r, io.y, values(y), within);
  m += check_values("4.4 attention input gradient", r, io.dx, values(dx), within);
  const std::vector<std::pair<const char*, const Linear*>> heads_split = {
      {"q", &full.q}, {"k", &full.k}, {"v", &full.v}};
  const ColumnParallelLinear* mine[] = {&attn.q, &attn.k, &attn.v};
  for (std::size_t i = 0; i < heads_split.size(); ++i) {
    const auto& [name, serial_layer] = heads_split[i];
    m += check_values(std::string("4.4 ") + name + " weight gradient (this rank's heads' rows)", r,
                      grad_rows(*serial_layer, t, r), values(mine[i]->local.weight_grad), within);
  }
  m += check_values("4.4 proj weight gradient (this rank's heads' columns)", r,
                    grad_columns(full.proj, t, r), values(attn.proj.local.weight_grad), within);
  m += check_pair_comm(
      "4.4 attention", r, sp, comm_use(s0, s1), comm_use(s1, s2),
      "exactly one all-reduce of [N, C]: q, k and v read the same input, so add their three input "
      "gradients on the rank and reduce the sum once",
      on);
  return m;
}

TEST(Puzzle4_3_tensor_parallel_mlp, EqualsTheSerialMlpWithOneReductionEachWay) {
  for (bool sp : {false, true})
    for (int t : tp_sizes())
      run_and_report(std::string("4.3 TensorParallelMlp, ") + (sp ? "sequence-parallel" : "plain"),
                     t, [sp](Comm& comm) { return mlp_on(comm, sp); });
}

TEST(Puzzle4_4_tensor_parallel_attention, EqualsTheSerialAttentionWithOneReductionEachWay) {
  for (AttentionKind kind : {AttentionKind::naive, AttentionKind::flash})
    for (bool sp : {false, true})
      for (int t : tp_sizes())
        run_and_report(std::string("4.4 TensorParallelAttention, ") + attention_kind_name(kind) +
                           ", " + (sp ? "sequence-parallel" : "plain"),
                       t, [sp, kind](Comm& comm) { return attention_on(comm, sp, kind); });
}

TEST(Puzzle4_4_tensor_parallel_attention, HeadsThatDoNotSplitAreAnErrorNamingBoth) {
  run_and_report("4.4 6 heads over 4 ranks", 4, [](Comm& comm) -> std::string {
    GPTConfig config = layer_config(comm.device());
    config.heads = 6;  // C = 24 splits over 4 ranks, 6 heads do not
    try {
      TensorParallelAttention attn(comm, config, false);
    } catch (const dtp::Error& e) {
      const std::string text = e.what();
      if (text.find("heads") != std::string::npos && text.find('6') != std::string::npos &&
          text.find('4') != std::string::npos)
        return "";
      return "\n    rank " + std::to_string(comm.rank()) +
             ": the error for 6 heads over 4 ranks should say 'heads' "
             "and name both numbers, got: " +
             text;
    }
    return "\n    rank " + std::to_string(comm.rank()) +
           ": TensorParallelAttention accepted 6 heads over 4 ranks; "
           "each rank must own whole heads: throw a dtp::Error naming both (even_split does)";
  });
}

}  // namespace
}  // namespace dtp::testing::ch04
