// GPT's unit hooks (what FSDP gathers and frees parameters with): which run
// when, in which order, outside the units' trace spans, on every forward path.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "dtp/nn.h"
#include "dtp/trace.h"
#include "nn_test_helpers.h"

namespace dtp {
namespace {

GPTConfig two_block_config() {
  GPTConfig c = testing::tiny_f64_config();
  c.init_std = 0.02;  // these checks follow hooks, not gradients: the default init
  return c;
}

// Adds one hook of every kind that appends "<kind> <unit>" to @p events.
void record_every_hook(GPT& model, std::vector<std::string>& events) {
  model.on_before_forward([&](Unit& u) { events.push_back("before_forward " + u.name()); });
  model.on_after_forward([&](Unit& u) { events.push_back("after_forward " + u.name()); });
  model.on_before_backward([&](Unit& u) { events.push_back("before_backward " + u.name()); });
  model.on_grad_ready([&](Unit& u) { events.push_back("grad_ready " + u.name()); });
}

TEST(NnUnitHooks, RunAroundEveryUnitInForwardThenReverseOrder) {
  GPT model(two_block_config());
  Rng rng(31);
  Tensor tokens = testing::random_ids({2, 5}, 7, rng),
         targets = testing::random_ids({2, 5}, 7, rng);
  std::vector<std::string> events;
  record_every_hook(model, events);
  model.forward(tokens, targets);
  EXPECT_EQ(events, (std::vector<std::string>{"before_forward embedding", "after_forward embedding",
                                              "before_forward block.0", "after_forward block.0",
                                              "before_forward block.1", "after_forward block.1",
                                              "before_forward head", "after_forward head"}));
  events.clear();
  model.backward();
  EXPECT_EQ(events, (std::vector<std::string>{
                        "before_backward head", "grad_ready head", "before_backward block.1",
                        "grad_ready block.1", "before_backward block.0", "grad_ready block.0",
                        "before_backward embedding", "grad_ready embedding"}));
}

TEST(NnUnitHooks, HooksOfOneKindRunInTheOrderAdded) {
  GPT model(two_block_config());
  std::vector<std::string> events;
  model.on_before_forward([&](Unit& u) { events.push_back("first " + u.name()); });
  model.on_before_forward([&](Unit& u) { events.push_back("second " + u.name()); });
  Rng rng(32);
  model.logits(testing::random_ids({1, 3}, 7, rng));
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events[0], "first embedding");
  EXPECT_EQ(events[1], "second embedding");
}

TEST(NnUnitHooks, LogitsCallsTheForwardHooksButNoBackwardOnes) {
  GPT model(two_block_config());
  std::vector<std::string> events;
  record_every_hook(model, events);
  Rng rng(33);
  model.logits(testing::random_ids({1, 4}, 7, rng));
  ASSERT_EQ(events.size(), 8u);
  EXPECT_EQ(events.front(), "before_forward embedding");
  EXPECT_EQ(events[3], "after_forward block.0");
  EXPECT_EQ(events.back(), "after_forward head");
}

TEST(NnUnitHooks, HooksRunOutsideTheUnitsTraceSpans) {
  GPT model(two_block_config());
  // Each hook leaves a span of its own; it must not nest inside the unit's.
  model.on_before_forward([](Unit& u) { trace::Scope s("hook before " + u.name(), "comm"); });
  model.on_after_forward([](Unit& u) { trace::Scope s("hook after " + u.name(), "comm"); });
  model.on_before_backward([](Unit& u) { trace::Scope s("hook before " + u.name(), "comm"); });
  Rng rng(34);
  Tensor tokens = testing::random_ids({2, 5}, 7, rng),
         targets = testing::random_ids({2, 5}, 7, rng);
  trace::enable();
  model.forward(tokens, targets);
  model.backward();
  trace::disable();
  const std::vector<trace::Span> spans = trace::spans();
  auto find = [&](const std::string& name, int nth) -> const trace::Span* {
    for (const trace::Span& s : spans)
      if (s.name == name && nth-- == 0) return &s;
    return nullptr;
  };
  int checked = 0;
  for (const char* unit : {"embedding", "block.0", "block.1", "head"}) {
    const std::string name = unit;
    const trace::Span* forward = find(name + " forward", 0);
    const trace::Span* backward = find(name + " backward", 0);
    const trace::Span* before_forward = find("hook before " + name, 0);
    const trace::Span* before_backward = find("hook before " + name, 1);
    const trace::Span* after_forward = find("hook after " + name, 0);
    ASSERT_TRUE(forward && backward && before_forward && before_backward && after_forward) << name;
    EXPECT_LE(before_forward->end_us, forward->start_us) << name;
    EXPECT_GE(after_forward->start_us, forward->end_us) << name;
    EXPECT_LE(before_backward->end_us, backward->start_us) << name;
    ++checked;
  }
  EXPECT_EQ(checked, 4);
}

TEST(NnUnitHooks, ClearHooksRemovesEveryKind) {
  GPT model(two_block_config());
  std::vector<std::string> events;
  record_every_hook(model, events);
  model.clear_hooks();
  Rng rng(35);
  Tensor tokens = testing::random_ids({2, 5}, 7, rng),
         targets = testing::random_ids({2, 5}, 7, rng);
  model.forward(tokens, targets);
  model.backward();
  model.logits(tokens);
  EXPECT_TRUE(events.empty()) << events.front();
  // clear_grad_ready_hooks leaves the other kinds alone.
  record_every_hook(model, events);
  model.clear_grad_ready_hooks();
  model.forward(tokens, targets);
  model.backward();
  EXPECT_EQ(events.size(), 12u);  // 4 units x (before forward, after forward, before backward)
  for (const std::string& e : events) EXPECT_EQ(e.find("grad_ready"), std::string::npos) << e;
}

}  // namespace
}  // namespace dtp
