// `dtp plan`, the planner of chapter 12 (drivers/12_3d_parallelism/plan.h),
// held to the runtime it claims to predict: the tensor-parallel collectives
// it lists are the ones chapter 04's units issue (CommStats), the parameters
// it puts on a rank are the tracker's bytes, its pipeline clock is chapter
// 05's verifier when messages are free, and its validation rows stay where
// they are.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <sstream>

#include "04_tensor_parallel/tensor_parallel.h"
#include "drivers/12_3d_parallelism/plan.h"
#include "dtp/gpt.h"
#include "support/harness.h"

namespace dtp::testing {
namespace {

using plan::CollectiveCall;
using plan::Pass;

constexpr int kTokensPerRow = 8;  // T
constexpr int kRows = 2;          // B

GPTConfig small_gpt() {
  GPTConfig c;
  c.vocab_size = 32;
  c.context = kTokensPerRow;
  c.d_model = 16;
  c.heads = 4;
  c.layers = 2;
  c.dtype = DType::f64;
  return c;
}

Tensor token_ids(int seed) {
  std::vector<double> ids;
  for (int i = 0; i < kRows * kTokensPerRow; ++i) ids.push_back((i * 7 + seed) % 32);
  return Tensor::from_values(ids, DType::i32).view(Shape{kRows, kTokensPerRow});
}

// What CommStats can tell apart: calls per kind, and the bytes of them all.
struct Counted {
  std::map<std::string, std::int64_t> calls;
  std::int64_t bytes = 0;
};

Counted counted(const std::vector<CollectiveCall>& list) {
  Counted c;
  for (const CollectiveCall& call : list) {
    c.calls[call.kind] += 1;
    c.bytes += call.bytes;
  }
  return c;
}

Counted since(const CommStats& before, const CommStats& after) {
  Counted c;
  for (const auto& [kind, n] : after.collective_calls) {
    const auto it = before.collective_calls.find(kind);
    const std::int64_t delta = n - (it == before.collective_calls.end() ? 0 : it->second);
    if (delta != 0) c.calls[kind] = delta;
  }
  c.bytes = after.collective_bytes - before.collective_bytes;
  return c;
}

std::string text(const Counted& c) {
  std::ostringstream out;
  for (const auto& [kind, n] : c.calls) out << n << " " << kind << ", ";
  out << c.bytes << " bytes";
  return out.str();
}

// Compares what a pass issued with the planner's list, naming the unit and pass.
void expect_same(const Counted& issued, const Counted& listed, int rank, const std::string& where,
                 bool sp) {
  EXPECT_TRUE(issued.calls == listed.calls && issued.bytes == listed.bytes)
      << "rank " << rank << ", " << where << (sp ? " with" : " without")
      << " sequence parallelism: chapter 04's units issued " << text(issued)
      << ", tensor_parallel_unit_collectives lists " << text(listed)
      << ". A count that differs means the list misses (or invents) a collective of that unit; "
         "equal counts with other bytes, a wrong size (tokens x hidden x element bytes).";
}

// Runs every unit of a TP GPT forward and backward on @p comm, pass by pass,
// and compares each pass's CommStats with the planner's list.
void compare_collectives(Comm& tp, bool sp) {
  const GPTConfig config = small_gpt();
  const plan::ModelShape shape = plan::model_of(config, kTokensPerRow);
  const std::int64_t tokens = kRows * kTokensPerRow;
  const int e = 8, r = tp.rank(), L = config.layers;
  GPT serial(config);
  ch04::TensorParallelGPT model(tp, serial, ch04::TensorParallelOptions{sp});
  auto listed = [&](int unit, Pass pass) {
    return counted(plan::tensor_parallel_unit_collectives(shape, unit, pass, tokens, e, sp));
  };
  auto unit_name = [&](int unit) {
    return unit == 0       ? std::string("the embedding")
           : unit == L + 1 ? std::string("the head")
                           : "block " + std::to_string(unit - 1);
  };
  const Tensor ids = token_ids(1), targets = token_ids(2);
  ch04::VocabParallelEmbeddingSaved embedding_saved;
  std::vector<ch04::TensorParallelBlockSaved> block_saved(static_cast<std::size_t>(L));
  ch04::TensorParallelHeadSaved head_saved;

  CommStats before = tp.stats();
  Tensor x = model.embedding->layer.forward(ids, embedding_saved);
  expect_same(since(before, tp.stats()), listed(0, Pass::forward), r, "the embedding's forward",
              sp);
  for (int b = 0; b < L; ++b) {
    before = tp.stats();
    x = model.blocks[static_cast<std::size_t>(b)]->forward(
        x, block_saved[static_cast<std::size_t>(b)], kRows);
    expect_same(since(before, tp.stats()), listed(b + 1, Pass::forward), r,
                unit_name(b + 1) + "'s forward", sp);
  }
  before = tp.stats();
  ch04::TensorParallelHead& head = *model.head;
  Tensor h = head.ln.forward(x, head_saved.ln);
  Tensor logits = head.lm.forward(h, head_saved.lm);
  head.loss.forward(logits, targets, head_saved.loss);
  expect_same(since(before, tp.stats()), listed(L + 1, Pass::forward), r, "the head's forward", sp);

  before = tp.stats();
  Tensor dlogits = head.loss.backward(head_saved.loss, 1.0);
  Tensor dx = head.ln.backward(head.lm.backward(dlogits, head_saved.lm), head_saved.ln);
  expect_same(since(before, tp.stats()), listed(L + 1, Pass::backward), r, "the head's backward",
              sp);
  for (int b = L - 1; b >= 0; --b) {
    before = tp.stats();
    dx = model.blocks[static_cast<std::size_t>(b)]->backward(
        dx, block_saved[static_cast<std::size_t>(b)]);
    expect_same(since(before, tp.stats()), listed(b + 1, Pass::backward), r,
                unit_name(b + 1) + "'s backward", sp);
  }
  before = tp.stats();
  model.embedding->layer.backward(dx, embedding_saved);
  expect_same(since(before, tp.stats()), listed(0, Pass::backward), r, "the embedding's backward",
              sp);

  // The replicated gradients' sums, all units together: finish_backward
  // runs them (a DP group of one rank adds nothing).
  Comm alone = tp.split(tp.rank(), 0);
  std::vector<CollectiveCall> reductions;
  for (int unit = 0; unit <= L + 1; ++unit) {
    const auto calls =
        plan::tensor_parallel_unit_collectives(shape, unit, Pass::reduction, tokens, e, sp);
    reductions.insert(reductions.end(), calls.begin(), calls.end());
  }
  before = tp.stats();
  model.finish_backward(alone);
  expect_same(since(before, tp.stats()), counted(reductions), r,
              "the reductions after the backward (finish_backward)", sp);
}

TEST(PlanCollectives, TensorParallelListEqualsCommStatsWithoutSequenceParallelism) {
  // A group of one makes the same calls (12.2's 2 x 2 x 1 layout counts them).
  for (int world : {1, 2}) run_ranks(world, [](Comm& tp) { compare_collectives(tp, false); });
}

TEST(PlanCollectives, TensorParallelListEqualsCommStatsWithSequenceParallelism) {
  // A group of one makes the same calls (12.2's 2 x 2 x 1 layout counts them).
  for (int world : {1, 2}) run_ranks(world, [](Comm& tp) { compare_collectives(tp, true); });
}

// --- memory ------------------------------------------------------------------------

TEST(PlanMemory, ParametersPerRankEqualTheTracker) {
  run_ranks(2, [](Comm& tp) {
    const GPTConfig config = small_gpt();
    const plan::ModelShape shape = plan::model_of(config, kTokensPerRow);
    GPT serial(config);
    std::shared_ptr<MemoryTracker> tracker = current_memory_tracker();
    const std::vector<Unit*> units = serial.units();
    const int L = config.layers;
    for (int u = 0; u <= L + 1; ++u) {
      const std::int64_t params_before = tracker->live(MemoryCategory::params);
      const std::int64_t grads_before = tracker->live(MemoryCategory::grads);
      std::unique_ptr<Unit> slice;
      const ch04::TensorParallelOptions options{false};
      if (u == 0)
        slice = std::make_unique<ch04::TensorParallelEmbedding>(
            tp, dynamic_cast<const Embedding&>(*units[0]), options);
      else if (u == L + 1)
        slice = std::make_unique<ch04::TensorParallelHead>(
            tp, dynamic_cast<const Head&>(*units[static_cast<std::size_t>(u)]), options);
      else
        slice = std::make_unique<ch04::TensorParallelBlock>(
            tp, dynamic_cast<const Block&>(*units[static_cast<std::size_t>(u)]), options);
      const std::int64_t expected = plan::unit_parameters_per_rank(shape, u, tp.size()) * 8;
      const std::int64_t params = tracker->live(MemoryCategory::params) - params_before;
      const std::int64_t grads = tracker->live(MemoryCategory::grads) - grads_before;
      EXPECT_EQ(params, expected) << "rank " << tp.rank() << ", unit " << u << " ("
                                  << units[static_cast<std::size_t>(u)]->name()
                                  << "): the tracker charged " << params
                                  << " bytes of parameters, the planner says " << expected << " ("
                                  << expected / 8
                                  << " f64 elements). A difference of a multiple of "
                                  << config.d_model * 8
                                  << " bytes is a vector (bias, norm) sliced where chapter 04 "
                                  << "keeps it whole, or the reverse.";
      EXPECT_EQ(grads, expected) << "rank " << tp.rank() << ", unit " << u << ": gradient bytes "
                                 << grads << ", the planner's " << expected;
    }
  });
}

TEST(PlanMemory, ActivationsReduceToKorthikantisFormula) {
  // GPT-3 175B, b = 1, s = 2048, 2-byte activations: sbh (34 + 5 a s / h)
  // per layer without parallelism (Korthikanti et al. 2022, the playbook).
  plan::PlanInput input;
  input.model = plan::named_model("gpt3-175b");
  input.cluster = plan::named_cluster("a100", 1, 1);
  const double s = 2048, h = 12288, a = 96;
  const double expected = s * h * (34 + 5 * a * s / h);
  const double got = static_cast<double>(plan::block_activation_bytes_per_rank(input));
  EXPECT_EQ(got, expected) << "one layer's activations of GPT-3 175B at b 1: expected sbh(34 + "
                              "5as/h) = "
                           << expected << " bytes, got " << got;
  input.layout.tp = 8;
  const double tp_expected = s * h * (10 + 24.0 / 8 + 5 * a * s / (h * 8));
  const double tp_got = static_cast<double>(plan::block_activation_bytes_per_rank(input));
  EXPECT_EQ(tp_got, tp_expected) << "with tp 8 (no sequence parallelism) expected sbh(10 + 24/t + "
                                    "5as/(ht)) = "
                                 << tp_expected << ", got " << tp_got;
}

// --- the clock -----------------------------------------------------------------------

plan::PlanInput free_messages(int pp, int microbatches, int chunks, ch05::ScheduleKind kind) {
  plan::PlanInput input;
  input.model = plan::model_of(small_gpt(), kTokensPerRow);
  input.model.layers = 8;
  input.cluster.gpus_per_node = pp;
  input.cluster.nodes = 1;
  input.cluster.alpha = input.cluster.beta = input.cluster.node_alpha = input.cluster.node_beta = 0;
  input.layout.pp = pp;
  input.layout.global_batch = microbatches;
  input.layout.schedule = kind;
  input.layout.chunks = chunks;
  input.precision = plan::Precision::uniform(DType::f64);
  return input;
}

void expect_verifier_clock(ch05::ScheduleKind kind, int chunks, const ch05::ActionCosts& costs) {
  const int p = 4, m = 8;
  const plan::PlanInput input = free_messages(p, m, chunks, kind);
  const ch05::Schedule schedule = ch05::make_schedule(kind, p, m, chunks);
  const ch05::ScheduleReport report = ch05::simulate_schedule(schedule, costs);
  ASSERT_TRUE(report.ok()) << report.problem;
  const plan::StepClock clock = plan::simulate_step_clock(input, schedule, &costs);
  EXPECT_NEAR(clock.makespan(), report.makespan, 1e-12 * report.makespan)
      << ch05::schedule_kind_name(kind) << " p " << p << " m " << m << " v " << chunks
      << " with free messages: the planner's step ends at " << clock.makespan()
      << ", chapter 05's verifier at " << report.makespan
      << ". Later means an action waited for a message it does not need, earlier one that "
         "started before its input existed.";
  for (int r = 0; r < p; ++r)
    EXPECT_NEAR(clock.stages[static_cast<std::size_t>(r)].compute,
                report.busy[static_cast<std::size_t>(r)], 1e-12 * report.makespan)
        << "rank " << r << ": compute " << clock.stages[static_cast<std::size_t>(r)].compute
        << " but the verifier's busy time is " << report.busy[static_cast<std::size_t>(r)];
}

TEST(PlanClock, OneFOneBEqualsTheVerifierWhenMessagesAreFree) {
  expect_verifier_clock(ch05::ScheduleKind::one_f_one_b, 1, {});
  expect_verifier_clock(ch05::ScheduleKind::one_f_one_b, 1, {0.75, 1.5, 1, 1});
}

TEST(PlanClock, InterleavedEqualsTheVerifierWhenMessagesAreFree) {
  expect_verifier_clock(ch05::ScheduleKind::interleaved, 2, {});
  expect_verifier_clock(ch05::ScheduleKind::interleaved, 2, {0.75, 1.5, 1, 1});
}

TEST(PlanClock, TheSenderPaysEachMessage) {
  // Two stages, one micro-batch, alpha = 1 per message and free bytes:
  // F on 0 (1), its send (1), F on 1 (1), B on 1 (2), its send (1), B on 0 (2).
  plan::PlanInput input = free_messages(2, 1, 1, ch05::ScheduleKind::one_f_one_b);
  input.cluster.node_alpha = 1;
  const ch05::Schedule schedule = ch05::make_schedule(ch05::ScheduleKind::one_f_one_b, 2, 1);
  const ch05::ActionCosts costs;
  const plan::StepClock clock = plan::simulate_step_clock(input, schedule, &costs);
  EXPECT_EQ(clock.makespan(), 8.0)
      << "F0 1 + send 1 + F1 1 + B1 2 + send 1 + B0 2 = 8; got " << clock.makespan()
      << (clock.makespan() == 6.0 ? ": the sends were not charged" : "");
  EXPECT_EQ(clock.stages[1].pp, 1.0) << "rank 1 sends one gradient: 1, got " << clock.stages[1].pp;
  EXPECT_EQ(clock.stages[0].idle, 4.0)
      << "rank 0 waits from 2 (its send) to 6 (the gradient's arrival): 4, got "
      << clock.stages[0].idle;
}

// --- validation ----------------------------------------------------------------------

TEST(PlanValidation, PredictionsArePinned) {
  // The planner's prediction per row, pinned so that a change to the model
  // shows here (and in the lesson's table); recompute with `dtp plan --validate`.
  const std::vector<double> pinned = {168.268, 160.158,  148.937,  143.327, 149.748, 149.687,
                                      150.748, 149.918,  147.022,  146.92,  157.681, 152.887,
                                      144.115, 0.352839, 0.296459, 7590.97, 7590.97, 96.8286,
                                      107.815, 1128.86,  6493.65};
  const std::vector<plan::ValidationRow> rows = plan::validation_rows();
  ASSERT_EQ(rows.size(), pinned.size()) << "validation rows added or removed: update the pins";
  for (std::size_t i = 0; i < rows.size(); ++i)
    EXPECT_NEAR(rows[i].predicted, pinned[i], 1e-3 * std::abs(pinned[i]))
        << "row " << i << " (" << rows[i].source << ", " << rows[i].what << ", " << rows[i].setup
        << "): predicted " << rows[i].predicted << ", pinned " << pinned[i];
}

TEST(PlanValidation, RowsWithinGoalStayWithinGoal) {
  const std::vector<bool> within = {false, false, true, true,  true, true, true,
                                    true,  true,  true, true,  true, true, false,
                                    false, false, true, false, true, true, true};
  const std::vector<plan::ValidationRow> rows = plan::validation_rows();
  ASSERT_EQ(rows.size(), within.size());
  for (std::size_t i = 0; i < rows.size(); ++i)
    if (within[i]) {
      EXPECT_TRUE(rows[i].within_goal())
          << "row " << i << " (" << rows[i].source << ", " << rows[i].what << ", " << rows[i].setup
          << "): published " << rows[i].published << ", predicted " << rows[i].predicted
          << ", error " << 100 * rows[i].error() << "% is outside the goal of "
          << 100 * rows[i].goal << "%";
    }
}

// --- bad input -------------------------------------------------------------------------

plan::PlanInput llama_on_h100(int nodes, int tp, int pp, int global_batch) {
  plan::PlanInput input;
  input.model = plan::named_model("llama3-70b");
  input.cluster = plan::named_cluster("h100", 8, nodes);
  input.layout.tp = tp;
  input.layout.pp = pp;
  input.layout.dp = input.cluster.gpus() / (tp * pp);
  input.layout.global_batch = global_batch;
  return input;
}

void expect_error(const std::function<void()>& fn, const std::vector<std::string>& parts,
                  const std::string& case_name) {
  const std::string message = error_of(fn);
  for (const std::string& part : parts)
    EXPECT_NE(message.find(part), std::string::npos)
        << case_name << ": the error should say \"" << part << "\"; it was: " << message;
}

TEST(PlanErrors, BadInputIsNamed) {
  expect_error([] { plan::named_model("gpt5"); }, {"unknown model 'gpt5'", "llama3-405b"},
               "unknown model");
  expect_error([] { plan::named_cluster("tpu", 8, 1); }, {"unknown GPU 'tpu'", "a100, h100"},
               "unknown GPU");
  expect_error([] { plan::parse_recompute("half"); }, {"'half'", "none, selective or full"},
               "unknown recomputation");
  expect_error(
      [] {
        plan::PlanInput input = llama_on_h100(2, 8, 1, 8);
        input.layout.dp = 3;
        plan::make_plan(input);
      },
      {"dp 3 x pp 1 x tp 8 = 24 GPUs", "the cluster has 16"}, "dp x pp x tp != GPUs");
  expect_error(
      [] {
        plan::PlanInput input = llama_on_h100(1, 8, 1, 8);
        input.model.heads = input.model.kv_heads = 12;
        input.model.hidden = 12 * 128;
        plan::make_plan(input);
      },
      {"tp 8 does not divide the 12 heads"}, "tp not dividing the heads");
  expect_error([] { plan::make_plan(llama_on_h100(2, 16, 1, 8)); },
               {"tp 16 is more than the 8 GPUs of a node"}, "tp above a node");
  expect_error([] { plan::make_plan(llama_on_h100(2, 8, 1, 7)); },
               {"global batch of 7 sequences does not split into dp 2"}, "batch not divisible");
  expect_error(
      [] {
        plan::PlanInput input = llama_on_h100(2, 8, 2, 3);
        input.layout.schedule = ch05::ScheduleKind::interleaved;
        input.layout.chunks = 2;
        plan::make_plan(input);
      },
      {"interleaved schedule needs", "multiple of pp", "3 micro-batches"},
      "interleaved with micro-batches not a multiple of pp");
  expect_error(
      [] {
        plan::PlanInput input = llama_on_h100(16, 8, 16, 1);
        input.model.layers = 8;
        plan::make_plan(input);
      },
      {"8 layers over pp 16 x chunks 1 virtual stages leaves a stage without a layer"},
      "fewer layers than stages");
}

}  // namespace
}  // namespace dtp::testing
