// Puzzle 9.2: which blocks to checkpoint. checkpoint_every against the
// checker's own list; largest_every_within against the checker's own search
// over the lesson's formula, and the plan it picks run for real: the
// tracker's peak stays within the budget.
#include "checkpoint_checks.h"

namespace dtp {
namespace {

using namespace testing;
using namespace testing::ch09;

std::string plan_text(const std::vector<bool>& plan) {
  std::string out;
  for (std::size_t i = 0; i < plan.size(); ++i)
    if (plan[i]) out += (out.empty() ? "" : ", ") + std::to_string(i);
  return "{" + out + "} of " + std::to_string(plan.size());
}

TEST(Puzzle9_2_checkpoint_plan, EveryKthBlockFromBlockZero) {
  for (auto [layers, k] : std::vector<std::pair<int, int>>{
           {4, 1}, {4, 2}, {4, 3}, {4, 4}, {4, 9}, {1, 1}, {0, 1}, {7, 3}, {12, 5}}) {
    std::vector<bool> expected(static_cast<std::size_t>(layers));
    for (int i = 0; i < layers; ++i) expected[static_cast<std::size_t>(i)] = i % k == 0;
    const std::vector<bool> got = dtp::ch09::checkpoint_every(layers, k);
    EXPECT_EQ(got, expected) << "checkpoint_every(" << layers << ", " << k << "): expected blocks "
                             << plan_text(expected) << ", got " << plan_text(got)
                             << (layers > 0 && got.size() == expected.size() && !got[0]
                                     ? " (block 0 is always one: count from 0)"
                                     : "");
  }
}

TEST(Puzzle9_2_checkpoint_plan, KBelowOneIsAClearError) {
  for (int k : {0, -2}) {
    const std::string message = error_of([&] { dtp::ch09::checkpoint_every(4, k); });
    EXPECT_NE(message.find(std::to_string(k)), std::string::npos)
        << "checkpoint_every(4, " << k << ") must throw dtp::Error naming k = " << k
        << ", got: " << message;
  }
}

/// The checker's own answer: the largest k whose plan's combined peak fits.
int expected_every(const StepShape& step, std::int64_t budget) {
  const int layers = step.config.layers;
  auto peak = [&](int k) {  // k = 0: no block checkpointed
    std::vector<BlockKeeps> keeps(static_cast<std::size_t>(layers), BlockKeeps::everything);
    for (int i = 0; k > 0 && i < layers; i += k)
      keeps[static_cast<std::size_t>(i)] = BlockKeeps::input_only;
    return predicted_activation_peaks(step, keeps).combined;
  };
  if (peak(0) <= budget) return 0;
  for (int k = layers; k >= 1; --k)
    if (peak(k) <= budget) return k;
  return -1;
}

TEST(Puzzle9_2_checkpoint_plan, TheLargestKThatFitsTheBudget) {
  const StepShape step = step_of(checker_model(6));
  const std::int64_t plain =
      predicted_activation_peaks(step, std::vector<BlockKeeps>(6, BlockKeeps::everything)).combined;
  const std::int64_t smallest =
      predicted_activation_peaks(step, std::vector<BlockKeeps>(6, BlockKeeps::input_only)).combined;
  const std::int64_t block = block_activation_bytes(step);
  for (std::int64_t budget : {plain, plain - 1, plain - block, plain - 2 * block, plain - 3 * block,
                              smallest + block, smallest}) {
    const int expected = expected_every(step, budget);
    ASSERT_GE(expected, 0);
    int got = -1;
    const std::string message =
        error_of([&] { got = dtp::ch09::largest_every_within(step, budget); });
    ASSERT_EQ(message, "(no error)")
        << "budget " << bytes_text(budget, step) << " fits k = " << expected
        << (expected == 1 ? " (every block checkpointed: does the search reach k = 1?)" : "");
    const char* why = got > 6    ? " (more than the 6 layers: 0 means no block is checkpointed)"
                      : got == 0 ? " (0 means the plain step fits, and it does not)"
                      : got < expected
                          ? (expected == 6 ? " (fits, but recomputes more blocks than needed; k = "
                                             "layers, block 0 alone, is a plan too)"
                                           : " (fits, but recomputes more blocks than needed)")
                          : " (does not fit the budget)";
    EXPECT_EQ(got, expected) << "budget " << bytes_text(budget, step)
                             << ": the largest k that fits is " << expected
                             << (expected == 0 ? " (0: the plain step fits)" : "") << ", got "
                             << got << why;
  }
}

TEST(Puzzle9_2_checkpoint_plan, ABudgetNothingFitsIsAClearError) {
  const StepShape step = step_of(checker_model(6));
  const std::int64_t smallest =
      predicted_activation_peaks(step, std::vector<BlockKeeps>(6, BlockKeeps::input_only)).combined;
  const std::string message =
      error_of([&] { dtp::ch09::largest_every_within(step, smallest - 1); });
  EXPECT_NE(message.find(std::to_string(smallest - 1)), std::string::npos)
      << "a budget below every plan's peak must be an error naming the budget (" << smallest - 1
      << ") and the smallest peak (" << smallest << "), got: " << message;
  EXPECT_NE(message.find(std::to_string(smallest)), std::string::npos)
      << "the error must name the smallest peak checkpointing reaches (" << smallest
      << " bytes), got: " << message;
}

TEST(Puzzle9_2_checkpoint_plan, ThePlannedStepFitsItsBudgetOnTheTracker) {
  const GPTConfig config = checker_model(6);
  const StepShape step = step_of(config);
  const std::int64_t plain =
      predicted_activation_peaks(step, std::vector<BlockKeeps>(6, BlockKeeps::everything)).combined;
  const std::int64_t budget = plain - 2 * block_activation_bytes(step);
  const int k = dtp::ch09::largest_every_within(step, budget);
  ASSERT_GE(k, 1);
  const std::vector<bool> plan = dtp::ch09::checkpoint_every(6, k);
  dtp::ch09::FullRecomputation policy;
  std::vector<const ActivationPolicy*> policies;
  for (bool checkpointed : plan) policies.push_back(checkpointed ? &policy : nullptr);
  const StepResult got = run_step(config, policies);
  EXPECT_LE(got.combined_peak, budget)
      << "every " << k << "-th block checkpointed (" << plan_text(plan) << ") peaked at "
      << bytes_text(got.combined_peak, step) << " on the tracker, over the budget "
      << bytes_text(budget, step);
}

}  // namespace
}  // namespace dtp
