// Puzzle 9.1: full recomputation. One block first (what its forward keeps,
// that its backward equals the plain one bit for bit, what it makes again
// and at what cost), then a whole GPT step, three training steps, deferred
// weight gradients and data parallelism on two ranks.
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
  const Tensor dx =
      policy.backward(checkpointed.block, checkpointed.dy, ck, WeightGrads::immediate, 1.0);
  ASSERT_TRUE(dx.defined() && dx.shape() == checkpointed.x.shape())
      << "backward must return dx shaped like the input, got "
      << (dx.defined() ? dx.describe() : "nothing");
  EXPECT_EQ(dx.to_vector(), expected_dx.to_vector())
      << "dx differs from the plain block's: the recomputed forward must be the same forward "
         "(same input, Block::run_forward), then Block::run_backward with the same dy";
  EXPECT_EQ(checkpointed.block.grads().to_vector(), plain.block.grads().to_vector())
      << "the block's parameter gradients differ from the plain block's";
  EXPECT_TRUE(layer_tensors_kept(ck).empty() && !ck.checkpoint.defined())
      << "after backward the BlockSaved must be empty, still holds "
      << joined(layer_tensors_kept(ck)) << (ck.checkpoint.defined() ? " and the checkpoint" : "");
}

TEST(Puzzle9_1_full_recomputation, TheBackwardMakesOneBlockAgainAsRecompute) {
  OneBlock b;
  dtp::ch09::FullRecomputation policy;
  BlockSaved saved;
  policy.forward(b.block, b.x, saved);
  ScopedTracker scope;
  reset_flop_counts();
  policy.backward(b.block, b.dy, saved, WeightGrads::immediate, 1.0);
  const FlopCounts flops = flop_counts();
  const StepShape step = step_of(b.config);
  EXPECT_EQ(scope.tracker->peak(MemoryCategory::activations), 0)
      << "the backward made " << scope.tracker->peak(MemoryCategory::activations)
      << " bytes charged as kept activations: run the forward again inside a "
         "dtp::RecomputeScope, so the tracker tells what was made again";
  EXPECT_EQ(bytes_check("recompute peak of the backward (one block's saved tensors and output)",
                        block_activation_bytes(step),
                        scope.tracker->peak(MemoryCategory::recompute), step),
            "");
  EXPECT_EQ(flops.recompute, block_forward_flops(b.config))
      << "recomputed FLOPs: expected one forward of the block, " << block_forward_flops(b.config)
      << ", got " << flops.recompute << " ("
      << static_cast<double>(flops.recompute) / static_cast<double>(block_forward_flops(b.config))
      << " forwards)";
  EXPECT_EQ(scope.tracker->live(MemoryCategory::recompute), 0)
      << "after the backward " << scope.tracker->live(MemoryCategory::recompute)
      << " recomputed bytes are still alive: drop the recomputed output";
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
  EXPECT_EQ(got.left_after, 0) << got.left_after << " bytes of activations outlive the backward";
  const std::int64_t extra = got.flops.total - plain.flops.total;
  EXPECT_EQ(extra, 4 * block_forward_flops(config))
      << "a checkpointed step computes one more forward of each of the 4 blocks, "
      << 4 * block_forward_flops(config) << " FLOPs; this one computed " << extra << " more ("
      << static_cast<double>(extra) / static_cast<double>(block_forward_flops(config))
      << " block forwards)";
  EXPECT_EQ(got.flops.recompute, extra) << "of the extra FLOPs only " << got.flops.recompute
                                        << " ran inside a RecomputeScope: recompute inside one";
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

TEST(Puzzle9_1_full_recomputation, DeferredWeightGradientsStillCome) {
  // A zero-bubble pipeline asks for input gradients first and weight
  // gradients later (WeightGrads::deferred, then Block::backward_weight).
  OneBlock plain, checkpointed;
  BlockSaved saved;
  plain.block.run_forward(plain.x, saved);
  plain.block.run_backward(plain.dy, saved);
  dtp::ch09::FullRecomputation policy;
  BlockSaved ck;
  policy.forward(checkpointed.block, checkpointed.x, ck);
  policy.backward(checkpointed.block, checkpointed.dy, ck, WeightGrads::deferred, 1.0);
  checkpointed.block.backward_weight(ck);
  EXPECT_EQ(checkpointed.block.grads().to_vector(), plain.block.grads().to_vector())
      << "with WeightGrads::deferred the weight gradients differ from the plain block's after "
         "backward_weight: pass the mode on to Block::run_backward";
}

TEST(Puzzle9_1_full_recomputation, DataParallelTrainingEqualsItsPlainSelf) {
  // Two ranks, each all-reducing its gradients after backward (chapter 02's
  // 2.2, written here): checkpointing must not change a bit, and the
  // replicas stay identical.
  auto train = [](Comm& comm, bool checkpoint) {
    TrainConfig config = on_device(tiny_config(6, 2), comm.device());
    Trainer trainer(config, comm.rank(), comm.size());
    dtp::ch09::FullRecomputation policy;
    if (checkpoint)
      for (int i = 0; i < trainer.model().num_blocks(); ++i)
        trainer.model().block(i).policy = &policy;
    trainer.on_after_backward([&] {
      for (Unit* unit : trainer.model().units()) comm.all_reduce(unit->grads(), ReduceOp::avg);
    });
    std::vector<double> losses;
    for (int s = 0; s < 2; ++s) losses.push_back(trainer.step().loss);
    return capture(trainer.model(), losses);
  };
  run_ranks(2, [&](Comm& comm) {
    const ModelState plain = train(comm, false);
    const ModelState got = train(comm, true);
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
