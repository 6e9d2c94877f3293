// Synchronous sends (DTP_SEND=sync, as MPI_Ssend): send returns only once the
// matching receive has been posted, so programs that only work because sends
// are buffered show up as deadlocks here, as they would on a real cluster.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "runtime/comm_test_helpers.h"
#include "support/harness.h"

namespace dtp {
namespace {

using Clock = std::chrono::steady_clock;
using testing::contains;
using testing::launch_failure;
using testing::original_is;
using testing::ScopedEnv;

World world_of(int size, SendMode mode, double timeout_seconds = 20.0) {
  World world = testing::thread_world(size, timeout_seconds);
  world.send_mode = mode;
  return world;
}

// Every rank sends to its right neighbour, then receives from its left one.
void send_then_receive_ring(Comm& comm) {
  const int right = (comm.rank() + 1) % comm.size();
  const int left = (comm.rank() + comm.size() - 1) % comm.size();
  Tensor out = Tensor::full({4}, comm.rank(), DType::f32);
  Tensor in = Tensor::zeros({4}, DType::f32);
  comm.send(out, right, 3);
  comm.recv(in, left, 3);
  EXPECT_EQ(in.item(0), left);
}

TEST(SyncSend, ARingThatSendsFirstPassesEagerButDeadlocksSync) {
  for (int n : {2, 3, 5}) {
    SCOPED_TRACE("world size " + std::to_string(n));
    launch(world_of(n, SendMode::eager), send_then_receive_ring);

    const auto start = Clock::now();
    RankFailure failure = launch_failure(world_of(n, SendMode::sync, 30.0), send_then_receive_ring);
    EXPECT_TRUE(original_is<CommDeadlock>(failure)) << failure.what();
    EXPECT_TRUE(contains(
        failure.what(),
        "send(destination rank 1, tag 3, 4 x f32) to be matched by a recv (DTP_SEND=sync)"));
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 10.0)
        << "a deadlock must be reported at once, not after DTP_TIMEOUT";
  }
}

TEST(SyncSend, ARingThatPostsIrecvAndIsendPassesSync) {
  for (int n : {1, 2, 3, 5}) {
    launch(world_of(n, SendMode::sync), [](Comm& comm) {
      const int right = (comm.rank() + 1) % comm.size();
      const int left = (comm.rank() + comm.size() - 1) % comm.size();
      Tensor out = Tensor::full({4}, comm.rank(), DType::f32);
      Tensor in = Tensor::zeros({4}, DType::f32);
      Request receive = comm.irecv(in, left, 3);
      Request send = comm.isend(out, right, 3);
      send.wait();
      receive.wait();
      EXPECT_EQ(in.item(3), left);
    });
  }
}

TEST(SyncSend, SendReturnsOnlyOnceTheReceiveIsPosted) {
  // Rank 1 posts its receive 300 ms late: a sync send waits for it, an eager one does not.
  for (SendMode mode : {SendMode::eager, SendMode::sync}) {
    SCOPED_TRACE(send_mode_name(mode));
    double send_seconds = 0, isend_wait_seconds = 0;
    launch(world_of(2, mode), [&](Comm& comm) {
      Tensor x = Tensor::full({8}, 1.0, DType::f64);
      if (comm.rank() == 0) {
        auto start = Clock::now();
        comm.send(x, 1, 0);
        send_seconds = std::chrono::duration<double>(Clock::now() - start).count();
        Request request = comm.isend(x, 1, 1);
        start = Clock::now();
        request.wait();
        isend_wait_seconds = std::chrono::duration<double>(Clock::now() - start).count();
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        comm.recv(x, 0, 0);
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        comm.recv(x, 0, 1);
      }
    });
    if (mode == SendMode::sync) {
      EXPECT_GE(send_seconds, 0.25);
      EXPECT_GE(isend_wait_seconds, 0.25);
    } else {
      EXPECT_LT(send_seconds, 0.25);
      EXPECT_LT(isend_wait_seconds, 0.25);
    }
  }
}

TEST(SyncSend, ASendWhoseReceiverWaitsOnSomethingElseIsADeadlockNamingTheSend) {
  RankFailure failure = launch_failure(world_of(3, SendMode::sync, 30.0), [](Comm& comm) {
    Tensor x = Tensor::zeros({2}, DType::i32);
    if (comm.rank() == 0) comm.send(x, 1, 9);  // rank 1 first waits for rank 2 ...
    if (comm.rank() == 1) {
      comm.recv(x, 2, 0);
      comm.recv(x, 0, 9);
    }
    if (comm.rank() == 2) {
      comm.recv(x, 0, 0);  // ... which waits for rank 0
      comm.send(x, 1, 0);
    }
  });
  EXPECT_TRUE(original_is<CommDeadlock>(failure)) << failure.what();
  EXPECT_TRUE(contains(failure.what(), "rank 0: waiting"));
  EXPECT_TRUE(
      contains(failure.what(), "send(destination rank 1, tag 9, 2 x i32) to be matched by a recv"));
}

TEST(SyncSend, TheEnvironmentPicksTheModeAndBadValuesSayWhatIsAccepted) {
  {
    ScopedEnv send("DTP_SEND", "sync");
    EXPECT_EQ(default_send_mode(), SendMode::sync);
    EXPECT_EQ(World::from_env(2).send_mode, SendMode::sync);
  }
  {
    ScopedEnv send("DTP_SEND", "eager");
    EXPECT_EQ(default_send_mode(), SendMode::eager);
  }
  {
    ScopedEnv send("DTP_SEND", "rendezvous");
    try {
      default_send_mode();
      ADD_FAILURE() << "DTP_SEND=rendezvous must be rejected";
    } catch (const Error& e) {
      EXPECT_TRUE(contains(e.what(), "DTP_SEND must be eager or sync, got 'rendezvous'"));
    }
  }
}

}  // namespace
}  // namespace dtp
