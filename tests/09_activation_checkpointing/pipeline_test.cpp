// Puzzle 9.5: checkpointing in a 1F1B pipeline. blocks_to_checkpoint against
// the checker's own search over the lesson's stage formula; then a 1F1B
// pipeline written here (4 stages of 2 blocks, 6 micro-batches) run with the
// plan of each stage: the same gradients bit for bit as the plain pipeline,
// each stage's tracker within its budget and equal to the formula. Last,
// full recomputation under FSDP-style hooks that release each unit's
// parameters after its forward and bring them back before its backward.
#include <algorithm>
#include <map>

#include "checkpoint_checks.h"

namespace dtp {
namespace {

using namespace testing;
using namespace testing::ch09;

constexpr int kStages = 4, kMicrobatches = 6, kLayers = 8;
constexpr int kBlocksPerStage = kLayers / kStages;

/// The checker's own search: the fewest first blocks of the stage to
/// checkpoint so that its combined peak fits; -1 when none does.
int expected_blocks(const StepShape& step, const PipelineStage& p, int blocks,
                    std::int64_t budget) {
  for (int c = 0; c <= blocks; ++c) {
    std::vector<BlockKeeps> keeps(static_cast<std::size_t>(blocks), BlockKeeps::everything);
    for (int i = 0; i < c; ++i) keeps[static_cast<std::size_t>(i)] = BlockKeeps::input_only;
    if (predicted_stage_peaks(step, p, keeps).combined <= budget) return c;
  }
  return -1;
}

std::vector<BlockKeeps> first_checkpointed(int blocks, int c) {
  std::vector<BlockKeeps> keeps(static_cast<std::size_t>(blocks), BlockKeeps::everything);
  for (int i = 0; i < c; ++i) keeps[static_cast<std::size_t>(i)] = BlockKeeps::input_only;
  return keeps;
}

/// A budget that makes every stage checkpoint a different number of blocks:
/// what the last stage's plain step needs.
std::int64_t pipeline_budget(const StepShape& step) {
  return predicted_stage_peaks(step, {kStages, kStages - 1, kMicrobatches},
                               first_checkpointed(kBlocksPerStage, 0))
      .combined;
}

TEST(Puzzle9_5_pipeline_checkpointing, TheFewestBlocksEachStageMustCheckpoint) {
  const StepShape step = step_of(checker_model(kLayers));
  const std::int64_t budget = pipeline_budget(step);
  for (std::int64_t b : {budget, budget + budget / 3, budget * 3}) {
    for (int s = 0; s < kStages; ++s) {
      const PipelineStage p{kStages, s, kMicrobatches};
      const int expected = expected_blocks(step, p, kBlocksPerStage, b);
      if (expected < 0) continue;
      // The answer for one micro-batch in flight, as if 1F1B were ignored.
      const int one_in_flight = expected_blocks(step, {kStages, s, 1}, kBlocksPerStage, b);
      int got = -1;
      const std::string message =
          error_of([&] { got = dtp::ch09::blocks_to_checkpoint(step, p, kBlocksPerStage, b); });
      EXPECT_EQ(got, expected)
          << "stage " << s << " of " << kStages << " (" << micro_batches_in_flight(p)
          << " micro-batches in flight), budget " << bytes_text(b, step) << ": expected "
          << expected << " checkpointed blocks, got " << got
          << (message != "(no error)" ? " (it threw: " + message + ")" : "")
          << (got > expected ? ": fits, but recomputes more than needed (checkpoint the stage's "
                               "first c blocks, c from 0 up)"
              : got == one_in_flight
                  ? ": what one micro-batch in flight needs; stage s holds min(S - s, m) "
                    "(predicted_stage_peaks with the stage as given)"
                  : ": does not fit the budget");
    }
  }
}

TEST(Puzzle9_5_pipeline_checkpointing, AStageThatCannotFitIsAClearError) {
  const StepShape step = step_of(checker_model(kLayers));
  const PipelineStage p{kStages, 0, kMicrobatches};
  const std::int64_t smallest =
      predicted_stage_peaks(step, p, first_checkpointed(kBlocksPerStage, kBlocksPerStage)).combined;
  const std::string message =
      error_of([&] { dtp::ch09::blocks_to_checkpoint(step, p, kBlocksPerStage, smallest - 1); });
  for (const std::string& part :
       {std::string("stage 0"), std::to_string(smallest - 1), std::to_string(smallest)})
    EXPECT_NE(message.find(part), std::string::npos)
        << "a budget no plan fits must be an error naming the stage, the budget (" << smallest - 1
        << ") and the smallest peak (" << smallest << "); missing '" << part << "' in: " << message;
}

/// One rank's stage of the checker's 1F1B pipeline: blocks
/// [stage * 2, stage * 2 + 2) of a GPT built from the same seed everywhere.
struct StageRun {
  std::vector<std::vector<double>> grads;  // per unit this stage holds
  std::vector<double> losses;              // the last stage's, per micro-batch
  ActivationPeaks peaks;                   // what the tracker saw
};

StageRun run_stage(Comm& comm, const GPTConfig& config, int checkpointed) {
  const int s = comm.rank();
  const bool first = s == 0, last = s == kStages - 1;
  GPT model(config);
  dtp::ch09::FullRecomputation policy;
  for (int i = 0; i < checkpointed; ++i) model.block(s * kBlocksPerStage + i).policy = &policy;
  std::vector<Batch> batches;
  for (int j = 0; j < kMicrobatches; ++j) batches.push_back(checker_batch(config, 100 + j));
  std::map<int, EmbeddingSaved> embedding_saved;
  std::map<int, std::vector<BlockSaved>> block_saved;
  std::map<int, HeadSaved> head_saved;
  StageRun run;
  std::shared_ptr<MemoryTracker> tracker = current_memory_tracker();
  tracker->reset_peaks();
  const Shape hidden{kBatch, kSeq, config.d_model};
  auto forward = [&](int j) {
    Tensor x;
    if (first) {
      x = model.embedding().forward(batches[j].inputs, embedding_saved[j]);
    } else {
      x = Tensor::empty(hidden, config.dtype, comm.device(), MemoryCategory::activations);
      comm.recv(x, s - 1, j);
    }
    std::vector<BlockSaved>& saved = block_saved[j];
    saved.resize(kBlocksPerStage);
    for (int i = 0; i < kBlocksPerStage; ++i)
      x = model.block(s * kBlocksPerStage + i).forward(x, saved[static_cast<std::size_t>(i)]);
    if (last)
      run.losses.push_back(model.head().forward(x, batches[j].targets, head_saved[j]));
    else
      comm.send(x, s + 1, j);
  };
  auto backward = [&](int j) {
    Tensor dy;
    if (last) {
      dy = model.head().backward(head_saved[j], 1.0 / kMicrobatches);
      head_saved.erase(j);
    } else {
      dy = Tensor::empty(hidden, config.dtype, comm.device());
      comm.recv(dy, s + 1, 1000 + j);
    }
    std::vector<BlockSaved>& saved = block_saved[j];
    for (int i = kBlocksPerStage; i-- > 0;)
      dy = model.block(s * kBlocksPerStage + i)
               .backward(dy, saved[static_cast<std::size_t>(i)], WeightGrads::immediate,
                         1.0 / kMicrobatches);
    block_saved.erase(j);
    if (first) {
      model.embedding().backward(dy, embedding_saved[j]);
      embedding_saved.erase(j);
    } else {
      comm.send(dy, s - 1, 1000 + j);
    }
  };
  // 1F1B: warm-up forwards, then one forward and one backward, then the rest.
  int f = 0, b = 0;
  for (int w = 0; w < std::min(kStages - s - 1, kMicrobatches); ++w) forward(f++);
  while (f < kMicrobatches) {
    forward(f++);
    backward(b++);
  }
  while (b < kMicrobatches) backward(b++);
  run.peaks.activations = tracker->peak(MemoryCategory::activations);
  run.peaks.recompute = tracker->peak(MemoryCategory::recompute);
  run.peaks.combined = tracker->peak_activations_with_recompute();
  if (first) run.grads.push_back(model.embedding().grads().to_vector());
  for (int i = 0; i < kBlocksPerStage; ++i)
    run.grads.push_back(model.block(s * kBlocksPerStage + i).grads().to_vector());
  if (last) run.grads.push_back(model.head().grads().to_vector());
  return run;
}

TEST(Puzzle9_5_pipeline_checkpointing, EachStagesPlanFitsItsBudgetAndChangesNoBit) {
  const GPTConfig config = checker_model(kLayers);
  const StepShape step = step_of(config);
  const std::int64_t budget = pipeline_budget(step);
  run_ranks(kStages, [&](Comm& comm) {
    const int s = comm.rank();
    const PipelineStage p{kStages, s, kMicrobatches};
    const StageRun plain = run_stage(comm, config, 0);
    const ActivationPeaks plain_expected =
        predicted_stage_peaks(step, p, first_checkpointed(kBlocksPerStage, 0));
    EXPECT_EQ(bytes_check("stage " + std::to_string(s) + ", plain 1F1B: activation peak",
                          plain_expected.activations, plain.peaks.activations, step),
              "");
    const int c = dtp::ch09::blocks_to_checkpoint(step, p, kBlocksPerStage, budget);
    const StageRun got = run_stage(comm, config, c);
    EXPECT_EQ(got.losses, plain.losses) << "stage " << s << ": the losses differ";
    EXPECT_EQ(got.grads, plain.grads)
        << "stage " << s << " with its first " << c
        << " blocks checkpointed: the gradients differ from the plain pipeline's";
    EXPECT_LE(got.peaks.combined, budget)
        << "stage " << s << " (" << micro_batches_in_flight(p) << " micro-batches in flight, " << c
        << " blocks checkpointed) peaked at " << bytes_text(got.peaks.combined, step)
        << " on the tracker, over the budget " << bytes_text(budget, step);
    const ActivationPeaks expected =
        predicted_stage_peaks(step, p, first_checkpointed(kBlocksPerStage, c));
    EXPECT_EQ(bytes_check("stage " + std::to_string(s) + ", " + std::to_string(c) +
                              " blocks checkpointed: combined peak",
                          expected.combined, got.peaks.combined, step),
              "");
    EXPECT_EQ(bytes_check("stage " + std::to_string(s) + ": recompute peak", expected.recompute,
                          got.peaks.recompute, step,
                          got.peaks.recompute == 0 ? "nothing was charged as recompute: run the "
                                                     "forward again inside a dtp::RecomputeScope"
                                                   : ""),
              "");
  });
}

TEST(Puzzle9_5_pipeline_checkpointing, FullRecomputationComposesWithFsdpUnits) {
  // FSDP releases a unit's parameters after its forward and gathers them
  // again before its backward (chapter 03); here the hooks keep them aside.
  // The recompute runs inside the backward, after the before-backward hook:
  // it needs no gathering of its own.
  const GPTConfig config = checker_model(4);
  const Batch batch = checker_batch(config);
  auto step = [&](bool checkpoint) {
    GPT model(config);
    dtp::ch09::FullRecomputation policy;
    if (checkpoint)
      for (int i = 0; i < model.num_blocks(); ++i) model.block(i).policy = &policy;
    std::map<Unit*, Tensor> aside;
    int gathers = 0;
    model.on_after_forward([&](Unit& u) {
      aside[&u] = u.params();
      u.set_buffers(Tensor(), u.grads());
    });
    model.on_before_backward([&](Unit& u) {
      u.set_buffers(aside[&u], u.grads());
      ++gathers;
    });
    model.on_grad_ready([&](Unit& u) { u.set_buffers(Tensor(), u.grads()); });
    const double loss = model.forward(batch.inputs, batch.targets);
    model.backward();
    std::vector<std::vector<double>> grads;
    for (Unit* u : model.units()) grads.push_back(u->grads().to_vector());
    return std::make_tuple(loss, grads, gathers);
  };
  const auto [plain_loss, plain_grads, plain_gathers] = step(false);
  const auto [loss, grads, gathers] = step(true);
  EXPECT_EQ(loss, plain_loss);
  EXPECT_EQ(grads, plain_grads) << "full recomputation under FSDP-style hooks changed gradients";
  EXPECT_EQ(gathers, plain_gathers)
      << "checkpointing must not gather any unit an extra time: the backward's gather serves the "
         "recompute";
}

}  // namespace
}  // namespace dtp
