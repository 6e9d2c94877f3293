// Fault injection (dtp/fault.h) on rank threads: the plan's parsing, and
// each kind doing what it says: a crashed or hung rank leaves without
// failing the launch, its absence is seen through timed receives, a slow
// rank sleeps, a dropped message is never delivered and never reported.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "dtp/dtp.h"
#include "dtp/fault.h"
#include "support/harness.h"

namespace dtp {
namespace {

using fault::Kind;

// Installs a plan for one test and clears it after.
struct PlanScope {
  explicit PlanScope(const std::string& text) { fault::set_plan(fault::parse_plan(text)); }
  ~PlanScope() { fault::set_plan({}); }
};

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

TEST(FaultPlan, ParsesEveryKindAndRefusesTheRest) {
  const std::vector<fault::Fault> plan =
      fault::parse_plan("1:5:crash,2:3:slow=0.25,0:7:drop-message,3:1:hang");
  ASSERT_EQ(plan.size(), 4u);
  EXPECT_EQ(plan[0].rank, 1);
  EXPECT_EQ(plan[0].step, 5);
  EXPECT_EQ(plan[0].kind, Kind::crash);
  EXPECT_EQ(plan[1].kind, Kind::slow);
  EXPECT_EQ(plan[1].seconds, 0.25);
  EXPECT_EQ(plan[2].kind, Kind::drop_message);
  EXPECT_EQ(plan[3].kind, Kind::hang);
  EXPECT_EQ(fault::plan_text(plan), "1:5:crash,2:3:slow=0.25,0:7:drop-message,3:1:hang");
  EXPECT_TRUE(fault::parse_plan("").empty());
  struct Case {
    const char* text;
    const char* names;
  };
  for (const Case& c :
       {Case{"1:5", "'1:5'"}, Case{"a:5:crash", "rank 'a'"}, Case{"1:0:crash", "step '0'"},
        Case{"1:2:boom", "kind 'boom'"}, Case{"1:2:slow=0", "slow needs seconds > 0"},
        Case{"1:2:slow=x", "slow needs seconds > 0"},
        Case{"1:2:crash,1:2:hang", "planned twice"}}) {
    std::string message = "(no error)";
    try {
      fault::parse_plan(c.text);
    } catch (const Error& e) {
      message = e.what();
    }
    EXPECT_NE(message.find(c.names), std::string::npos)
        << "plan '" << c.text << "' should be refused naming " << c.names << "; got: " << message;
  }
}

// Three steps on 3 ranks; every step ranks 1 and 2 send rank 0 a heartbeat,
// which rank 0 waits for with recv_for. Returns, per step, which ranks
// rank 0 missed.
std::vector<std::vector<int>> heartbeats(int steps, double wait_s) {
  std::vector<std::vector<int>> missed(static_cast<std::size_t>(steps));
  testing::run_ranks(3, [&](Comm& comm) {
    Tensor beat = Tensor::zeros({1}, DType::f64);
    std::vector<double> latest(3, 0);  // the newest beat of each rank (one may come early)
    for (int s = 1; s <= steps; ++s) {
      fault::at_step(comm, s);
      if (comm.rank() != 0) {
        comm.send(Tensor::full({1}, s, DType::f64), 0, 1);
        continue;
      }
      for (int r = 1; r < 3; ++r) {
        while (latest[r] < s && comm.recv_for(beat, r, 1, wait_s)) latest[r] = beat.item(0);
        if (latest[r] < s) missed[static_cast<std::size_t>(s - 1)].push_back(r);
      }
    }
  });
  return missed;
}

TEST(FaultInjection, ACrashedRankLeavesAndTheOthersSeeItMissing) {
  PlanScope plan("1:2:crash");
  const auto start = std::chrono::steady_clock::now();
  const std::vector<std::vector<int>> missed = heartbeats(3, 0.1);
  EXPECT_LT(seconds_since(start), 5.0);
  EXPECT_EQ(missed[0], std::vector<int>{}) << "step 1: nobody has crashed yet";
  EXPECT_EQ(missed[1], std::vector<int>{1}) << "step 2: rank 1 crashed at its start";
  EXPECT_EQ(missed[2], std::vector<int>{1});
  const std::vector<fault::Fired> fired = fault::fired();
  ASSERT_EQ(fired.size(), 1u);
  EXPECT_EQ(fired[0].fault.rank, 1);
  EXPECT_EQ(fired[0].fault.step, 2);
  EXPECT_EQ(fault::ranks_down(), std::vector<int>{1});
}

TEST(FaultInjection, AHungRankIsSilentUntilTheOthersLeave) {
  PlanScope plan("2:1:hang");
  const auto start = std::chrono::steady_clock::now();
  const std::vector<std::vector<int>> missed = heartbeats(2, 0.1);
  EXPECT_LT(seconds_since(start), 5.0) << "the hung rank must leave once the others have";
  EXPECT_EQ(missed[0], std::vector<int>{2});
  EXPECT_EQ(missed[1], std::vector<int>{2});
}

TEST(FaultInjection, ASlowRankSleepsAndIsNotMissedByAPatientWaiter) {
  PlanScope plan("1:1:slow=0.2");
  const auto start = std::chrono::steady_clock::now();
  const std::vector<std::vector<int>> missed = heartbeats(1, 5.0);
  EXPECT_GE(seconds_since(start), 0.2);
  EXPECT_EQ(missed[0], std::vector<int>{});
}

TEST(FaultInjection, ADroppedMessageIsCountedSentAndNeverDelivered) {
  PlanScope plan("0:1:drop-message");
  std::vector<double> got;
  std::int64_t sent = 0;
  bool another = true;
  testing::run_ranks(2, [&](Comm& comm) {
    fault::at_step(comm, 1);
    Tensor x = Tensor::zeros({1}, DType::f64);
    if (comm.rank() == 0) {
      comm.send(Tensor::full({1}, 1, DType::f64), 1, 0);  // lost
      comm.send(Tensor::full({1}, 2, DType::f64), 1, 0);
      sent = comm.stats().messages_sent;
      return;
    }
    comm.recv(x, 0, 0);
    got.push_back(x.item(0));
    another = comm.recv_for(x, 0, 0, 0.05);
  });
  EXPECT_EQ(got, std::vector<double>{2}) << "the first message was lost";
  EXPECT_FALSE(another);
  EXPECT_EQ(sent, 2) << "the sender counts the lost message as sent";
}

TEST(FaultInjection, MessagesToARankThatLeftAreNotReportedUndelivered) {
  PlanScope plan("1:1:crash");
  EXPECT_NO_THROW(testing::run_ranks(2, [](Comm& comm) {
    fault::at_step(comm, 1);
    comm.send(Tensor::zeros({1}, DType::f64), 1, 0);  // rank 0 only: rank 1 has left
  }));
}

TEST(FaultInjection, AFaultFiresOncePerProcess) {
  PlanScope plan("0:1:slow=0.01");
  testing::run_ranks(1, [](Comm& comm) { fault::at_step(comm, 1); });
  testing::run_ranks(1, [](Comm& comm) { fault::at_step(comm, 1); });
  EXPECT_EQ(fault::fired().size(), 1u) << "a restarted run passes step 1 again without the fault";
}

}  // namespace
}  // namespace dtp
