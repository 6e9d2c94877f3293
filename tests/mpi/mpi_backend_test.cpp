// The mpi backend, run by CTest under `mpiexec -n 4`: every process runs
// every test and checks its own rank's part.
#include <gtest/gtest.h>

#include <mpi.h>

#include <chrono>
#include <optional>
#include <thread>

#include "dtp/fault.h"
#include "support/all_to_all_v_case.h"
#include "support/harness.h"

namespace dtp {
namespace {

World mpi_world(int size) {
  World world = World::from_env(size);
  world.backend = Backend::mpi;
  world.timeout_seconds = 20;
  return world;
}

bool current_process_takes_part(const World& world) {
  int me = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  return me < world.size;
}

// The failure launch must raise; none for a process that sits out a world
// smaller than the number of processes.
std::optional<RankFailure> launch_failure(const World& world,
                                          const std::function<void(Comm&)>& fn) {
  try {
    launch(world, fn);
  } catch (const RankFailure& failure) {
    return failure;
  }
  if (current_process_takes_part(world))
    ADD_FAILURE() << "launch was expected to fail but it succeeded";
  return std::nullopt;
}

void expect_contains(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "expected to find\n  " << part << "\nin\n"
                                                << text;
}

TEST(MpiBackend, RunsUnderMpiexecWithFourProcesses) {
  ASSERT_EQ(max_world_size(Backend::mpi), 4) << "CTest starts this binary with mpiexec -n 4";
}

TEST(MpiBackend, PointToPointRingAndClock) {
  launch(mpi_world(4), [](Comm& comm) {
    EXPECT_EQ(comm.backend_name(), "mpi");
    const int n = comm.size(), r = comm.rank();
    Tensor out = testing::pattern_tensor(r, 1000), in = Tensor::zeros({1000}, DType::f64);
    comm.reset_stats();
    comm.send(out, (r + 1) % n, 3);
    out.fill(0);  // eager: reusing the buffer is safe
    comm.recv(in, (r + n - 1) % n, 3);
    EXPECT_TRUE(testing::values_equal(
        "ring exchange", r, testing::pattern_values((r + n - 1) % n, 1000), in.to_vector()));
    EXPECT_EQ(comm.stats().messages_sent, 1);
    EXPECT_EQ(comm.stats().bytes_received, 8000);
  });
}

TEST(MpiBackend, AlphaBetaClockTravelsWithMessages) {
  launch(
      [] {
        World w = mpi_world(3);
        w.cost = CostModel{1.0, 0.5};
        return w;
      }(),
      [](Comm& comm) {
        Tensor x = Tensor::zeros({10}, DType::f32);  // 40 bytes: each send costs 21
        if (comm.rank() == 0) {
          comm.send(x, 1);
          comm.send(x, 2);
        } else {
          comm.recv(x, 0);
        }
        const double expected[] = {42, 21, 42};
        EXPECT_DOUBLE_EQ(comm.stats().clock, expected[comm.rank()]) << "rank " << comm.rank();
      });
}

// Two tiers (CostModel::with_nodes): 4 ranks in nodes of 2, a send and
// a collective inside a node cost the inside link, the rest the outer one.
// Costs: outer alpha 1, beta 0.5; inside alpha 0.1, beta 0.01; 40 bytes.
TEST(MpiBackend, NodesChargeTheInsideLinkWithinANode) {
  launch(
      [] {
        World w = mpi_world(4);
        w.cost = CostModel{1.0, 0.5}.with_nodes(2, 0.1, 0.01);
        return w;
      }(),
      [](Comm& comm) {
        Tensor x = Tensor::zeros({10}, DType::f32);
        if (comm.rank() == 0) {
          comm.send(x, 1);
          comm.send(x, 2);
        } else if (comm.rank() != 3) {
          comm.recv(x, 0);
        }
        const double sends[] = {21.5, 0.5, 21.5, 0.0};
        EXPECT_NEAR(comm.stats().clock, sends[comm.rank()], 1e-12)
            << "rank " << comm.rank() << ": 0 -> 1 stays inside node 0 (0.5), 0 -> 2 crosses";
        Comm node = comm.split(comm.rank() / 2, comm.rank());
        node.all_reduce(x);
        comm.all_reduce(x);
        EXPECT_NEAR(comm.stats().clock, 21.5 + 2 + 0.6 + 36, 1e-12)
            << "rank " << comm.rank() << ": split 2, the node's all-reduce 0.6, the world's 36";
      });
}

// recv_any and recv_for on processes: the source is returned, each
// source's order kept, a timed receive gives up and leaves no receive behind.
TEST(MpiBackend, RecvAnyAndRecvFor) {
  launch(mpi_world(3), [](Comm& comm) {
    Tensor x = Tensor::zeros({1}, DType::f64);
    if (comm.rank() != 0) {
      for (int k = 0; k < 2; ++k)
        comm.send(Tensor::full({1}, comm.rank() * 10 + k, DType::f64), 0, 5);
      comm.barrier();
      comm.send(Tensor::full({1}, 7, DType::f64), 0, 6);
      return;
    }
    std::vector<int> next(3, 0);
    for (int m = 0; m < 4; ++m) {
      const int from = comm.recv_any(x, 5);
      ASSERT_GE(from, 1);
      EXPECT_EQ(x.item(0), from * 10 + next[from]) << "source " << from;
      ++next[from];
    }
    EXPECT_FALSE(comm.recv_for(x, 1, 6, 0.05)) << "rank 1 sends tag 6 only after the barrier";
    EXPECT_EQ(comm.recv_any_for(x, 6, 0.0), -1);
    comm.barrier();
    for (int m = 0; m < 2; ++m) {
      const int from = comm.recv_any_for(x, 6, 10.0);
      EXPECT_GE(from, 1);
      EXPECT_EQ(x.item(0), 7);
    }
  });
}

// Fault injection on processes: a crashed rank and a hung one leave without
// failing the launch, a dropped message never arrives, and nothing is
// reported undelivered. Rank 0 collects the beats of ranks 1 and 2 with
// recv_for; a beat carries its step.
TEST(MpiBackend, InjectedFaultsLeaveTheOthersRunning) {
  struct Case {
    const char* plan;
    std::vector<double> rank1, rank2;  // the beats rank 0 must receive
  };
  for (const Case& c : {Case{"1:2:crash", {1}, {1, 2}}, Case{"2:1:hang", {1, 2}, {}},
                        Case{"1:1:drop-message", {2}, {1, 2}}}) {
    fault::set_plan(fault::parse_plan(c.plan));
    std::vector<std::vector<double>> beats(3);
    launch(mpi_world(3), [&](Comm& comm) {
      Tensor beat = Tensor::zeros({1}, DType::f64);
      for (int s = 1; s <= 2; ++s) {
        fault::at_step(comm, s);
        if (comm.rank() != 0) {
          comm.send(Tensor::full({1}, s, DType::f64), 0, 1);
          continue;
        }
        for (int r = 1; r < 3; ++r)
          while ((beats[r].empty() || beats[r].back() < s) && comm.recv_for(beat, r, 1, 0.2))
            beats[r].push_back(beat.item(0));
      }
    });
    int me = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    if (me == 0) {
      EXPECT_EQ(beats[1], c.rank1) << "plan " << c.plan << ": the beats of rank 1";
      EXPECT_EQ(beats[2], c.rank2) << "plan " << c.plan << ": the beats of rank 2";
    }
    fault::set_plan({});
  }
}

TEST(MpiBackend, IsendIrecvAndPostOrder) {
  launch(mpi_world(2), [](Comm& comm) {
    if (comm.rank() == 0) {
      Tensor a = Tensor::full({4}, 10, DType::i32), b = Tensor::full({4}, 20, DType::i32);
      Request ra = comm.isend(a, 1, 5), rb = comm.isend(b, 1, 5);
      ra.wait();
      rb.wait();
    } else {
      Tensor a = Tensor::zeros({4}, DType::i32), b = Tensor::zeros({4}, DType::i32);
      Request first = comm.irecv(a, 0, 5), second = comm.irecv(b, 0, 5);
      second.wait();
      first.wait();
      EXPECT_EQ(a.item(3), 10);
      EXPECT_EQ(b.item(3), 20);
    }
  });
}

TEST(MpiBackend, SyncSendReturnsOnlyOnceTheReceiveIsPosted) {
  // Rank 1 posts each receive 300 ms late: under DTP_SEND=sync (MPI_Issend)
  // rank 0's send and its isend's wait last at least that long.
  World world = mpi_world(2);
  world.send_mode = SendMode::sync;
  double send_seconds = 1e9, isend_wait_seconds = 1e9;
  launch(world, [&](Comm& comm) {
    Tensor x = Tensor::full({8}, 1.0, DType::f64);
    if (comm.rank() == 0) {
      auto start = std::chrono::steady_clock::now();
      comm.send(x, 1, 0);
      send_seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      Request request = comm.isend(x, 1, 1);
      start = std::chrono::steady_clock::now();
      request.wait();
      isend_wait_seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      comm.recv(x, 0, 0);
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      comm.recv(x, 0, 1);
    }
  });
  int me = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  if (me == 0) {
    EXPECT_GE(send_seconds, 0.25);
    EXPECT_GE(isend_wait_seconds, 0.25);
  }
}

TEST(MpiBackend, LibraryCollectivesOnUnevenLengths) {
  for (int n = 1; n <= 4; ++n) {
    launch(mpi_world(n), [n](Comm& comm) {
      const int r = comm.rank();
      const std::int64_t len = 23;
      Tensor x = testing::pattern_tensor(r, len);
      comm.all_reduce(x);
      EXPECT_TRUE(
          testing::values_equal("all_reduce", r, testing::pattern_sum(n, len), x.to_vector(), n));

      Tensor avg = Tensor::full({5}, r + 1.0, DType::f32);
      comm.all_reduce(avg, ReduceOp::avg);
      EXPECT_EQ(avg.item(4), (n + 1) / 2.0);

      Tensor half = Tensor::full({3}, r + 1.0, DType::bf16);
      comm.all_reduce(half, ReduceOp::max);
      EXPECT_EQ(half.item(0), n);

      ChunkRange mine = chunk_range(len, n, r);
      Tensor full = Tensor::zeros({len}, DType::f64);
      Tensor shard = testing::pattern_tensor(0, len).slice(mine.offset, mine.length).clone();
      comm.all_gather(shard, full);
      EXPECT_TRUE(testing::values_equal("all_gather", r, testing::pattern_values(0, len),
                                        full.to_vector(), n));

      Tensor reduced = Tensor::zeros({mine.length}, DType::f64);
      comm.reduce_scatter(testing::pattern_tensor(r, len), reduced);
      std::vector<double> sum = testing::pattern_sum(n, len);
      EXPECT_TRUE(testing::values_equal(
          "reduce_scatter", r,
          std::vector<double>(sum.begin() + mine.offset, sum.begin() + mine.offset + mine.length),
          reduced.to_vector()));

      Tensor b = testing::pattern_tensor(r, 7);
      comm.broadcast(b, n - 1);
      EXPECT_TRUE(
          testing::values_equal("broadcast", r, testing::pattern_values(n - 1, 7), b.to_vector()));

      Tensor red = testing::pattern_tensor(r, 7);
      comm.reduce(red, 0);
      if (r == 0) {
        EXPECT_TRUE(
            testing::values_equal("reduce", r, testing::pattern_sum(n, 7), red.to_vector()));
      }

      Tensor gathered = Tensor::zeros({len}, DType::f64);
      comm.gather(shard, gathered, 0);
      if (r == 0) {
        EXPECT_TRUE(testing::values_equal("gather", r, testing::pattern_values(0, len),
                                          gathered.to_vector()));
      }

      Tensor piece = Tensor::zeros({mine.length}, DType::f64);
      comm.scatter(testing::pattern_tensor(0, len), piece, 0);
      EXPECT_EQ(piece.to_vector(), shard.to_vector());

      Tensor in = testing::pattern_tensor(r, 2 * n), out = Tensor::zeros({2 * n}, DType::f64);
      comm.all_to_all(in, out);
      for (int i = 0; i < n; ++i)
        EXPECT_EQ(out.item(2 * i + 1), testing::pattern_value(i, 2 * r + 1, DType::f64));
      comm.barrier();
    });
  }
}

TEST(MpiBackend, AllToAllVMovesEveryBlockWithItsOwnCount) {
  for (int n = 1; n <= 4; ++n) {
    launch(mpi_world(n), [n](Comm& comm) {
      testing::AllToAllVCase exchange(comm.rank(), n, DType::f32);
      comm.all_to_all_v(exchange.in, exchange.send_counts, exchange.out, exchange.recv_counts);
      EXPECT_TRUE(exchange.received_everything());
    });
  }
}

TEST(MpiDiagnostics, AllToAllVCountsThatDisagreeFailEveryRank) {
  // Every rank reaches the same verdict, so every rank throws (none hangs).
  launch(mpi_world(3), [](Comm& comm) {
    std::vector<std::int64_t> send{1, 1, comm.rank() == 0 ? 2 : 1},
        recv{comm.rank() == 2 ? 3 : 1, 1, 1};
    Tensor in = Tensor::zeros({send[0] + send[1] + send[2]}),
           out = Tensor::zeros({recv[0] + recv[1] + recv[2]});
    try {
      comm.all_to_all_v(in, send, out, recv);
      ADD_FAILURE() << "rank " << comm.rank() << ": counts that disagree must throw on every rank";
    } catch (const CommMismatch& e) {
      expect_contains(
          e.what(), "rank 0 sends 2 elements to rank 2 (its send_counts[2]) but rank 2 expects 3");
    }
  });
}

TEST(MpiBackend, AllReducesSmallEnoughToRideWithTheCheckAndOneElementLarger) {
  // Up to 1 KiB the data travels inside the collective check's own
  // all-reduce; one element more takes MPI_Allreduce. Both must agree exactly.
  for (int n : {3, 4}) {
    launch(mpi_world(n), [n](Comm& comm) {
      const int r = comm.rank();
      for (DType dtype : {DType::f32, DType::f64, DType::i32, DType::bf16}) {
        const std::int64_t carried =
            1024 / static_cast<std::int64_t>(dtype_size(dtype == DType::bf16 ? DType::f32 : dtype));
        for (std::int64_t len : {std::int64_t{0}, std::int64_t{1}, carried, carried + 1}) {
          const std::string what = std::string(dtype_name(dtype)) + " x " + std::to_string(len);
          Tensor x = testing::pattern_tensor(r, len, dtype);
          comm.all_reduce(x);
          EXPECT_TRUE(testing::values_equal("all_reduce " + what, r,
                                            testing::pattern_sum(n, len, dtype), x.to_vector(), 0,
                                            {n, dtype, testing::PatternMeaning::sums}));
          Tensor high = Tensor::full({len}, r + 1.0, dtype),
                 low = Tensor::full({len}, r + 1.0, dtype);
          comm.all_reduce(high, ReduceOp::max);
          comm.all_reduce(low, ReduceOp::min);
          // avg of 2r over ranks is n - 1; i32 has no avg, its sum is n(n - 1).
          const bool integral = dtype == DType::i32;
          Tensor pending = Tensor::full({len}, 2.0 * r, dtype);
          comm.iall_reduce(pending, integral ? ReduceOp::sum : ReduceOp::avg).wait();
          for (std::int64_t i = 0; i < len; ++i) {
            ASSERT_EQ(high.item(i), n) << "rank " << r << ", max of " << what << ", element " << i;
            ASSERT_EQ(low.item(i), 1) << "rank " << r << ", min of " << what << ", element " << i;
            ASSERT_EQ(pending.item(i), integral ? n * (n - 1.0) : n - 1.0)
                << "rank " << r << ", iall_reduce of " << what << ", element " << i;
          }
        }
      }
    });
  }
}

TEST(MpiBackend, NonBlockingAllReduceOverlapsPointToPoint) {
  launch(mpi_world(2), [](Comm& comm) {
    // 8 KB: more than the collective check carries, so MPI_Iallreduce moves it.
    Tensor x = Tensor::full({1000}, comm.rank() + 1.0, DType::f64),
           note = Tensor::zeros({1}, DType::f64);
    if (comm.rank() == 0) {
      Request pending = comm.iall_reduce(x, ReduceOp::avg);
      comm.send(note, 1);
      pending.wait();
    } else {
      Request pending = comm.iall_reduce(x, ReduceOp::avg);
      comm.recv(note, 0);
      pending.wait();
    }
    EXPECT_EQ(x.item(999), 1.5);
  });
}

TEST(MpiBackend, NonBlockingAllGatherAndReduceScatterOnUnevenLengths) {
  for (int n = 1; n <= 4; ++n) {
    launch(mpi_world(n), [n](Comm& comm) {
      const int r = comm.rank();
      for (std::int64_t len : {std::int64_t{3}, std::int64_t{23}}) {
        ChunkRange mine = chunk_range(len, n, r);
        Tensor shard = testing::pattern_tensor(0, len).slice(mine.offset, mine.length).clone();
        Tensor full = Tensor::zeros({len}, DType::f64);
        Tensor contribution = testing::pattern_tensor(r, len),
               summed = Tensor::zeros({mine.length}, DType::f64);
        Tensor half_in = Tensor::full({len}, r + 1.0, DType::bf16),
               half_out = Tensor::zeros({mine.length}, DType::bf16);
        Tensor norm = Tensor::full({1}, r + 1.0, DType::f64);
        comm.reset_stats();
        Request g = comm.iall_gather(shard, full);
        Request s = comm.ireduce_scatter(contribution, summed);
        comm.all_reduce(norm);  // a blocking collective while both are in flight
        Request h = comm.ireduce_scatter(half_in, half_out, ReduceOp::avg);
        h.wait();
        s.wait();
        g.wait();
        EXPECT_EQ(norm.item(0), n * (n + 1) / 2.0);
        EXPECT_TRUE(testing::values_equal("iall_gather", r, testing::pattern_values(0, len),
                                          full.to_vector(), n));
        std::vector<double> sum = testing::pattern_sum(n, len);
        EXPECT_TRUE(testing::values_equal(
            "ireduce_scatter", r,
            std::vector<double>(sum.begin() + mine.offset, sum.begin() + mine.offset + mine.length),
            summed.to_vector()));
        for (std::int64_t i = 0; i < mine.length; ++i) EXPECT_EQ(half_out.item(i), (n + 1) / 2.0);
        EXPECT_TRUE(testing::values_equal("ireduce_scatter's input afterwards", r,
                                          testing::pattern_values(r, len),
                                          contribution.to_vector()));
        // Counted as the blocking ones are.
        CommStats stats = comm.stats();
        EXPECT_EQ(stats.collective_calls["all_gather"], 1);
        EXPECT_EQ(stats.collective_calls["reduce_scatter"], 2);
        EXPECT_EQ(stats.collective_bytes,
                  static_cast<std::int64_t>(full.nbytes() + contribution.nbytes() +
                                            half_in.nbytes() + norm.nbytes()));
      }
    });
  }
}

TEST(MpiBackend, NonBlockingShardedCollectivesOverlapPointToPoint) {
  launch(mpi_world(2), [](Comm& comm) {
    const int r = comm.rank();
    Tensor shard = Tensor::full({4}, r + 1.0, DType::f64), full = Tensor::zeros({8}, DType::f64);
    Tensor grads = Tensor::full({8}, r + 1.0, DType::f64), mine = Tensor::zeros({4}, DType::f64);
    Tensor note = Tensor::zeros({1}, DType::f64);
    Request g = comm.iall_gather(shard, full);
    Request s = comm.ireduce_scatter(grads, mine);
    if (r == 0)
      comm.send(note, 1);
    else
      comm.recv(note, 0);
    g.wait();
    s.wait();
    EXPECT_EQ(full.item(7), 2.0);
    EXPECT_EQ(mine.item(0), 3.0);
  });
}

TEST(MpiBackend, SplitMakesOrderedSubgroups) {
  launch(mpi_world(4), [](Comm& comm) {
    Comm sub = comm.split(comm.rank() % 2, -comm.rank());
    EXPECT_EQ(sub.size(), 2);
    EXPECT_EQ(sub.rank(), comm.rank() < 2 ? 1 : 0);
    Tensor x = Tensor::full({1}, comm.rank(), DType::f64);
    sub.all_reduce(x);
    EXPECT_EQ(x.item(0), comm.rank() % 2 == 0 ? 2 : 4);
    if (sub.rank() == 0) sub.send(x, 1, 9);
    if (sub.rank() == 1) sub.recv(x, 0, 9);
  });
}

TEST(MpiBackend, NativeHandleIsTheMpiCommunicator) {
  launch(mpi_world(4), [](Comm& comm) {
    auto* native = static_cast<MPI_Comm*>(comm.native_handle());
    ASSERT_NE(native, nullptr);
    int size = 0;
    MPI_Comm_size(*native, &size);
    EXPECT_EQ(size, 4);
  });
}

TEST(MpiDiagnostics, MismatchedCollectivesNameEveryRanksCall) {
  auto failure = launch_failure(mpi_world(4), [](Comm& comm) {
    Tensor x = Tensor::zeros({comm.rank() == 2 ? 20 : 10});
    comm.all_reduce(x);
  });
  if (!failure) return;
  expect_contains(failure->what(), "collective mismatch");
  expect_contains(failure->what(), "rank 1: all_reduce(10 x f32, sum)");
  expect_contains(failure->what(), "rank 2: all_reduce(20 x f32, sum)");
}

TEST(MpiDiagnostics, ASmallAllReduceAgainstALargeBroadcastIsAMismatchToo) {
  // One rank's data rides with the check, the other's would not: the check's
  // packet is the same size on every rank, so the mismatch is still caught.
  auto failure = launch_failure(mpi_world(2), [](Comm& comm) {
    if (comm.rank() == 0) {
      Tensor small = Tensor::zeros({10});
      comm.all_reduce(small);
    } else {
      Tensor large = Tensor::zeros({5000}, DType::f64);
      comm.broadcast(large, 1);
    }
  });
  if (!failure) return;
  expect_contains(failure->what(), "rank 0: all_reduce(10 x f32, sum)");
  expect_contains(failure->what(), "rank 1: broadcast(5000 x f64, root 1)");
}

TEST(MpiDiagnostics, RecvOfTheWrongSizeIsAMismatch) {
  auto failure = launch_failure(mpi_world(2), [](Comm& comm) {
    if (comm.rank() == 0) comm.send(Tensor::zeros({5}, DType::f64), 1);
    if (comm.rank() == 1) {
      Tensor x = Tensor::zeros({4}, DType::f64);
      comm.recv(x, 0);
    }
  });
  if (!failure) return;
  EXPECT_EQ(failure->rank(), 1);
  expect_contains(failure->what(), "expected 4 x f64 but the message holds 5 x f64");
}

TEST(MpiDiagnostics, AnExceptionInOneRankUnwindsEveryRankAndNamesIt) {
  auto failure = launch_failure(mpi_world(4), [](Comm& comm) {
    if (comm.rank() == 2) throw std::runtime_error("boom in the backward pass");
    Tensor x = Tensor::zeros({4});
    comm.recv(x, 2);  // would wait forever without the failure notice
  });
  if (!failure) return;
  EXPECT_EQ(failure->rank(), 2);
  EXPECT_EQ(std::string(failure->what()), "rank 2: boom in the backward pass");
}

TEST(MpiDiagnostics, MessagesLeftInASubCommunicatorFailTheRunToo) {
  int me = -1;
  auto failure = launch_failure(mpi_world(4), [&](Comm& comm) {
    me = comm.rank();
    Comm pairs = comm.split(comm.rank() / 2, comm.rank());
    if (comm.rank() == 2) pairs.send(Tensor::zeros({3}, DType::f64), 1, 7);
  });
  if (!failure) return;
  // Ranks are the sub-communicator's: world rank 2 is rank 0 of its pair.
  if (me == 3) expect_contains(failure->what(), "rank 0 -> rank 1, tag 7: 3 x f64");
  expect_contains(failure->what(), "never received");
}

TEST(MpiDiagnostics, MessagesNobodyReceivedFailTheRun) {
  int me = -1;
  auto failure = launch_failure(mpi_world(2), [&](Comm& comm) {
    me = comm.rank();
    if (comm.rank() == 0) comm.send(Tensor::zeros({2}, DType::i32), 1, 4);
  });
  if (!failure) return;
  if (me == 1) expect_contains(failure->what(), "rank 0 -> rank 1, tag 4: 2 x i32");
  expect_contains(failure->what(), "never received");
}

}  // namespace
}  // namespace dtp
