// Non-blocking all-reduce: results, order, real asynchrony, traces, failures.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>

#include "support/harness.h"

namespace dtp {
namespace {

TEST(AsyncAllReduce, SeveralInFlightCompleteWithExactSums) {
  for (int n = 1; n <= 4; ++n) {
    std::vector<std::vector<double>> first(n), second(n);
    testing::run_ranks(n, [&](Comm& comm) {
      const int r = comm.rank();
      Tensor a = testing::pattern_tensor(r, 1000), b = testing::pattern_tensor(r, 37);
      Request ra = comm.iall_reduce(a), rb = comm.iall_reduce(b, ReduceOp::max);
      rb.wait();  // waiting out of order is fine: they run in call order
      ra.wait();
      first[r] = a.to_vector();
      second[r] = b.to_vector();
      EXPECT_EQ(comm.stats().collective_calls.at("all_reduce"), 2);
    });
    for (int r = 0; r < n; ++r) {
      EXPECT_TRUE(
          testing::values_equal("iall_reduce sum", r, testing::pattern_sum(n, 1000), first[r], n));
      EXPECT_TRUE(testing::values_equal("iall_reduce max", r, testing::pattern_values(n - 1, 37),
                                        second[r], n));
    }
  }
}

TEST(AsyncAllReduce, TheRankKeepsWorkingWhileItsAllReduceWaits) {
  // Rank 0 starts an all-reduce, then needs a message rank 1 sends before
  // rank 1 joins the all-reduce. A blocking all-reduce would deadlock here.
  testing::run_ranks(2, [](Comm& comm) {
    Tensor x = Tensor::full({8}, comm.rank() + 1.0, DType::f64);
    Tensor note = Tensor::zeros({1}, DType::f64);
    if (comm.rank() == 0) {
      Request pending = comm.iall_reduce(x);
      comm.recv(note, 1);
      pending.wait();
    } else {
      comm.send(note, 0);
      comm.all_reduce(x);
    }
    EXPECT_EQ(x.item(7), 3.0);
  });
}

TEST(AsyncAllReduce, CommThreadSpansGetTheirOwnLaneInTheTrace) {
  trace::enable();
  testing::run_ranks(2, [](Comm& comm) {
    Tensor x = Tensor::zeros({1 << 16});
    Request pending = comm.iall_reduce(x);
    { trace::Scope work("backward", "compute"); }
    pending.wait();
  });
  trace::disable();
  int comm_lane = 0, compute_lane = 0;
  for (const trace::Span& s : trace::spans()) {
    if (s.name == "all_reduce") comm_lane += s.lane == 1;
    if (s.name == "backward") compute_lane += s.lane == 0;
  }
  EXPECT_EQ(comm_lane, 2);
  EXPECT_EQ(compute_lane, 2);
  const std::string path = ::testing::TempDir() + "dtp_async_trace.json";
  trace::write_chrome_json(path);
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("\"name\":\"rank 1 comm\""), std::string::npos);
}

TEST(AsyncAllReduce, AMismatchOnTheCommThreadFailsTheWait) {
  World world;
  world.size = 2;
  world.timeout_seconds = 5;
  try {
    launch(world, [](Comm& comm) {
      Tensor x = Tensor::zeros({comm.rank() == 0 ? 4 : 5});
      comm.iall_reduce(x).wait();
    });
    FAIL() << "mismatched sizes must fail";
  } catch (const RankFailure& failure) {
    EXPECT_NE(std::string(failure.what()).find("collective mismatch"), std::string::npos)
        << failure.what();
  }
}

}  // namespace
}  // namespace dtp
