// The thread backend's reliability under what broke it once: a non-blocking
// collective beside a blocking one, pending work that is not idleness,
// failures nobody waited for, exceptions a rank catches, absurd timeouts.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <thread>

#include "runtime/comm_test_helpers.h"
#include "support/harness.h"

namespace dtp {
namespace {

using testing::contains;
using testing::launch_failure;
using testing::original_is;
using testing::ScopedEnv;
using testing::thread_world;

double triangle(int n) { return n * (n + 1) / 2.0; }

bool all_equal(const Tensor& x, double value) {
  for (double v : x.to_vector())
    if (v != value) return false;
  return true;
}

TEST(MixedCollectives, NonBlockingBesideBlockingIsExactThousandsOfTimes) {
  // Every rank calls the same collectives in the same order, but which of
  // them run on the communication thread differs from rank to rank and round
  // to round. Sequence numbers, not threads, must pair them up.
  constexpr int kRounds = 2000;
  for (int n : {2, 3, 4}) {
    SCOPED_TRACE("world size " + std::to_string(n));
    std::atomic<int> wrong_sums{0};
    launch(thread_world(n, 20.0), [&](Comm& comm) {
      const int r = comm.rank();
      for (int i = 0; i < kRounds; ++i) {
        Tensor a = Tensor::full({33}, r + 1.0 + i, DType::f64);
        Tensor b = Tensor::full({7}, 10.0 * (r + 1), DType::f64);
        Tensor c = Tensor::full({5}, r + 1.0, DType::f64);
        const bool a_in_background = (r + i) % 3 != 0;
        Request pending_a = a_in_background ? comm.iall_reduce(a) : Request();
        if (!a_in_background) comm.all_reduce(a);
        Request pending_b = comm.iall_reduce(b, ReduceOp::max);
        comm.all_reduce(c);
        pending_a.wait();
        pending_b.wait();
        if (!all_equal(a, triangle(n) + n * i) || !all_equal(b, 10.0 * n) ||
            !all_equal(c, triangle(n)))
          ++wrong_sums;
      }
    });
    EXPECT_EQ(wrong_sums.load(), 0);
  }
}

TEST(MixedCollectives, QueuedWorkOnTheCommunicationThreadIsNotADeadlock) {
  // Rank 0's all-reduce sits queued on its communication thread while rank 0
  // waits in recv; rank 1 sends only after that all-reduce. Nobody is stuck.
  for (int run = 0; run < 300; ++run) {
    launch(thread_world(2, 10.0), [](Comm& comm) {
      Tensor x = Tensor::full({16}, comm.rank() + 1.0, DType::f64);
      Tensor note = Tensor::zeros({1}, DType::f64);
      if (comm.rank() == 0) {
        Request pending = comm.iall_reduce(x);
        comm.recv(note, 1);
        pending.wait();
      } else {
        comm.all_reduce(x);
        comm.send(note, 0);
      }
      EXPECT_TRUE(all_equal(x, 3.0));
    });
  }
}

TEST(UnwaitedFailures, ATimedOutNonBlockingCollectiveFailsTheLaunch) {
  // Rank 0 never waits on its all-reduce and rank 1 never joins it.
  RankFailure failure = launch_failure(thread_world(2, 0.3), [](Comm& comm) {
    Tensor x = Tensor::zeros({4}, DType::f32);
    if (comm.rank() == 0) comm.iall_reduce(x);
  });
  EXPECT_EQ(failure.rank(), 0);
  // The communication thread is left waiting for a rank that has returned:
  // it may be diagnosed as a timeout or, at once, as a deadlock.
  EXPECT_TRUE(original_is<CommTimeout>(failure) || original_is<CommDeadlock>(failure))
      << failure.what();
  EXPECT_TRUE(contains(failure.what(), "all_reduce(4 x f32, sum)"));
  EXPECT_TRUE(contains(failure.what(), "never waited"));
}

TEST(UnwaitedFailures, AMismatchNobodyWaitedForFailsTheLaunch) {
  RankFailure failure = launch_failure(thread_world(2), [](Comm& comm) {
    Tensor x = Tensor::zeros({comm.rank() == 0 ? 4 : 5}, DType::f32);
    comm.iall_reduce(x);
  });
  EXPECT_TRUE(original_is<CommMismatch>(failure)) << failure.what();
  EXPECT_TRUE(contains(failure.what(), "collective mismatch"));
}

TEST(UnwaitedFailures, ASucceededCollectiveNobodyWaitedForIsFine) {
  launch(thread_world(3), [](Comm& comm) {
    Tensor x = Tensor::full({8}, 1.0);
    comm.iall_reduce(x);
  });
}

TEST(CaughtExceptions, ASplitCommunicatorUnwoundByACaughtExceptionDoesNotAbort) {
  launch(thread_world(4), [](Comm& comm) {
    try {
      Comm pair = comm.split(comm.rank() / 2, comm.rank());
      Tensor y = Tensor::full({3}, 1.0);
      pair.all_reduce(y);
      throw std::runtime_error("handled by the rank");
    } catch (const std::runtime_error&) {
    }
    Tensor x = Tensor::full({5}, 1.0, DType::f64);
    comm.all_reduce(x);
    EXPECT_TRUE(all_equal(x, 4.0));
  });
}

TEST(CaughtExceptions, AFailingRankWithPendingWorkStillReleasesItsPeers) {
  // Rank 0's all-reduce can never complete (rank 1 waits in recv for a
  // message rank 0 will not send): rank 0's failure must end the run at once.
  const auto start = std::chrono::steady_clock::now();
  RankFailure failure = launch_failure(thread_world(2, 30.0), [](Comm& comm) {
    Tensor x = Tensor::zeros({4});
    if (comm.rank() == 0) {
      Request pending = comm.iall_reduce(x);
      throw std::runtime_error("boom with an all-reduce in flight");
    }
    comm.recv(x, 0);
  });
  EXPECT_EQ(failure.rank(), 0);
  EXPECT_EQ(std::string(failure.what()), "rank 0: boom with an all-reduce in flight");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 10.0);
}

TEST(TimeoutSetting, NonFiniteValuesAreRejectedSayingWhatIsExpected) {
  for (const char* text : {"inf", "nan", "-inf"}) {
    SCOPED_TRACE(text);
    ScopedEnv timeout("DTP_TIMEOUT", text);
    try {
      default_timeout_seconds();
      ADD_FAILURE() << "DTP_TIMEOUT=" << text << " must be rejected";
    } catch (const Error& e) {
      EXPECT_TRUE(contains(e.what(), "DTP_TIMEOUT must be a positive, finite number of seconds"));
    }
  }
  World world = thread_world(1, INFINITY);
  EXPECT_THROW(launch(world, [](Comm&) {}), Error);
}

TEST(TimeoutSetting, HugeValuesAreClampedAndWaitsStillWork) {
  {
    ScopedEnv timeout("DTP_TIMEOUT", "1e12");
    const double seconds = default_timeout_seconds();
    EXPECT_GE(seconds, 1e6);
    EXPECT_LE(seconds, 1e8);
  }
  // A recv that waits 50 ms under a 10^12 s timeout must simply succeed.
  launch(thread_world(2, 1e12), [](Comm& comm) {
    Tensor x = Tensor::full({2}, 7.0, DType::f64);
    if (comm.rank() == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      comm.send(x, 0);
    } else {
      Tensor got = Tensor::zeros({2}, DType::f64);
      comm.recv(got, 1);
      EXPECT_TRUE(all_equal(got, 7.0));
    }
  });
}

}  // namespace
}  // namespace dtp
