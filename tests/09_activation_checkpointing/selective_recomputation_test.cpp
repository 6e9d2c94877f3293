// Puzzle 9.3: selective recomputation. The block keeps all but the attention
// probabilities; its backward makes them again (and nothing else, holding
// its scratch output no longer than the recompute), equal to the plain
// block bit for bit; a GPT step's memory is the lesson's formula; flash
// attention is refused with the reason.
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
  std::string dropped;
  for (auto [name, t] : std::vector<std::pair<const char*, const Tensor*>>{
           {"ln1.input", &saved.ln1.input},
           {"attn.q_in", &saved.attn.q_in.input},
           {"attn.q", &saved.attn.q},
           {"attn.k", &saved.attn.k},
           {"attn.v", &saved.attn.v},
           {"attn.proj_in", &saved.attn.proj_in.input},
           {"ln2.input", &saved.ln2.input},
           {"mlp.fc", &saved.mlp.fc.input},
           {"mlp.gelu", &saved.mlp.gelu.input},
           {"mlp.proj", &saved.mlp.proj.input}})
    if (!t->defined()) dropped += std::string(dropped.empty() ? "" : ", ") + name;
  EXPECT_EQ(dropped, "") << "selective recomputation keeps everything but the probabilities; "
                            "the forward also dropped these: the backward needs them";
  const std::int64_t expected = block_activation_bytes(step) - attention_stat_bytes(step);
  EXPECT_EQ(bytes_check("activations alive after the forward (a plain block's, less B H T T)",
                        expected, scope.tracker->live(MemoryCategory::activations), step),
            "");
}

TEST(Puzzle9_3_selective_recomputation, BackwardMakesOnlyTheAttentionAgain) {
  const GPTConfig config = checker_model(1);
  const StepShape step = step_of(config);
  Block plain(config, 0), selective(config, 0), own(config, 0);
  Tensor x = Tensor::empty({kBatch, kSeq, 16}, config.dtype, config.device);
  Tensor dy = Tensor::empty({kBatch, kSeq, 16}, config.dtype, config.device);
  Rng rng(3);
  ops::fill_normal(x, 0, 1, rng);
  ops::fill_normal(dy, 0, 1, rng);
  BlockSaved saved;
  plain.run_forward(x, saved);
  const Tensor expected_dx = plain.run_backward(dy, saved);
  // The checker's own recompute and backward: the peak of every byte the
  // backward holds, the scratch attention output dropped at once.
  std::int64_t expected_total = 0;
  {
    BlockSaved s;
    own.run_forward(x, s);
    s.attn.probs = Tensor();
    ScopedTracker scope;
    const Shape heads{kBatch, kSeq, config.heads, config.d_model / config.heads};
    {
      RecomputeScope recompute;
      s.attn.probs = Tensor::empty({kBatch, config.heads, kSeq, kSeq}, config.dtype, config.device,
                                   MemoryCategory::activations);
      Tensor scratch =
          Tensor::empty(heads, config.dtype, config.device, MemoryCategory::activations);
      ops::attention_forward(s.attn.q.view(heads), s.attn.k.view(heads), s.attn.v.view(heads),
                             scratch, s.attn.probs);
    }
    own.run_backward(dy, s);
    expected_total = scope.tracker->total_peak();
  }

  dtp::ch09::SelectiveRecomputation policy;
  BlockSaved kept;
  policy.forward(selective, x, kept);
  ScopedTracker scope;
  reset_flop_counts();
  const Tensor dx = policy.backward(selective, dy, kept, WeightGrads::immediate, 1.0);
  const FlopCounts flops = flop_counts();
  ASSERT_TRUE(dx.defined()) << "backward returned no dx";
  EXPECT_TRUE(values_equal("dx", -1, expected_dx.to_vector(), dx.to_vector()))
      << "dx differs from the plain block's: the recomputed probabilities must be the forward's "
         "(ops::attention_forward on the saved q, k, v viewed as [B, T, H, D])";
  EXPECT_EQ(grads_check("the parameter gradients, against the plain block's", selective,
                        plain.grads().to_vector(), selective.grads().to_vector()),
            "");
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
  const std::int64_t total = scope.tracker->total_peak();
  EXPECT_EQ(bytes_check("peak of the memory the backward allocated (recompute, then "
                        "Block::run_backward)",
                        expected_total, total, step,
                        total - expected_total == hidden_bytes(step)
                            ? "one [B, T, C] more: the scratch attention output lives through "
                              "Block::run_backward; drop it at once, the saved one serves"
                            : ""),
            "");
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
