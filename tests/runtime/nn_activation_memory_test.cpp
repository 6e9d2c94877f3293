// What chapter 09 stands on: the activation formula (dtp/activation_memory.h)
// against the memory tracker on plain training steps, in every dtype and
// both attention kinds; the FLOP counter's counts per op; RecomputeScope's
// category and FLOPs; and a Block running its installed ActivationPolicy
// wherever it is called.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "dtp/activation_memory.h"
#include "dtp/copy_lane.h"
#include "dtp/flops.h"
#include "dtp/memory.h"
#include "dtp/nn.h"
#include "dtp/trace.h"
#include "nn_test_helpers.h"

namespace dtp {
namespace {

class TrackerScope {
 public:
  TrackerScope() { set_current_memory_tracker(tracker); }
  ~TrackerScope() { set_current_memory_tracker(nullptr); }
  std::shared_ptr<MemoryTracker> tracker = std::make_shared<MemoryTracker>();
};

struct Case {
  DType dtype;
  AttentionKind attention;
  int layers;
};

TEST(ActivationMemory, APlainStepPeaksAtTheFormulaToTheByte) {
  for (const Case& c :
       {Case{DType::f64, AttentionKind::naive, 3}, Case{DType::f32, AttentionKind::flash, 2},
        Case{DType::bf16, AttentionKind::naive, 1}, Case{DType::f32, AttentionKind::naive, 4}}) {
    GPTConfig config = testing::tiny_f64_config();
    config.dtype = c.dtype;
    config.attention = c.attention;
    config.layers = c.layers;
    const StepShape step{config, 2, 5};
    TrackerScope scope;
    GPT model(config);
    Rng rng(5);
    const Tensor tokens = testing::random_ids({2, 5}, config.vocab_size, rng);
    const Tensor targets = testing::random_ids({2, 5}, config.vocab_size, rng);
    scope.tracker->reset_peaks();
    model.forward(tokens, targets);
    const std::string what = std::string(dtype_name(c.dtype)) + ", " +
                             attention_kind_name(c.attention) + ", " + std::to_string(c.layers) +
                             " blocks";
    const ActivationPeaks expected = predicted_activation_peaks(
        step, std::vector<BlockKeeps>(static_cast<std::size_t>(c.layers), BlockKeeps::everything));
    EXPECT_EQ(scope.tracker->live(MemoryCategory::activations), expected.activations) << what;
    model.backward();
    EXPECT_EQ(scope.tracker->peak(MemoryCategory::activations), expected.activations) << what;
    EXPECT_EQ(scope.tracker->peak(MemoryCategory::recompute), 0) << what;
    EXPECT_EQ(scope.tracker->peak_activations_with_recompute(), expected.combined) << what;
    EXPECT_EQ(scope.tracker->live(MemoryCategory::activations), 0) << what;
  }
}

TEST(ActivationMemory, TheFormulaRefusesAWrongPlan) {
  GPTConfig config = testing::tiny_f64_config();
  const StepShape step{config, 2, 5};
  EXPECT_THROW(predicted_activation_peaks(step, {}), Error);
  config.attention = AttentionKind::flash;
  EXPECT_THROW(predicted_activation_peaks(
                   {config, 2, 5}, std::vector<BlockKeeps>(static_cast<std::size_t>(config.layers),
                                                           BlockKeeps::all_but_probs)),
               Error);
}

Tensor cast_to(const Tensor& t, DType dtype) {
  Tensor out = Tensor::empty(t.shape(), dtype);
  ops::cast(t, out);
  return out;
}

TEST(FlopCounter, CountsEachProductOnce) {
  Rng rng(1);
  for (DType dtype : {DType::f64, DType::bf16}) {
    const Tensor a = cast_to(testing::random_tensor({3, 4}, rng), dtype);
    const Tensor b = cast_to(testing::random_tensor({4, 5}, rng), dtype);
    Tensor out = Tensor::empty({3, 5}, dtype);
    reset_flop_counts();
    ops::matmul(a, b, out);
    EXPECT_EQ(flop_counts().total, 2 * 3 * 4 * 5) << dtype_name(dtype);
    Tensor outt = Tensor::empty({4, 5}, dtype);
    const Tensor c = cast_to(testing::random_tensor({3, 5}, rng), dtype);
    reset_flop_counts();
    ops::matmul(a, c, outt, true, false);  // [4, 3] x [3, 5]
    EXPECT_EQ(flop_counts().total, 2 * 4 * 3 * 5) << dtype_name(dtype) << " transposed";
  }
  const Tensor q = testing::random_tensor({2, 6, 3, 4}, rng);
  Tensor out = Tensor::empty(q.shape(), DType::f64),
         probs = Tensor::empty({2, 3, 6, 6}, DType::f64);
  reset_flop_counts();
  ops::attention_forward(q, q, q, out, probs);
  EXPECT_EQ(flop_counts().total, 4 * q.numel() * 6);
  Tensor dq = Tensor::empty(q.shape(), DType::f64), dk = Tensor::empty(q.shape(), DType::f64),
         dv = Tensor::empty(q.shape(), DType::f64);
  reset_flop_counts();
  ops::attention_backward(q, q, q, probs, out, dq, dk, dv);
  EXPECT_EQ(flop_counts().total, 8 * q.numel() * 6);
  Tensor row_max = Tensor::empty({2, 3, 6}, DType::f64),
         row_sum = Tensor::empty({2, 3, 6}, DType::f64);
  reset_flop_counts();
  ops::flash_attention_forward(q, q, q, out, row_max, row_sum);
  EXPECT_EQ(flop_counts().total, 4 * q.numel() * 6);
  reset_flop_counts();
  ops::flash_attention_backward(q, q, q, out, row_max, row_sum, out, dq, dk, dv);
  EXPECT_EQ(flop_counts().total, 10 * q.numel() * 6);
  EXPECT_EQ(flop_counts().recompute, 0);
}

TEST(RecomputeScope, ChargesActivationsAndFlopsAsRecomputedInsideOnly) {
  TrackerScope scope;
  reset_flop_counts();
  const Tensor a = Tensor::zeros({2, 2}, DType::f64), b = Tensor::zeros({2, 2}, DType::f64);
  {
    RecomputeScope outer;
    RecomputeScope inner;  // scopes nest
    Tensor made = Tensor::empty({4}, DType::f64, Device::cpu(), MemoryCategory::activations);
    EXPECT_EQ(made.category(), MemoryCategory::recompute);
    EXPECT_EQ(scope.tracker->live(MemoryCategory::recompute), 32);
    Tensor grads = Tensor::empty({4}, DType::f64, Device::cpu(), MemoryCategory::grads);
    EXPECT_EQ(grads.category(), MemoryCategory::grads) << "only activations are redirected";
    Tensor out = Tensor::empty({2, 2}, DType::f64);
    ops::matmul(a, b, out);
  }
  EXPECT_FALSE(recomputing());
  EXPECT_EQ(scope.tracker->live(MemoryCategory::recompute), 0);
  Tensor after = Tensor::empty({4}, DType::f64, Device::cpu(), MemoryCategory::activations);
  EXPECT_EQ(after.category(), MemoryCategory::activations);
  EXPECT_EQ(flop_counts().total, 16);
  EXPECT_EQ(flop_counts().recompute, 16);
  EXPECT_STREQ(memory_category_name(MemoryCategory::recompute), "recompute");
}

TEST(CopyLane, HoldsEachSourceUntilDrainAndTracesOnItsOwnLane) {
  TrackerScope scope;
  CopyLane& lane = copy_lane();
  EXPECT_EQ(&lane, &copy_lane()) << "one lane per thread";
  trace::enable();
  Tensor host;
  {
    Tensor source = Tensor::from_values({1, 2, 3, 4}, DType::f64);
    source = source.clone();  // charged: a fresh allocation under the test's tracker
    host = lane.copy_to(source, Device::cpu(), MemoryCategory::offloaded, "offload test");
  }
  EXPECT_EQ(lane.queued(), 1u);
  EXPECT_EQ(scope.tracker->live(MemoryCategory::offloaded), 32);
  EXPECT_EQ(scope.tracker->live(MemoryCategory::other), 32) << "the lane holds the source";
  lane.drain();
  trace::disable();
  EXPECT_EQ(lane.queued(), 0u);
  EXPECT_EQ(scope.tracker->live(MemoryCategory::other), 0) << "drain lets go of the source";
  EXPECT_EQ(host.to_vector(), (std::vector<double>{1, 2, 3, 4}));
  bool copy_on_lane_2 = false, drain_on_lane_0 = false;
  for (const trace::Span& span : trace::spans()) {
    copy_on_lane_2 |= span.name == "offload test" && span.lane == 2 && span.category == "copy";
    drain_on_lane_0 |= span.name == "drain" && span.lane == 0;
  }
  EXPECT_TRUE(copy_on_lane_2) << "the copy's span belongs on lane 2";
  EXPECT_TRUE(drain_on_lane_0) << "the wait's span belongs on the caller's lane";
  lane.drain();  // nothing queued: returns at once
}

/// Counts its calls and runs the block's own forward and backward.
class CountingPolicy : public ActivationPolicy {
 public:
  Tensor forward(const Block& block, const Tensor& x, BlockSaved& saved) const override {
    ++forwards;
    return block.run_forward(x, saved);
  }
  Tensor backward(const Block& block, const Tensor& dy, BlockSaved& saved, WeightGrads mode,
                  double loss_scale) const override {
    ++backwards;
    return block.run_backward(dy, saved, mode, loss_scale);
  }
  mutable int forwards = 0, backwards = 0;
};

TEST(ActivationPolicy, RunsInPlaceOfTheBlockWhereverTheBlockIsCalled) {
  GPTConfig config = testing::tiny_f64_config();
  GPT plain(config), with_policy(config);
  CountingPolicy policy;
  for (int i = 0; i < with_policy.num_blocks(); ++i) with_policy.block(i).policy = &policy;
  Rng rng(9);
  const Tensor tokens = testing::random_ids({2, 5}, config.vocab_size, rng);
  const Tensor targets = testing::random_ids({2, 5}, config.vocab_size, rng);
  EXPECT_EQ(with_policy.forward(tokens, targets), plain.forward(tokens, targets));
  with_policy.backward();
  plain.backward();
  EXPECT_EQ(policy.forwards, config.layers);
  EXPECT_EQ(policy.backwards, config.layers);
  for (int i = 0; i < config.layers; ++i)
    EXPECT_EQ(with_policy.block(i).grads().to_vector(), plain.block(i).grads().to_vector());
}

}  // namespace
}  // namespace dtp
