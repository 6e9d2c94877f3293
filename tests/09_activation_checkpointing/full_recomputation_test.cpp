// Puzzle 9.1: full recomputation. One block first (what its forward keeps,
// that its backward equals the plain one bit for bit, what it makes again,
// at what cost and for how long), then a whole GPT step, a mixture of
// experts step, three training steps, deferred weight gradients, the loss
// scale, and data parallelism on two ranks.
#include "checkpoint_checks.h"

namespace dtp {
namespace {

using namespace testing;
using namespace testing::ch09;

/// The layers' tensors a BlockSaved holds, by name (defined ones only).
std::vector<std::string> layer_tensors_kept(const BlockSaved& s) {
  std::vector<std::string> kept;
  auto note = [&](const char* name, const Tensor& t) {
    if (t.defined()) kept.push_back(name);
  };
  note("ln1.input", s.ln1.input), note("ln1.mean", s.ln1.mean), note("ln1.rstd", s.ln1.rstd);
  note("attn.q_in", s.attn.q_in.input), note("attn.q", s.attn.q), note("attn.k", s.attn.k);
  note("attn.v", s.attn.v), note("attn.probs", s.attn.probs);
  note("attn.proj_in", s.attn.proj_in.input), note("ln2.input", s.ln2.input);
  note("ln2.mean", s.ln2.mean), note("mlp.fc", s.mlp.fc.input);
  note("mlp.gelu", s.mlp.gelu.input), note("mlp.proj", s.mlp.proj.input);
  return kept;
}

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

TEST(Puzzle9_1_full_recomputation, ForwardKeepsOnlyTheBlockInputItself) {
  OneBlock b;
  BlockSaved plain_saved;
  const Tensor expected = b.block.run_forward(b.x, plain_saved);
  ScopedTracker scope;
  dtp::ch09::FullRecomputation policy;
  BlockSaved saved;
  const Tensor out = policy.forward(b.block, b.x, saved);
  ASSERT_TRUE(out.defined() && out.shape() == b.x.shape())
      << "forward must return the block's output [" << kBatch << ", " << kSeq << ", 16], got "
      << (out.defined() ? out.describe() : "nothing");
  EXPECT_EQ(out.to_vector(), expected.to_vector())
      << "the output differs from Block::run_forward's: return what run_forward returned";
  const std::vector<std::string> kept = layer_tensors_kept(saved);
  EXPECT_TRUE(kept.empty()) << "after forward the block still keeps the layers' " << joined(kept)
                            << ": drop them (saved.clear()), only the input stays";
  ASSERT_TRUE(saved.checkpoint.defined())
      << "saved.checkpoint is empty: keep the block input there for the backward";
  EXPECT_TRUE(saved.checkpoint.shares_storage_with(b.x))
      << "saved.checkpoint is a copy of the input: keep the tensor itself (a copy costs "
      << bytes_text(hidden_bytes(step_of(b.config)), step_of(b.config))
      << " more, and the input is alive anyway: the previous block made it)";
  const StepShape step = step_of(b.config);
  const std::int64_t live = scope.tracker->live(MemoryCategory::activations);
  EXPECT_EQ(bytes_check("activations alive after the checkpointed forward (the output only)",
                        hidden_bytes(step), live, step,
                        live >= block_activation_bytes(step)
                            ? "everything the layers saved is still alive"
                            : "something besides the output survived the forward"),
            "");
}

TEST(Puzzle9_1_full_recomputation, BackwardEqualsThePlainBlockBitForBit) {
  OneBlock plain, checkpointed;
  BlockSaved saved;
  plain.block.run_forward(plain.x, saved);
  const Tensor expected_dx = plain.block.run_backward(plain.dy, saved);

  dtp::ch09::FullRecomputation policy;
  BlockSaved ck;
  policy.forward(checkpointed.block, checkpointed.x, ck);
  Tensor dx;
  const std::string error = error_of([&] {
    dx = policy.backward(checkpointed.block, checkpointed.dy, ck, WeightGrads::immediate, 1.0);
  });
  ASSERT_EQ(error, "(no error)")
      << "backward threw. The forward kept only the input (saved.checkpoint): the backward must "
         "first run the block's forward again from it (Block::run_forward, inside a "
         "RecomputeScope), so that Block::run_backward finds what the layers saved";
  ASSERT_TRUE(dx.defined() && dx.shape() == checkpointed.x.shape())
      << "backward must return dx shaped like the input, got "
      << (dx.defined() ? dx.describe() : "nothing");
  EXPECT_TRUE(values_equal("dx", -1, expected_dx.to_vector(), dx.to_vector()))
      << "dx differs from the plain block's: the recomputed forward must be the same forward "
         "(same input, Block::run_forward), then Block::run_backward with the same dy";
  EXPECT_EQ(grads_check("the parameter gradients, against the plain block's", checkpointed.block,
                        plain.block.grads().to_vector(), checkpointed.block.grads().to_vector()),
            "");
  std::vector<std::string> left = layer_tensors_kept(ck);
  if (ck.checkpoint.defined()) left.push_back("the checkpoint (saved.checkpoint = Tensor())");
  EXPECT_TRUE(left.empty()) << "after backward the BlockSaved must be empty; it still holds "
                            << joined(left);
}

TEST(Puzzle9_1_full_recomputation, TheBackwardMakesOneBlockAgainAsRecompute) {
  // The checker's own recompute and backward first: the peak of every byte
  // the backward holds, with the recomputed output dropped at once.
  std::int64_t expected_total = 0;
  {
    OneBlock own;
    BlockSaved saved;
    ScopedTracker scope;
    {
      RecomputeScope recompute;
      own.block.run_forward(own.x, saved);
    }
    own.block.run_backward(own.dy, saved);
    expected_total = scope.tracker->total_peak();
  }
  OneBlock b;
  dtp::ch09::FullRecomputation policy;
  BlockSaved saved;
  policy.forward(b.block, b.x, saved);
  ScopedTracker scope;
  reset_flop_counts();
  policy.backward(b.block, b.dy, saved, WeightGrads::immediate, 1.0);
  const FlopCounts flops = flop_counts();
  const StepShape step = step_of(b.config);
  const std::int64_t forward = block_forward_flops(b.config);
  EXPECT_EQ(scope.tracker->peak(MemoryCategory::activations), 0)
      << "the backward made " << scope.tracker->peak(MemoryCategory::activations)
      << " bytes charged as kept activations: run the forward again inside a "
         "dtp::RecomputeScope, so the tracker tells what was made again";
  EXPECT_EQ(bytes_check("recompute peak of the backward (one block's saved tensors and output)",
                        block_activation_bytes(step),
                        scope.tracker->peak(MemoryCategory::recompute), step),
            "");
  EXPECT_EQ(flops.recompute, forward)
      << "recomputed FLOPs: expected one forward of the block, " << forward << ", got "
      << flops.recompute << " ("
      << static_cast<double>(flops.recompute) / static_cast<double>(forward) << " forwards)"
      << (flops.recompute == 0             ? ": nothing ran inside a dtp::RecomputeScope"
          : flops.recompute == 2 * forward ? ": the forward ran twice"
          : flops.recompute == 3 * forward
              ? ": a forward and a backward; close the RecomputeScope before Block::run_backward"
              : "");
  EXPECT_EQ(scope.tracker->live(MemoryCategory::recompute), 0)
      << "after the backward " << scope.tracker->live(MemoryCategory::recompute)
      << " recomputed bytes are still alive: drop the recomputed output";
  const std::int64_t total = scope.tracker->total_peak();
  EXPECT_EQ(
      bytes_check("peak of the memory the backward allocated (recompute, then Block::run_backward)",
                  expected_total, total, step,
                  total - expected_total == hidden_bytes(step)
                      ? "one [B, T, C] more: the recomputed output lives through "
                        "Block::run_backward; drop it at once, the next block has the first"
                      : ""),
      "");
}

TEST(Puzzle9_1_full_recomputation, BackwardWithoutForwardIsAClearError) {
  OneBlock b;
  dtp::ch09::FullRecomputation policy;
  BlockSaved empty;
  const std::string message =
      error_of([&] { policy.backward(b.block, b.dy, empty, WeightGrads::immediate, 1.0); });
  EXPECT_NE(message.find("block.0"), std::string::npos)
      << "a backward with nothing saved must throw dtp::Error naming the block (block.0), got: "
      << message;
}

TEST(Puzzle9_1_full_recomputation, AGptStepEqualsThePlainStepWithOneForwardMorePerBlock) {
  const GPTConfig config = checker_model(4);
  const StepShape step = step_of(config);
  dtp::ch09::FullRecomputation policy;
  const StepResult plain = run_step(config, {});
  const StepResult got = run_step(config, on_every_block(config, policy));
  EXPECT_EQ(bitwise_equal_step(plain, got, config, "every block checkpointed"), "");
  const ActivationPeaks expected =
      predicted_activation_peaks(step, std::vector<BlockKeeps>(4, BlockKeeps::input_only));
  EXPECT_EQ(
      bytes_check("activation peak of the step", expected.activations, got.activation_peak, step),
      "");
  EXPECT_EQ(bytes_check("recompute peak of the step", expected.recompute, got.recompute_peak, step),
            "");
  EXPECT_EQ(bytes_check("peak of kept and recomputed activations together", expected.combined,
                        got.combined_peak, step),
            "");
  EXPECT_EQ(bytes_check("activations alive after the backward", 0, got.left_after, step,
                        got.left_after == 4 * hidden_bytes(step)
                            ? "one [B, T, C] per block: the checkpoints; drop saved.checkpoint"
                            : ""),
            "");
  const std::int64_t extra = got.flops.total - plain.flops.total;
  EXPECT_EQ(extra, 4 * block_forward_flops(config))
      << "a checkpointed step computes one more forward of each of the 4 blocks, "
      << 4 * block_forward_flops(config) << " FLOPs; this one computed " << extra << " more ("
      << static_cast<double>(extra) / static_cast<double>(block_forward_flops(config))
      << " block forwards)";
  EXPECT_EQ(got.flops.recompute, extra)
      << got.flops.recompute << " FLOPs ran inside a RecomputeScope, of " << extra << " extra"
      << (got.flops.recompute < extra
              ? ": recompute inside one"
              : ": the scope must hold the recomputed forward alone, not Block::run_backward");
}

TEST(Puzzle9_1_full_recomputation, AMixtureOfExpertsStepKeepsItsBalanceLoss) {
  // A mixture-of-experts block leaves its load-balancing loss in
  // saved.moe.aux_loss; the model adds it to the loss after the forward.
  GPTConfig config = checker_model(2);
  config.experts = 2;
  dtp::ch09::FullRecomputation policy;
  const StepResult plain = run_step(config, {});
  const StepResult got = run_step(config, on_every_block(config, policy));
  EXPECT_EQ(bitwise_equal_step(plain, got, config, "mixture of experts, every block checkpointed"),
            "")
      << (got.loss < plain.loss ? "the loss is lower than the plain step's: did saved.clear() "
                                  "drop the blocks' load-balancing loss (saved.moe.aux_loss)?"
                                : "");
}

TEST(Puzzle9_1_full_recomputation, ThreeTrainingStepsEqualPlainTrainingBitForBit) {
  TrainConfig config = on_device(tiny_config(6, 3), checker_device());
  config.model.layers = 3;
  Trainer plain(config), checkpointed(config);
  dtp::ch09::FullRecomputation policy;
  for (int i = 0; i < 3; ++i) checkpointed.model().block(i).policy = &policy;
  for (int s = 0; s < 3; ++s) {
    const double expected = plain.step().loss, got = checkpointed.step().loss;
    ASSERT_EQ(got, expected) << "step " << s << ": loss " << got << ", plain training's "
                             << expected;
    EXPECT_EQ(compare_units("parameters after step " + std::to_string(s), checkpointed.model(),
                            capture(plain.model(), {}).params,
                            capture(checkpointed.model(), {}).params, Closeness{0, 0}),
              "");
  }
}

TEST(Puzzle9_1_full_recomputation, DeferredWeightGradientsComeWithBackwardWeight) {
  // A zero-bubble pipeline asks for input gradients first and weight
  // gradients later (WeightGrads::deferred, then Block::backward_weight).
  OneBlock plain, checkpointed;
  BlockSaved saved;
  plain.block.run_forward(plain.x, saved);
  plain.block.run_backward(plain.dy, saved, WeightGrads::deferred);
  const std::vector<double> before_weights = plain.block.grads().to_vector();
  plain.block.backward_weight(saved);
  dtp::ch09::FullRecomputation policy;
  BlockSaved ck;
  policy.forward(checkpointed.block, checkpointed.x, ck);
  policy.backward(checkpointed.block, checkpointed.dy, ck, WeightGrads::deferred, 1.0);
  EXPECT_EQ(grads_check("WeightGrads::deferred, before backward_weight", checkpointed.block,
                        before_weights, checkpointed.block.grads().to_vector()),
            "")
      << "the weight gradients must wait for backward_weight; if they came with the backward, "
         "pass the mode on to Block::run_backward";
  checkpointed.block.backward_weight(ck);
  EXPECT_EQ(grads_check("WeightGrads::deferred, after backward_weight", checkpointed.block,
                        plain.block.grads().to_vector(), checkpointed.block.grads().to_vector()),
            "");
}

TEST(Puzzle9_1_full_recomputation, TheLossScaleReachesAMixtureOfExpertsBlock) {
  // A mixture-of-experts block scales its load-balancing loss's gradient by
  // the loss scale (a pipeline passes 1 / micro-batches).
  GPTConfig config = checker_model(1);
  config.experts = 2;
  OneBlock plain(config), checkpointed(config);
  BlockSaved saved;
  plain.block.run_forward(plain.x, saved);
  plain.block.run_backward(plain.dy, saved, WeightGrads::immediate, 0.25);
  dtp::ch09::FullRecomputation policy;
  BlockSaved ck;
  policy.forward(checkpointed.block, checkpointed.x, ck);
  policy.backward(checkpointed.block, checkpointed.dy, ck, WeightGrads::immediate, 0.25);
  EXPECT_EQ(grads_check("loss_scale 0.25, against the plain block's", checkpointed.block,
                        plain.block.grads().to_vector(), checkpointed.block.grads().to_vector()),
            "")
      << "pass loss_scale on to Block::run_backward";
}

TEST(Puzzle9_1_full_recomputation, DataParallelTrainingEqualsItsPlainSelf) {
  // Two ranks, each all-reducing its gradients after backward (chapter 02's
  // 2.2, written here): checkpointing must not change a bit, and the
  // replicas stay identical.
  dtp::ch09::FullRecomputation policy;
  run_ranks(2, [&](Comm& comm) {
    const ModelState plain = train_data_parallel(comm, nullptr);
    const ModelState got = train_data_parallel(comm, &policy);
    EXPECT_EQ(got.losses, plain.losses) << "rank " << comm.rank() << ": the losses differ";
    EXPECT_EQ(got.params, plain.params)
        << "rank " << comm.rank() << ": the parameters after 2 data-parallel steps differ from "
        << "the same training without checkpointing";
    std::vector<std::pair<std::string, Tensor>> replicas;
    for (std::size_t u = 0; u < got.params.size(); ++u)
      replicas.emplace_back("unit " + std::to_string(u) + " parameters",
                            Tensor::from_values(got.params[u], DType::f64).to(comm.device()));
    EXPECT_EQ(check_replicas_agree(comm, replicas, "every rank applies the same averaged update",
                                   "data-parallel"),
              "");
  });
}

}  // namespace
}  // namespace dtp
