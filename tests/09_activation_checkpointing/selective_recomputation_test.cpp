// Puzzle 9.3: selective recomputation. The block keeps all but the attention
// probabilities; its backward makes them again (and nothing else), equal to
// the plain block bit for bit; a GPT step's memory is the lesson's formula;
// flash attention is refused with the reason.
#include "checkpoint_checks.h"

namespace dtp {
namespace {

using namespace testing;
using namespace testing::ch09;

TEST(Puzzle9_3_selective_recomputation, ForwardDropsOnlyTheProbabilities) {
  const GPTConfig config = checker_model(1);
  const StepShape step = step_of(config);
  Block block(config, 0);
  Tensor x = Tensor::empty({kBatch, kSeq, 16}, config.dtype, config.device);
  Rng rng(3);
  ops::fill_normal(x, 0, 1, rng);
  ScopedTracker scope;
  dtp::ch09::SelectiveRecomputation policy;
  BlockSaved saved;
  const Tensor out = policy.forward(block, x, saved);  // alive: the next block's input
  EXPECT_FALSE(saved.attn.probs.defined())
      << "saved.attn.probs is still there after forward: selective recomputation drops it";
  EXPECT_TRUE(saved.attn.q.defined() && saved.attn.k.defined() && saved.attn.v.defined() &&
              saved.mlp.gelu.input.defined() && saved.ln1.input.defined())
      << "selective recomputation keeps everything but the probabilities (q, k, v, the MLP's "
         "inputs, the LayerNorms' inputs): something else was dropped";
  const std::int64_t expected = block_activation_bytes(step) - attention_stat_bytes(step);
  EXPECT_EQ(bytes_check("activations alive after the forward (a plain block's, less B H T T)",
                        expected, scope.tracker->live(MemoryCategory::activations), step),
            "");
}

TEST(Puzzle9_3_selective_recomputation, BackwardMakesOnlyTheAttentionAgain) {
  const GPTConfig config = checker_model(1);
  const StepShape step = step_of(config);
  Block plain(config, 0), selective(config, 0);
  Tensor x = Tensor::empty({kBatch, kSeq, 16}, config.dtype, config.device);
  Tensor dy = Tensor::empty({kBatch, kSeq, 16}, config.dtype, config.device);
  Rng rng(3);
  ops::fill_normal(x, 0, 1, rng);
  ops::fill_normal(dy, 0, 1, rng);
  BlockSaved saved;
  plain.run_forward(x, saved);
  const Tensor expected_dx = plain.run_backward(dy, saved);

  dtp::ch09::SelectiveRecomputation policy;
  BlockSaved kept;
  policy.forward(selective, x, kept);
  ScopedTracker scope;
  reset_flop_counts();
  const Tensor dx = policy.backward(selective, dy, kept, WeightGrads::immediate, 1.0);
  const FlopCounts flops = flop_counts();
  ASSERT_TRUE(dx.defined()) << "backward returned no dx";
  EXPECT_EQ(dx.to_vector(), expected_dx.to_vector())
      << "dx differs from the plain block's: the recomputed probabilities must be the forward's "
         "(ops::attention_forward on the saved q, k, v viewed as [B, T, H, D])";
  EXPECT_EQ(selective.grads().to_vector(), plain.grads().to_vector())
      << "the parameter gradients differ from the plain block's";
  EXPECT_EQ(flops.recompute, attention_core_flops(config))
      << "recomputed FLOPs: expected attention's scores and output only, "
      << attention_core_flops(config) << ", got " << flops.recompute
      << (flops.recompute == 0 ? " (nothing ran inside a RecomputeScope)"
          : flops.recompute > attention_core_flops(config)
              ? " (more than the attention: was the whole block run again?)"
              : "");
  EXPECT_EQ(bytes_check("recompute peak (the probabilities and a scratch attention output)",
                        attention_stat_bytes(step) + hidden_bytes(step),
                        scope.tracker->peak(MemoryCategory::recompute), step),
            "");
  EXPECT_EQ(scope.tracker->peak(MemoryCategory::activations), 0)
      << "the backward made kept activations: make the probabilities inside a RecomputeScope";
}

TEST(Puzzle9_3_selective_recomputation, AGptStepEqualsThePlainStepAndItsFormula) {
  const GPTConfig config = checker_model(4);
  const StepShape step = step_of(config);
  dtp::ch09::SelectiveRecomputation policy;
  const StepResult plain = run_step(config, {});
  const StepResult got = run_step(config, on_every_block(config, policy));
  EXPECT_EQ(bitwise_equal_step(plain, got, config, "every block selective"), "");
  const ActivationPeaks expected =
      predicted_activation_peaks(step, std::vector<BlockKeeps>(4, BlockKeeps::all_but_probs));
  EXPECT_EQ(
      bytes_check("activation peak of the step", expected.activations, got.activation_peak, step),
      "");
  EXPECT_EQ(bytes_check("recompute peak of the step", expected.recompute, got.recompute_peak, step),
            "");
  EXPECT_EQ(bytes_check("kept and recomputed together", expected.combined, got.combined_peak, step),
            "");
  EXPECT_EQ(got.flops.total - plain.flops.total, 4 * attention_core_flops(config))
      << "selective recomputation adds attention's scores and output once per block";
}

TEST(Puzzle9_3_selective_recomputation, FlashAttentionIsRefusedWithTheReason) {
  const GPTConfig config = checker_model(1, AttentionKind::flash);
  Block block(config, 0);
  Tensor x = Tensor::zeros({kBatch, kSeq, 16}, config.dtype, config.device);
  dtp::ch09::SelectiveRecomputation policy;
  BlockSaved saved;
  const std::string message = error_of([&] { policy.forward(block, x, saved); });
  EXPECT_NE(message.find("flash"), std::string::npos)
      << "selective recomputation of a flash-attention block must throw dtp::Error saying flash "
         "attention keeps no probabilities, got: "
      << message;
}

}  // namespace
}  // namespace dtp
