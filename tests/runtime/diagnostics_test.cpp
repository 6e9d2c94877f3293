// Diagnostics are a feature: every way a distributed program can go wrong
// gets a fast, specific failure instead of a hang. One test per diagnostic.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "comm_test_helpers.h"
#include "support/harness.h"

namespace dtp {
namespace {

using Clock = std::chrono::steady_clock;

// Small thread worlds, launches that must fail, the thrown exception's type.
using testing::error_of;
using testing::launch_failure;
using testing::original_is;
using testing::thread_world;

void expect_contains(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "expected to find\n  " << part << "\nin\n"
                                                << text;
}

TEST(Diagnostics, RecvTimeoutReportsWhatEveryRankIsDoing) {
  const auto start = Clock::now();
  std::atomic<bool> timed_out{false};
  RankFailure failure = launch_failure(thread_world(3, 0.3), [&](Comm& comm) {
    Tensor x = Tensor::zeros({4}, DType::f32);
    if (comm.rank() == 0) {
      try {
        comm.recv(x, 1, 7);
      } catch (const CommTimeout&) {
        timed_out = true;
        throw;
      }
    }
    // Rank 1 is busy computing until rank 0 gave up; then its send is refused.
    if (comm.rank() == 1) {
      for (int i = 0; i < 400 && !timed_out; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(25));
      comm.send(x, 0, 7);
    }
  });
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_EQ(failure.rank(), 0);
  EXPECT_TRUE(original_is<CommTimeout>(failure)) << failure.what();
  const std::string report = failure.what();
  expect_contains(report, "timeout: rank 0 waited 0.3 s");
  expect_contains(report, "recv(source rank 1, tag 7, 4 x f32)");
  expect_contains(report, "rank 1: running (not inside a communication call)");
  expect_contains(report, "rank 2: finished");
  EXPECT_LT(seconds, 10.0);
}

TEST(Diagnostics, DeadlockIsReportedAtOnceWithoutWaitingForTheTimeout) {
  const auto start = Clock::now();
  RankFailure failure = launch_failure(thread_world(2, 30.0), [](Comm& comm) {
    Tensor x = Tensor::zeros({8}, DType::f64);
    comm.recv(x, 1 - comm.rank());  // both wait, nobody sends
  });
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_TRUE(original_is<CommDeadlock>(failure)) << failure.what();
  const std::string report = failure.what();
  expect_contains(report, "deadlock");
  expect_contains(report, "rank 0: waiting");
  expect_contains(report, "recv(source rank 1, tag 0, 8 x f64)");
  expect_contains(report, "recv(source rank 0, tag 0, 8 x f64)");
  EXPECT_LT(seconds, 5.0) << "a deadlock must not wait for DTP_TIMEOUT";
}

TEST(Diagnostics, TagMismatchShowsTheUnreceivedMessage) {
  RankFailure failure = launch_failure(thread_world(2), [](Comm& comm) {
    Tensor x = Tensor::zeros({3}, DType::f32);
    if (comm.rank() == 0) comm.send(x, 1, /*tag=*/1);
    if (comm.rank() == 1) comm.recv(x, 0, /*tag=*/2);
  });
  EXPECT_TRUE(original_is<CommDeadlock>(failure)) << failure.what();
  expect_contains(failure.what(), "rank 0 -> rank 1, tag 1: 3 x f32");
  expect_contains(failure.what(), "recv(source rank 0, tag 2, 3 x f32)");
}

TEST(Diagnostics, MismatchedCollectivesNameEveryRanksCall) {
  struct Case {
    const char* name;
    std::function<void(Comm&)> body;
    const char* rank0;
    const char* rank1;
  };
  std::vector<Case> cases = {
      {"kind",
       [](Comm& c) {
         Tensor x = Tensor::zeros({10});
         if (c.rank() == 0)
           c.all_reduce(x);
         else
           c.broadcast(x, 0);
       },
       "all_reduce(10 x f32, sum)", "broadcast(10 x f32, root 0)"},
      {"size",
       [](Comm& c) {
         Tensor x = Tensor::zeros({c.rank() == 0 ? 10 : 20});
         c.all_reduce(x);
       },
       "all_reduce(10 x f32, sum)", "all_reduce(20 x f32, sum)"},
      {"root",
       [](Comm& c) {
         Tensor x = Tensor::zeros({4});
         c.broadcast(x, c.rank());
       },
       "broadcast(4 x f32, root 0)", "broadcast(4 x f32, root 1)"},
      {"dtype",
       [](Comm& c) {
         Tensor x = Tensor::zeros({4}, c.rank() == 0 ? DType::f32 : DType::f64);
         c.all_reduce(x);
       },
       "all_reduce(4 x f32, sum)", "all_reduce(4 x f64, sum)"},
      {"op",
       [](Comm& c) {
         Tensor x = Tensor::zeros({4});
         c.all_reduce(x, c.rank() == 0 ? ReduceOp::sum : ReduceOp::max);
       },
       "all_reduce(4 x f32, sum)", "all_reduce(4 x f32, max)"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    RankFailure failure = launch_failure(thread_world(2), c.body);
    EXPECT_TRUE(original_is<CommMismatch>(failure)) << failure.what();
    expect_contains(failure.what(), "collective mismatch");
    expect_contains(failure.what(), std::string("rank 0: ") + c.rank0);
    expect_contains(failure.what(), std::string("rank 1: ") + c.rank1);
  }
}

TEST(Diagnostics, AllToAllVCountsThatDisagreeFailEveryRankNamingBothSides) {
  // Rank 0 sends 2 elements to rank 2, which expects 3 from it.
  std::vector<std::string> reports(3);
  launch(thread_world(3), [&](Comm& comm) {
    std::vector<std::int64_t> send{1, 1, comm.rank() == 0 ? 2 : 1},
        recv{comm.rank() == 2 ? 3 : 1, 1, 1};
    std::int64_t sent = 0, received = 0;
    for (int r = 0; r < 3; ++r) sent += send[r], received += recv[r];
    Tensor in = Tensor::zeros({sent}), out = Tensor::zeros({received});
    try {
      comm.all_to_all_v(in, send, out, recv);
      ADD_FAILURE() << "rank " << comm.rank() << ": counts that disagree must throw on every rank";
    } catch (const CommMismatch& e) {
      reports[comm.rank()] = e.what();
    }
  });
  for (int r = 0; r < 3; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    expect_contains(reports[r], "the ranks disagree on 1 count:");
    expect_contains(
        reports[r],
        "rank 0 sends 2 elements to rank 2 (its send_counts[2]) but rank 2 expects 3 from "
        "rank 0 (its recv_counts[0])");
  }
}

TEST(Diagnostics, AllToAllVArgumentsSayWhatWasExpected) {
  launch(thread_world(2), [](Comm& comm) {
    Tensor four = Tensor::zeros({4}), doubles = Tensor::zeros({4}, DType::f64);
    expect_contains(error_of([&] {
                      comm.all_to_all_v(four, {4}, four, {2, 2});
                    }),
                    "send_counts has 1 entries but the communicator has 2 ranks");
    expect_contains(error_of([&] {
                      comm.all_to_all_v(four, {5, -1}, four, {2, 2});
                    }),
                    "send_counts[1] is -1; counts must be >= 0");
    expect_contains(error_of([&] {
                      comm.all_to_all_v(four, {2, 2}, four, {2, 3});
                    }),
                    "recv_counts add up to 5 elements but out holds 4");
    expect_contains(error_of([&] {
                      comm.all_to_all_v(four, {2, 2}, doubles, {2, 2});
                    }),
                    "dtypes must match");
  });
}

TEST(Diagnostics, RecvOfTheWrongSizeIsAMismatch) {
  RankFailure failure = launch_failure(thread_world(2), [](Comm& comm) {
    if (comm.rank() == 0) comm.send(Tensor::zeros({5}, DType::f64), 1);
    if (comm.rank() == 1) {
      Tensor x = Tensor::zeros({4}, DType::f64);
      comm.recv(x, 0);
    }
  });
  EXPECT_EQ(failure.rank(), 1);
  EXPECT_TRUE(original_is<CommMismatch>(failure)) << failure.what();
  expect_contains(failure.what(), "expected 4 x f64 but the message holds 5 x f64");
}

TEST(Diagnostics, AnExceptionInOneRankUnwindsEveryRankAndNamesIt) {
  const auto start = Clock::now();
  RankFailure failure = launch_failure(thread_world(4, 30.0), [](Comm& comm) {
    if (comm.rank() == 2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      throw std::runtime_error("boom in the backward pass");
    }
    comm.barrier();  // the others wait here and must be released
  });
  EXPECT_EQ(failure.rank(), 2);
  EXPECT_EQ(std::string(failure.what()), "rank 2: boom in the backward pass");
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 5.0);
}

TEST(Diagnostics, MessagesNobodyReceivedFailTheRun) {
  RankFailure failure = launch_failure(thread_world(3), [](Comm& comm) {
    if (comm.rank() == 1) comm.send(Tensor::zeros({2}, DType::i32), 2, 4);
  });
  EXPECT_EQ(failure.rank(), 2);
  expect_contains(failure.what(), "never received");
  expect_contains(failure.what(), "rank 1 -> rank 2, tag 4: 2 x i32");
}

TEST(Diagnostics, MessagesLeftInASubGroupThatIsGoneFailTheRunToo) {
  // The sub-communicator dies with the rank function, before launch looks.
  RankFailure failure = launch_failure(thread_world(4), [](Comm& comm) {
    Comm pairs = comm.split(comm.rank() / 2, comm.rank());
    if (comm.rank() == 2) pairs.send(Tensor::zeros({3}, DType::f64), 1, 7);
  });
  EXPECT_EQ(failure.rank(), 3);
  expect_contains(failure.what(), "never received");
  expect_contains(failure.what(), "rank 2 -> rank 3, tag 7: 3 x f64 (in group [2, 3])");
}

TEST(Diagnostics, BadArgumentsSayWhatWasExpected) {
  launch(thread_world(3), [](Comm& comm) {
    Tensor x = Tensor::zeros({7});
    try {
      comm.all_to_all(x, x);
      ADD_FAILURE() << "all_to_all of 7 elements on 3 ranks must throw";
    } catch (const Error& e) {
      expect_contains(e.what(), "must divide by the world size 3");
    }
    Tensor full = Tensor::zeros({10});
    Tensor wrong = Tensor::zeros({2});  // chunk r of 10 on 3 ranks has 4, 4, 2 elements
    if (comm.rank() < 2) {
      try {
        comm.all_gather(wrong, full);
        ADD_FAILURE() << "an all_gather shard of the wrong size must throw";
      } catch (const Error& e) {
        expect_contains(e.what(), "which is 4 elements, but it holds 2");
      }
    }
    EXPECT_THROW(comm.send(x, 3), Error);
    EXPECT_THROW(comm.recv(x, -1), Error);
    EXPECT_THROW(comm.broadcast(x, 5), Error);
    Tensor ints = Tensor::zeros({3}, DType::i32);
    EXPECT_THROW(comm.all_reduce(ints, ReduceOp::avg), Error);
    EXPECT_THROW(comm.send(Tensor(), 0), Error);
    EXPECT_THROW(comm.split(-1, 0), Error);
  });
  EXPECT_THROW(launch(thread_world(0), [](Comm&) {}), Error);
  World nccl = thread_world(2);
  nccl.backend = Backend::nccl;  // not part of this build
  EXPECT_THROW(launch(nccl, [](Comm&) {}), Error);
  EXPECT_THROW(parse_backend("gloo"), Error);
}

}  // namespace
}  // namespace dtp
