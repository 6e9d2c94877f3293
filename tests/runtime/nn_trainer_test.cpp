// The trainer: a short run learns the synthetic data, the same seed gives the
// same run bit for bit, logs and traces are written, strategies dispatch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>

#include "dtp/comm.h"
#include "dtp/error.h"
#include "dtp/launch.h"
#include "dtp/trace.h"
#include "dtp/train_report.h"
#include "dtp/train_run.h"
#include "dtp/trainer.h"

namespace dtp {
namespace {

TrainConfig tiny_run(std::int64_t steps) {
  TrainConfig config;
  config.model.d_model = 32;
  config.model.heads = 2;
  config.model.layers = 1;
  config.steps = steps;
  config.batch = 8;
  config.seq = 16;
  config.lr = 1e-2;
  config.warmup = 3;
  config.synthetic.length = 1 << 15;
  return config;
}

TEST(NnTrainer, ShortRunLowersTheLossOnSyntheticData) {
  TrainResult result = train(tiny_run(60));
  ASSERT_EQ(result.steps.size(), 60u);
  // ln(64) = 4.16 at the start; the phrase structure is learned quickly.
  EXPECT_NEAR(result.steps.front().loss, std::log(64.0), 0.1);
  EXPECT_LT(result.last_loss(), result.first_loss() - 1.0)
      << "first 10 steps " << result.first_loss() << ", last 10 " << result.last_loss();
  for (const StepRecord& r : result.steps) {
    EXPECT_GT(r.tokens_per_second, 0);
    EXPECT_EQ(r.tokens, 8 * 16);
    EXPECT_GT(r.peak_bytes, 0);
    EXPECT_GT(r.peak_activation_bytes, 0);
    EXPECT_GT(r.grad_norm, 0);
  }
  EXPECT_GT(result.peak_by_category[static_cast<int>(MemoryCategory::optimizer)], 0);
  EXPECT_NE(format_summary(result).find("loss"), std::string::npos);
}

TEST(NnTrainer, SameSeedSameRunBitForBit) {
  TrainConfig config = tiny_run(6);
  Trainer a(config), b(config);
  for (int s = 0; s < 6; ++s) {
    StepRecord ra = a.step(), rb = b.step();
    EXPECT_EQ(ra.loss, rb.loss) << "step " << s + 1;
    EXPECT_EQ(ra.grad_norm, rb.grad_norm) << "step " << s + 1;
    EXPECT_EQ(ra.lr, rb.lr);
  }
  for (std::size_t u = 0; u < a.model().units().size(); ++u)
    EXPECT_TRUE(ops::equal(a.model().units()[u]->params(), b.model().units()[u]->params()));
  config.seed = 4321;
  Trainer c(config);
  EXPECT_NE(c.step().loss, Trainer(tiny_run(6)).step().loss);
}

TEST(NnTrainer, DataParallelRanksSampleTheirSlice) {
  TrainConfig config = tiny_run(1);
  Trainer rank1(config, 1, 2);
  EXPECT_EQ(rank1.sampler().local_batch(), 4);
  EXPECT_EQ(rank1.sampler().first_sample(), 4);
  StepRecord r = rank1.step();
  EXPECT_EQ(r.tokens, 4 * 16);
  // The grad-ready hook is where DDP communicates: it sees every unit once.
  Trainer single(config);
  int calls = 0, after = 0;
  single.model().on_grad_ready([&](Unit&) { ++calls; });
  single.on_after_backward([&] {
    EXPECT_EQ(calls, 3);  // every unit's gradient is ready by now
    ++after;
  });
  single.step();
  EXPECT_EQ(calls, 3);  // embedding, one block, head
  EXPECT_EQ(after, 1);
}

TEST(NnTrainer, WritesJsonLinesAndATrace) {
  TrainConfig config = tiny_run(3);
  config.json_path = ::testing::TempDir() + "dtp_nn_trainer_log.jsonl";
  config.trace_path = ::testing::TempDir() + "dtp_nn_trainer_trace.json";
  train(config);
  std::ifstream log(config.json_path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(log, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 5u);  // config, 3 steps, summary
  EXPECT_EQ(lines[0].rfind("{\"kind\":\"config\"", 0), 0u) << lines[0];
  EXPECT_EQ(lines[1].rfind("{\"kind\":\"step\",\"step\":1,\"loss\":", 0), 0u) << lines[1];
  EXPECT_NE(lines[3].find("\"peak_bytes\":"), std::string::npos) << lines[3];
  EXPECT_EQ(lines[4].rfind("{\"kind\":\"summary\"", 0), 0u) << lines[4];

  // The trainer streams the spans to the file step by step and keeps none.
  EXPECT_FALSE(trace::enabled());
  EXPECT_TRUE(trace::spans().empty())
      << "the trainer must take the spans it wrote (a long run would grow)";
  std::ifstream trace_file(config.trace_path);
  const std::string text((std::istreambuf_iterator<char>(trace_file)),
                         std::istreambuf_iterator<char>());
  EXPECT_EQ(text.rfind("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n", 0), 0u)
      << text.substr(0, 80);
  EXPECT_NE(
      text.find(
          "{\"name\":\"block.0 forward\",\"cat\":\"compute\",\"ph\":\"X\",\"pid\":0,\"tid\":0,"),
      std::string::npos);
  EXPECT_NE(text.find("{\"name\":\"block.0 backward\",\"cat\":\"compute\""), std::string::npos);
  EXPECT_EQ(text.substr(text.size() - 5), "}\n]}\n")
      << "the last event is followed by the closing alone";
  std::remove(config.json_path.c_str());
  std::remove(config.trace_path.c_str());
}

TEST(NnTrainer, BadSettingsAreRejectedByName) {
  TrainConfig config = tiny_run(2);
  config.optimizer = "lion";
  try {
    train(config);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("adamw, sgd"), std::string::npos) << e.what();
  }
  config = tiny_run(2);
  config.data_path = ::testing::TempDir() + "dtp_nn_no_such_file.txt";
  try {
    train(config);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(config.data_path), std::string::npos) << e.what();
  }
  config = tiny_run(2);
  config.lr = 1e9;  // diverges: the trainer says so instead of printing NaNs
  config.grad_clip = 0;
  config.steps = 50;
  EXPECT_THROW(train(config), Error);
}

TEST(NnTrainer, SgdAndTextDataTrainToo) {
  const std::string path = ::testing::TempDir() + "dtp_nn_text.txt";
  {
    std::ofstream out(path);
    for (int i = 0; i < 200; ++i) out << "the quick brown fox jumps over the lazy dog. ";
  }
  TrainConfig config = tiny_run(30);
  config.data_path = path;
  config.optimizer = "sgd";
  config.lr = 0.3;
  TrainResult result = train(config);
  EXPECT_NEAR(result.steps.front().loss, std::log(256.0), 0.2);
  EXPECT_LT(result.last_loss(), result.first_loss() - 0.5);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace dtp

// report_group_step: rank 0's record becomes the group's step. Four ranks
// with distinct numbers, so a wrong rule shows which rank's value leaked in.
TEST(NnTrainer, GroupStepTakesTheSlowestRankAndCountsOwnSlices) {
  struct Case {
    const char* name;
    dtp::GroupStepRule rule;
    double loss, tokens;  // expected on rank 0
  };
  // Rank r reports loss 1 + r, seconds 0.1 (rank 2: 0.5), tokens 10 (r + 1).
  const Case cases[] = {
      {"every rank its own slice (data parallel)", {}, (1 + 2 + 3 + 4) / 4.0, 100},
      {"pairs share a slice (tensor parallel 2)",
       {[](int r) { return r % 2 == 0; }, true},
       (1 + 3) / 2.0,
       40},
      {"the step reduced the loss itself", {{}, false}, 1, 100},
  };
  for (const Case& c : cases) {
    dtp::World world;
    world.size = 4;
    dtp::launch(world, [&](dtp::Comm& comm) {
      dtp::StepRecord record;
      record.loss = 1 + comm.rank();
      record.seconds = comm.rank() == 2 ? 0.5 : 0.1;
      record.tokens = 10 * (comm.rank() + 1);
      const std::vector<dtp::RankStepRow> rows =
          dtp::report_group_step(comm, record, {100.0 + comm.rank(), -1.0}, c.rule);
      if (comm.rank() != 0) {
        EXPECT_TRUE(rows.empty()) << c.name << ": rank " << comm.rank() << " got rows";
        EXPECT_EQ(record.loss, 1 + comm.rank())
            << c.name << ": rank " << comm.rank() << "'s record changed";
        return;
      }
      EXPECT_EQ(record.seconds, 0.5) << c.name << ": expected rank 2's seconds (the slowest)";
      EXPECT_EQ(record.loss, c.loss) << c.name;
      EXPECT_EQ(record.tokens, static_cast<std::int64_t>(c.tokens)) << c.name;
      EXPECT_EQ(record.tokens_per_second, c.tokens / 0.5) << c.name;
      ASSERT_EQ(rows.size(), 4u) << c.name;
      for (int r = 0; r < 4; ++r) {
        const dtp::RankStepRow& row = rows[static_cast<std::size_t>(r)];
        EXPECT_EQ(row.loss, 1 + r) << c.name << ": rank " << r;
        EXPECT_EQ(row.tokens, 10 * (r + 1)) << c.name << ": rank " << r;
        EXPECT_EQ(row.extra, (std::vector<double>{100.0 + r, -1.0}))
            << c.name << ": rank " << r << "'s extra";
      }
    });
  }
}
