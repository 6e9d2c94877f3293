// Puzzle 9.4: offloaded activations. One block: what its forward moves to
// host memory (every saved tensor once, the input among them), that its
// backward equals the plain block bit for bit and computes nothing twice;
// a GPT step against the lesson's formula per memory category; the trace's
// proof that a block's copies run while the next block computes; data
// parallelism on two ranks.
#include <algorithm>

#include "checkpoint_checks.h"
#include "dtp/trace.h"
#include "support/trace_overlap.h"

namespace dtp {
namespace {

using namespace testing;
using namespace testing::ch09;

/// Distinct tensors (by storage) among a plain forward's saved slots.
int distinct_saved_tensors(OneBlock& b) {
  BlockSaved saved;
  b.block.run_forward(b.x, saved);
  std::vector<const Tensor*> seen;
  for (Tensor* t : saved_tensor_slots(saved)) {
    if (!t->defined()) continue;
    bool again = false;
    for (const Tensor* s : seen) again = again || s->shares_storage_with(*t);
    if (!again) seen.push_back(t);
  }
  return static_cast<int>(seen.size());
}

TEST(Puzzle9_4_offloaded_activations, ForwardMovesEverySavedTensorToTheHostOnce) {
  OneBlock b;
  const StepShape step = step_of(b.config);
  const int distinct = distinct_saved_tensors(b);
  ScopedTracker scope;
  dtp::ch09::OffloadedActivations policy;
  BlockSaved saved;
  const Tensor out = policy.forward(b.block, b.x, saved);
  copy_lane().drain();  // the next block's forward would; the copies are complete now
  std::vector<std::string> still;
  const std::vector<Tensor*> slots = saved_tensor_slots(saved);
  for (std::size_t i = 0; i < slots.size(); ++i)
    if (slots[i]->defined()) still.push_back("slot " + std::to_string(i));
  EXPECT_TRUE(still.empty()) << "after forward " << still.size()
                             << " saved slots still hold device tensors: empty every slot "
                                "(saved_tensor_slots) once its copy is queued";
  EXPECT_EQ(static_cast<int>(saved.offloaded.size()), distinct)
      << "saved.offloaded has " << saved.offloaded.size() << " host copies; the block saved "
      << distinct << " distinct tensors"
      << (static_cast<int>(saved.offloaded.size()) > distinct
              ? " (slots that share a tensor, like q, k and v's one input, must share a copy)"
              : " (some saved tensor was not copied)");
  for (const OffloadedTensor& o : saved.offloaded) {
    EXPECT_TRUE(o.host.defined() && o.host.device() == Device::cpu())
        << "a copy is not in host memory (Device::cpu())";
    EXPECT_EQ(o.device, b.config.device) << "OffloadedTensor::device must say where it came from";
    EXPECT_FALSE(o.slots.empty()) << "a copy records no slot to go back to";
  }
  EXPECT_EQ(
      bytes_check("host copies after forward (the block's tensors and its input)",
                  block_activation_bytes(step), scope.tracker->live(MemoryCategory::offloaded),
                  step, "charge them as MemoryCategory::offloaded"),
      "");
  EXPECT_EQ(bytes_check("device activations after forward and a drain (the output only)",
                        hidden_bytes(step), scope.tracker->live(MemoryCategory::activations), step),
            "");
}

TEST(Puzzle9_4_offloaded_activations, BackwardEqualsThePlainBlockAndComputesNothingTwice) {
  OneBlock plain, offloaded;
  BlockSaved saved;
  plain.block.run_forward(plain.x, saved);
  const Tensor expected_dx = plain.block.run_backward(plain.dy, saved);
  const StepShape step = step_of(offloaded.config);

  dtp::ch09::OffloadedActivations policy;
  BlockSaved kept;
  policy.forward(offloaded.block, offloaded.x, kept);
  ScopedTracker scope;
  reset_flop_counts();
  Tensor dx;
  const std::string error = error_of([&] {
    dx = policy.backward(offloaded.block, offloaded.dy, kept, WeightGrads::immediate, 1.0);
  });
  ASSERT_EQ(error, "(no error)")
      << "backward threw: Block::run_backward found a saved slot empty. Fetch every host copy "
         "in saved.offloaded and put it back in every slot it came from (OffloadedTensor::slots: "
         "q, k and v's one input fills three)";
  ASSERT_TRUE(dx.defined()) << "backward returned no dx";
  EXPECT_TRUE(values_equal("dx", -1, expected_dx.to_vector(), dx.to_vector()))
      << "dx differs from the plain block's: every slot must get back the tensor it held";
  EXPECT_EQ(grads_check("the parameter gradients, against the plain block's", offloaded.block,
                        plain.block.grads().to_vector(), offloaded.block.grads().to_vector()),
            "");
  EXPECT_EQ(flop_counts().recompute, 0)
      << "offloading computes nothing again, yet " << flop_counts().recompute
      << " FLOPs ran inside a RecomputeScope";
  EXPECT_EQ(
      bytes_check("recompute peak of the backward (the fetched copies)",
                  block_activation_bytes(step), scope.tracker->peak(MemoryCategory::recompute),
                  step, "fetch inside a RecomputeScope, each distinct tensor once"),
      "");
  EXPECT_TRUE(kept.offloaded.empty()) << "after backward the host copies must be dropped";
  EXPECT_EQ(copy_lane().queued(), 0u) << "the backward left copies queued on the lane";
}

TEST(Puzzle9_4_offloaded_activations, AGptStepEqualsThePlainStepAndItsFormula) {
  const GPTConfig config = checker_model(4);
  const StepShape step = step_of(config);
  dtp::ch09::OffloadedActivations policy;
  const StepResult plain = run_step(config, {});
  const StepResult got = run_step(config, on_every_block(config, policy));
  EXPECT_EQ(bitwise_equal_step(plain, got, config, "every block offloaded"), "");
  const ActivationPeaks expected =
      predicted_activation_peaks(step, std::vector<BlockKeeps>(4, BlockKeeps::offloaded));
  EXPECT_EQ(bytes_check("device activation peak (two blocks' worth while copies overlap)",
                        expected.activations, got.activation_peak, step,
                        got.activation_peak < expected.activations
                            ? "the copies never overlap the next block: does a forward wait for "
                              "its own copies?"
                            : "the lane holds device tensors longer: drain it in each forward, "
                              "before queueing, and empty every slot"),
            "");
  EXPECT_EQ(bytes_check("host copies at the peak (every block's tensors and input)",
                        expected.offloaded, got.offloaded_peak, step),
            "");
  EXPECT_EQ(bytes_check("recompute peak (one block's fetched copies)", expected.recompute,
                        got.recompute_peak, step),
            "");
  EXPECT_EQ(got.left_after, 0) << got.left_after << " bytes outlive the backward";
  EXPECT_EQ(got.flops.total, plain.flops.total)
      << "offloading computes what a plain step does, no more";
}

TEST(Puzzle9_4_offloaded_activations, EachBlocksCopiesRunWhileTheNextBlockComputes) {
  // Read from the trace: GPT's "block.i forward" spans and the lane's
  // "drain" spans on the rank's own lane, the copies on the copy lane. The
  // order of lane-0 events is exact, so this holds on every run: block i's
  // forward drains once (block i-1's copies) before queueing its own, and
  // never waits for its own.
  const GPTConfig config = checker_model(4);
  dtp::ch09::OffloadedActivations policy;
  trace::enable();
  run_step(config, on_every_block(config, policy));
  trace::disable();
  const RankLanes lanes = lanes_of(trace::spans(), 0);
  for (int i = 0; i < 4; ++i) {
    const std::string name = "block." + std::to_string(i);
    const std::vector<trace::Span> forward = named(lanes.own, name + " forward");
    ASSERT_EQ(forward.size(), 1u) << "expected one span '" << name << " forward'";
    const std::vector<trace::Span> copies = named(lanes.copy, "offload " + name);
    ASSERT_FALSE(copies.empty()) << "no copy span 'offload " << name
                                 << "' on the copy lane: queue the copies with "
                                    "copy_lane().copy_to(..., \"offload \" + block.name())";
    double first_copy = copies.front().start_us;
    for (const trace::Span& c : copies) first_copy = std::min(first_copy, c.start_us);
    // A drain that ends after the block's first copy started waited for it.
    int before = 0, after = 0;
    for (const trace::Span& s : named(lanes.own, "drain"))
      if (s.start_us >= forward[0].start_us && s.end_us <= forward[0].end_us)
        ++(s.end_us <= first_copy ? before : after);
    if (after > 0)
      ADD_FAILURE() << name << "'s forward drained the copy lane after queueing its own copies: "
                    << "a drain waits for every queued copy, so they never overlap the next "
                       "block's compute; drain once, before queueing (the previous block's copies)";
    else
      EXPECT_EQ(before, i == 0 ? 0 : 1)
          << name << "'s forward drained the copy lane " << before << " times; expected "
          << (i == 0 ? "none (nothing was queued before it)"
                     : "once, for the previous block's copies: copy_lane().drain() after "
                       "Block::run_forward lets go of that block's device tensors");
  }
}

TEST(Puzzle9_4_offloaded_activations, BackwardWithoutForwardIsAClearError) {
  OneBlock b;
  dtp::ch09::OffloadedActivations policy;
  BlockSaved empty;
  const std::string message =
      error_of([&] { policy.backward(b.block, b.dy, empty, WeightGrads::immediate, 1.0); });
  EXPECT_NE(message.find("block.0"), std::string::npos)
      << "a backward with nothing offloaded must throw dtp::Error naming the block (block.0), got: "
      << message;
}

TEST(Puzzle9_4_offloaded_activations, DataParallelTrainingEqualsItsPlainSelf) {
  dtp::ch09::OffloadedActivations policy;
  run_ranks(2, [&](Comm& comm) {
    const ModelState plain = train_data_parallel(comm, nullptr);
    const ModelState got = train_data_parallel(comm, &policy);
    EXPECT_EQ(got.losses, plain.losses) << "rank " << comm.rank() << ": the losses differ";
    EXPECT_EQ(got.params, plain.params)
        << "rank " << comm.rank() << ": the parameters after 2 data-parallel steps differ from "
        << "the same training without offloading";
  });
}

}  // namespace
}  // namespace dtp
