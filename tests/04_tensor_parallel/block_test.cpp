// Puzzle 4.7: the tensor-parallel block, with and without sequence
// parallelism, equals the serial block (in f64, or f32: tp_checks.h); under
// sequence parallelism it moves all-gathers and reduce-scatters instead of
// all-reduces (the same bytes), divides the residual stream's activations by
// t, and sums the replicated parameters' gradients over the group so the
// replicas agree.
#include "tp_checks.h"

namespace dtp::testing::ch04 {
namespace {

// Saved activation bytes after the block's forward, per rank, of the
// reference design (what the lesson's table adds up), in elements:
//   both modes: q, k, v and the attention output (4 N C/t), the MLP's hidden
//   activations before and after GELU (2 x 4 N C / t), the probabilities
//   (B H T^2 / t), and the two LayerNorm outputs the column-parallel linears
//   keep for their weight gradients, gathered (2 N C);
//   plain TP: the residual after attention and the block output (2 N C),
//   the LayerNorm statistics (4 N);
//   sequence parallel: those on this rank's tokens only (2 N C / t, 4 N / t);
// each element of @p element bytes (the dtype's size).
std::int64_t activation_bound(int t, bool sp, std::int64_t element) {
  const std::int64_t shared =
      4 * kN * kC / t + 8 * kN * kC / t + kB * kHeads * kT * kT / t + 2 * kN * kC;
  const std::int64_t sharded_by_sp = 2 * kN * kC + 4 * kN;
  return element * (shared + (sp ? sharded_by_sp / t : sharded_by_sp));
}

std::string block_on(Comm& comm, bool sp) {
  const int t = comm.size(), r = comm.rank();
  const Device on = comm.device();
  const Closeness within = block_tolerance(checker_dtype(on));
  const GPTConfig config = layer_config(on);
  Block serial(config, 0);
  randomize(serial, 7);
  const std::vector<double> x = values(random_tensor(Shape{kB, kT, kC}, 71, on));
  const std::vector<double> dy = values(random_tensor(Shape{kB, kT, kC}, 72, on));
  std::vector<double> y_full, dx_full;
  {
    BlockSaved saved;
    y_full = values(serial.forward(tensor_of(x, Shape{kB, kT, kC}, on), saved));
    dx_full = values(serial.backward(tensor_of(dy, Shape{kB, kT, kC}, on), saved));
  }
  TensorParallelBlock block(comm, serial, TensorParallelOptions{sp});
  Tensor my_x = sp ? tensor_of(my_tokens(x, kC, t, r), Shape{kN / t, kC}, on)
                   : tensor_of(x, Shape{kB, kT, kC}, on);
  Tensor my_dy = sp ? tensor_of(my_tokens(dy, kC, t, r), Shape{kN / t, kC}, on)
                    : tensor_of(dy, Shape{kB, kT, kC}, on);
  std::shared_ptr<MemoryTracker> tracker = current_memory_tracker();
  TensorParallelBlockSaved saved;
  const std::int64_t activations_before = tracker->live(MemoryCategory::activations);
  const CommStats s0 = comm.stats();
  Tensor y = block.forward(my_x, saved, kB);
  const CommStats s1 = comm.stats();
  const std::int64_t held = tracker->live(MemoryCategory::activations) - activations_before;
  Tensor dx = block.backward(my_dy, saved);
  const CommStats s2 = comm.stats();
  block.reduce_replicated_gradients();
  const CommStats s3 = comm.stats();

  std::string m;
  auto mine = [&](const std::vector<double>& v) { return sp ? my_tokens(v, kC, t, r) : v; };
  m += check_values("4.7 block output", r, mine(y_full), values(y), within);
  m += check_values("4.7 block input gradient", r, mine(dx_full), values(dx), within);
  const std::string replicated_hint =
      sp ? "(a replicated parameter: under sequence parallelism each rank's backward sees only its "
           "own tokens, so "
           "reduce_replicated_gradients() must all-reduce it over the group)"
         : "(a replicated parameter: without sequence parallelism every rank computes it whole; "
           "reduce_replicated_gradients() must leave it alone)";
  m += check_unit_slices("gradient", r, t, serial, block, true, within, replicated_hint);
  std::vector<std::pair<std::string, Tensor>> replicated;
  const char* names[] = {"ln1.weight", "ln1.bias", "attn.proj.bias",
                         "ln2.weight", "ln2.bias", "mlp.proj.bias"};
  for (const char* name : names)
    replicated.push_back({std::string("4.7 gradient of ") + name, block.parameter(name).grad});
  if (m.empty()) m += check_replicas_agree(comm, replicated, replicated_hint);

  const std::int64_t element = element_bytes(on), bytes = kN * kC * element;
  if (!sp) {
    m += check_comm("4.7 block forward", r, comm_use(s0, s1), {{"all_reduce", 2}}, 2 * bytes,
                    "one all-reduce for attention and one for the MLP");
    m += check_comm("4.7 block backward", r, comm_use(s1, s2), {{"all_reduce", 2}}, 2 * bytes,
                    "one all-reduce for the MLP and one for attention");
    m += check_comm("4.7 reduce_replicated_gradients without sequence parallelism", r,
                    comm_use(s2, s3), {}, 0, "the replicated gradients are whole already");
  } else {
    m += check_comm("4.7 sequence-parallel block forward", r, comm_use(s0, s1),
                    {{"all_gather", 2}, {"reduce_scatter", 2}}, 4 * bytes,
                    "no all-reduce: an all-gather before and a reduce-scatter after attention and "
                    "the MLP each, the "
                    "same bytes as plain TP's two all-reduces");
    m += check_comm("4.7 sequence-parallel block backward", r, comm_use(s1, s2),
                    {{"all_gather", 2}, {"reduce_scatter", 2}}, 4 * bytes,
                    "no all-reduce: the mirror of the forward (the replicated gradients are summed "
                    "later, once)");
    const CommUse reduce = comm_use(s2, s3);
    if (reduce.bytes != 6 * kC * element || reduce.count("all_reduce") < 1 ||
        reduce.calls.size() != 1)
      m += "\n    rank " + std::to_string(r) + ": 4.7 reduce_replicated_gradients made " +
           reduce.str() +
           ", expected all-reduces of the six replicated gradients (ln1, ln2 weight and bias, the "
           "two row-parallel "
           "biases: 6 x C x " +
           std::to_string(element) + " = " + std::to_string(6 * kC * element) + " bytes in all)";
  }
  const std::int64_t bound = activation_bound(t, sp, element);
  if (held > bound)
    m += "\n    rank " + std::to_string(r) + ": 4.7 the block's forward left " +
         std::to_string(held) + " bytes of activations, above the lesson's bound of " +
         std::to_string(bound) + " for t = " + std::to_string(t) + (sp ? " with" : " without") +
         " sequence parallelism (" + std::to_string(held - bound) +
         " bytes more; a whole [N, C] is " + std::to_string(bytes) +
         "). Something is kept whole that the design holds as a shard, or kept twice";
  return m;
}

TEST(Puzzle4_7_sequence_parallel_block, PlainTensorParallelBlockEqualsTheSerialBlock) {
  for (int t : tp_sizes())
    run_and_report("4.7 TensorParallelBlock, plain", t,
                   [](Comm& comm) { return block_on(comm, false); });
}

TEST(Puzzle4_7_sequence_parallel_block,
     SequenceParallelBlockEqualsTheSerialBlockAndItsReplicasAgree) {
  for (int t : tp_sizes())
    run_and_report("4.7 TensorParallelBlock, sequence-parallel", t,
                   [](Comm& comm) { return block_on(comm, true); });
}

}  // namespace
}  // namespace dtp::testing::ch04
