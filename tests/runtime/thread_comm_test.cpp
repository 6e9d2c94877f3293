// The thread backend's point-to-point layer, library collectives, split and
// alpha-beta clock. These are the fast paths chapters 02+ stand on.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iterator>

#include "support/all_to_all_v_case.h"
#include "support/harness.h"

namespace dtp {
namespace {

using testing::pattern_sum;
using testing::pattern_tensor;
using testing::pattern_values;
using testing::run_ranks;
using testing::values_equal;

// Runs body on every world size 1..8 and collects one vector per rank.
using Results = std::vector<std::vector<double>>;

TEST(ThreadComm, SendRecvKeepsOrderPerSourceAndTag) {
  run_ranks(2, [](Comm& comm) {
    if (comm.rank() == 0) {
      for (int i = 0; i < 5; ++i) comm.send(Tensor::full({3}, i, DType::f64), 1, /*tag=*/i % 2);
    } else {
      // Tag 1 first: messages of other tags wait in the mailbox.
      for (int expected : {1, 3}) {
        Tensor x = Tensor::zeros({3}, DType::f64);
        comm.recv(x, 0, 1);
        EXPECT_EQ(x.item(2), expected);
      }
      for (int expected : {0, 2, 4}) {
        Tensor x = Tensor::zeros({3}, DType::f64);
        comm.recv(x, 0, 0);
        EXPECT_EQ(x.item(0), expected);
      }
    }
  });
}

TEST(ThreadComm, SendCopiesEagerlySoTheBufferCanBeReused) {
  run_ranks(2, [](Comm& comm) {
    Tensor x = Tensor::full({4}, 7, DType::f32);
    if (comm.rank() == 0) {
      comm.send(x, 1);
      x.fill(-1);  // must not change what rank 1 receives
      comm.send(x, 1);
    } else {
      comm.recv(x, 0);
      EXPECT_EQ(x.item(3), 7);
      comm.recv(x, 0);
      EXPECT_EQ(x.item(3), -1);
    }
  });
}

TEST(ThreadComm, IrecvCompletesInPostOrder) {
  run_ranks(2, [](Comm& comm) {
    if (comm.rank() == 0) {
      comm.send(Tensor::full({2}, 10, DType::i32), 1, 5);
      comm.send(Tensor::full({2}, 20, DType::i32), 1, 5);
    } else {
      Tensor a = Tensor::zeros({2}, DType::i32), b = Tensor::zeros({2}, DType::i32);
      Request first = comm.irecv(a, 0, 5);
      Request second = comm.irecv(b, 0, 5);
      EXPECT_FALSE(second.completed());
      second.wait();  // waiting out of order still matches in post order
      first.wait();
      EXPECT_TRUE(first.completed());
      EXPECT_EQ(a.item(0), 10);
      EXPECT_EQ(b.item(0), 20);
    }
  });
}

// On mpi and nccl an isend reads its buffer and an irecv writes it until
// wait(): receiving into bytes still being sent, or sending bytes still
// being received, is refused on every backend, naming the other transfer.
TEST(ThreadComm, ABufferStillBeingSentOrReceivedIsNotReused) {
  run_ranks(2, [](Comm& comm) {
    const int peer = 1 - comm.rank();
    Tensor buffer = Tensor::zeros({8}, DType::f64);
    std::vector<Tensor> halves = buffer.chunk(2);
    // Two halves of one allocation: sending one while receiving the other is fine.
    Request send = comm.isend(halves[0], peer, 3);
    Request receive = comm.irecv(halves[1], peer, 3);
    // The half still being sent is not.
    std::string message;
    try {
      Tensor overlapping = buffer.slice(2, 4);
      comm.irecv(overlapping, peer, 4);
    } catch (const Error& e) {
      message = e.what();
    }
    EXPECT_NE(message.find("writes into bytes that this rank's isend to rank " +
                           std::to_string(peer) + " (tag 3) is still sending"),
              std::string::npos)
        << message;
    // Nor is sending the half still being received.
    message.clear();
    try {
      comm.isend(halves[1], peer, 6);
    } catch (const Error& e) {
      message = e.what();
    }
    EXPECT_NE(message.find("sends bytes that this rank's irecv from rank " + std::to_string(peer) +
                           " (tag 3) has not finished writing"),
              std::string::npos)
        << message;
    receive.wait();
    send.wait();
    // Once the send's wait() returned, the buffer is free again.
    comm.send(halves[0], peer, 5);
    comm.recv(halves[0], peer, 5);
  });
}

TEST(ThreadComm, SendToSelfAndZeroElementMessages) {
  run_ranks(1, [](Comm& comm) {
    comm.send(Tensor::full({3}, 4, DType::f64), 0);
    Tensor x = Tensor::zeros({3}, DType::f64);
    comm.recv(x, 0);
    EXPECT_EQ(x.item(1), 4);
    Tensor empty = Tensor::zeros({0}, DType::f64);
    comm.send(empty, 0, 9);
    comm.recv(empty, 0, 9);
  });
}

// Library collectives on every world size and a length that does not divide.
class LibraryCollectives : public ::testing::TestWithParam<int> {};

TEST_P(LibraryCollectives, AllReduceEveryOp) {
  const int n = GetParam();
  const std::int64_t len = 37;
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min}) {
    Results got(n);
    run_ranks(n, [&](Comm& comm) {
      Tensor x = pattern_tensor(comm.rank(), len);
      comm.all_reduce(x, op);
      got[comm.rank()] = x.to_vector();
    });
    std::vector<double> expected = pattern_sum(n, len);
    if (op == ReduceOp::avg)
      for (double& v : expected) v /= n;
    if (op == ReduceOp::max) expected = pattern_values(n - 1, len);
    if (op == ReduceOp::min) expected = pattern_values(0, len);
    for (int r = 0; r < n; ++r)
      EXPECT_TRUE(
          values_equal(std::string("all_reduce ") + reduce_op_name(op), r, expected, got[r], n));
  }
}

TEST_P(LibraryCollectives, BroadcastAndReduceFromEveryRoot) {
  const int n = GetParam();
  const std::int64_t len = 11;
  for (int root = 0; root < n; ++root) {
    Results bcast(n), red(n);
    run_ranks(n, [&](Comm& comm) {
      Tensor x = pattern_tensor(comm.rank(), len);
      comm.broadcast(x, root);
      bcast[comm.rank()] = x.to_vector();
      Tensor y = pattern_tensor(comm.rank(), len);
      comm.reduce(y, root, ReduceOp::sum);
      red[comm.rank()] = y.to_vector();
    });
    for (int r = 0; r < n; ++r) {
      EXPECT_TRUE(values_equal("broadcast root " + std::to_string(root), r,
                               pattern_values(root, len), bcast[r]));
      EXPECT_TRUE(values_equal("reduce root " + std::to_string(root), r,
                               r == root ? pattern_sum(n, len) : pattern_values(r, len), red[r]));
    }
  }
}

TEST_P(LibraryCollectives, GatherScatterAllGatherReduceScatterAllToAll) {
  const int n = GetParam();
  for (std::int64_t len : {std::int64_t{1}, std::int64_t{n}, std::int64_t{23}}) {
    Results all_gathered(n), reduced(n), gathered(n), scattered(n), exchanged(n);
    run_ranks(n, [&](Comm& comm) {
      const int r = comm.rank();
      ChunkRange mine = chunk_range(len, n, r);
      Tensor full = Tensor::zeros({len}, DType::f64);
      // Rank r's shard holds chunk r of a pattern every rank knows (rank 0's).
      Tensor shard = pattern_tensor(0, len).slice(mine.offset, mine.length).clone();
      comm.all_gather(shard, full);
      all_gathered[r] = full.to_vector();

      Tensor out = Tensor::zeros({mine.length}, DType::f64);
      comm.reduce_scatter(pattern_tensor(r, len), out);
      reduced[r] = out.to_vector();

      Tensor root_full = Tensor::zeros({len}, DType::f64);
      comm.gather(shard, root_full, n - 1);
      gathered[r] = root_full.to_vector();

      Tensor piece = Tensor::zeros({mine.length}, DType::f64);
      comm.scatter(pattern_tensor(0, len), piece, 0);
      scattered[r] = piece.to_vector();

      Tensor in = pattern_tensor(r, 2 * n), got = Tensor::zeros({2 * n}, DType::f64);
      comm.all_to_all(in, got);
      exchanged[r] = got.to_vector();
    });
    std::vector<double> sum = pattern_sum(n, len);
    for (int r = 0; r < n; ++r) {
      ChunkRange mine = chunk_range(len, n, r);
      const std::vector<double> zero = pattern_values(0, len);
      std::vector<double> chunk_of_zero(zero.begin() + mine.offset,
                                        zero.begin() + mine.offset + mine.length);
      EXPECT_TRUE(values_equal("all_gather", r, pattern_values(0, len), all_gathered[r], n));
      EXPECT_TRUE(values_equal(
          "reduce_scatter", r,
          std::vector<double>(sum.begin() + mine.offset, sum.begin() + mine.offset + mine.length),
          reduced[r]));
      EXPECT_TRUE(values_equal("gather", r,
                               r == n - 1 ? pattern_values(0, len) : std::vector<double>(len, 0.0),
                               gathered[r]));
      EXPECT_TRUE(values_equal("scatter", r, chunk_of_zero, scattered[r]));
      std::vector<double> expected(2 * n);
      for (int i = 0; i < n; ++i)
        for (int k = 0; k < 2; ++k) expected[2 * i + k] = pattern_values(i, 2 * n)[2 * r + k];
      EXPECT_TRUE(values_equal("all_to_all", r, expected, exchanged[r], n));
    }
  }
}

TEST_P(LibraryCollectives, ClockChargesTheRingAlgorithm) {
  const int n = GetParam();
  const std::int64_t len = 120;
  std::vector<double> clocks(n);
  run_ranks(
      n,
      [&](Comm& comm) {
        comm.reset_stats();
        Tensor x = pattern_tensor(comm.rank(), len);
        comm.all_reduce(x);
        clocks[comm.rank()] = comm.stats().clock;
        EXPECT_EQ(comm.stats().collective_calls.at("all_reduce"), 1);
        EXPECT_EQ(comm.stats().collective_bytes, len * 8);
        EXPECT_EQ(comm.stats().messages_sent, 0);
      },
      CostModel::bytes());
  for (int r = 0; r < n; ++r)
    EXPECT_DOUBLE_EQ(clocks[r], 2.0 * (n - 1) / n * len * 8) << "rank " << r;
}

TEST_P(LibraryCollectives, AllToAllVMovesEveryBlockWithItsOwnCount) {
  const int n = GetParam();
  std::vector<double> clocks(n);
  run_ranks(
      n,
      [&](Comm& comm) {
        testing::AllToAllVCase exchange(comm.rank(), n);
        comm.reset_stats();
        comm.all_to_all_v(exchange.in, exchange.send_counts, exchange.out, exchange.recv_counts);
        EXPECT_TRUE(exchange.received_everything());
        EXPECT_EQ(comm.stats().collective_calls.at("all_to_all_v"), 1);
        EXPECT_EQ(comm.stats().total_collective_calls(), 1)
            << "the count check must not be counted";
        EXPECT_EQ(comm.stats().collective_bytes, exchange.in.numel() * 8);
        clocks[comm.rank()] = comm.stats().clock;
      },
      CostModel{1.0, 1.0});
  // The busiest rank's off-rank bytes, sent or received, plus n - 1 latencies.
  double busiest = 0;
  for (int r = 0; r < n; ++r) {
    double sent = 0, received = 0;
    for (int k = 0; k < n; ++k)
      if (k != r)
        sent += testing::AllToAllVCase::count(r, k),
            received += testing::AllToAllVCase::count(k, r);
    busiest = std::max({busiest, sent * 8, received * 8});
  }
  for (int r = 0; r < n; ++r) EXPECT_DOUBLE_EQ(clocks[r], (n - 1) + busiest) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, LibraryCollectives, ::testing::Range(1, 9),
                         [](const auto& info) { return "world" + std::to_string(info.param); });

TEST(ThreadComm, PointToPointClockFollowsAlphaBeta) {
  std::vector<double> clocks(3);
  run_ranks(
      3,
      [&](Comm& comm) {
        Tensor x = Tensor::zeros({10}, DType::f32);  // 40 bytes
        if (comm.rank() == 0) {
          comm.send(x, 1);
          comm.send(x, 2);  // sends from one rank are serialized on its clock
        } else {
          comm.recv(x, 0);
        }
        clocks[comm.rank()] = comm.stats().clock;
      },
      CostModel{1.0, 0.5});
  EXPECT_DOUBLE_EQ(clocks[0], 42.0);
  EXPECT_DOUBLE_EQ(clocks[1], 21.0);
  EXPECT_DOUBLE_EQ(clocks[2], 42.0);
}

TEST(ThreadComm, LinkPerPeerSendsToDifferentPeersTravelAtOnce) {
  std::vector<double> clocks(3);
  run_ranks(
      3,
      [&](Comm& comm) {
        Tensor x = Tensor::zeros({10}, DType::f32);  // 40 bytes: 21 per message
        if (comm.rank() == 0) {
          comm.send(x, 1);
          comm.send(x, 2);  // another link: leaves at once
          comm.send(x, 2);  // the same link: queues behind the previous message
        } else {
          comm.recv(x, 0);
          if (comm.rank() == 2) comm.recv(x, 0);
        }
        clocks[comm.rank()] = comm.stats().clock;
      },
      CostModel{1.0, 0.5}.with_link_per_peer());
  EXPECT_DOUBLE_EQ(clocks[0], 0.0) << "the sender's clock stays put under link_per_peer";
  EXPECT_DOUBLE_EQ(clocks[1], 21.0);
  EXPECT_DOUBLE_EQ(clocks[2], 42.0) << "two messages on one link arrive one after the other";
}

// Two tiers (CostModel::with_nodes): 4 ranks in nodes of 2, a send and
// a collective inside a node cost the inside link, the rest the outer one.
// Costs: outer alpha 1, beta 0.5; inside alpha 0.1, beta 0.01; 40 bytes.
TEST(ThreadComm, NodesChargeTheInsideLinkWithinANode) {
  std::vector<double> after_sends(4), at_end(4);
  run_ranks(
      4,
      [&](Comm& comm) {
        Tensor x = Tensor::zeros({10}, DType::f32);
        if (comm.rank() == 0) {
          comm.send(x, 1);  // inside node 0: 0.1 + 0.01 * 40 = 0.5
          comm.send(x, 2);  // across: 1 + 0.5 * 40 = 21
        } else if (comm.rank() != 3) {
          comm.recv(x, 0);
        }
        after_sends[comm.rank()] = comm.stats().clock;
        Comm node = comm.split(comm.rank() / 2, comm.rank());  // world: 2 rounds of 1
        node.all_reduce(x);  // inside: 2 (n-1) 0.1 + 2 (1/2) 40 0.01 = 0.6
        comm.all_reduce(x);  // outer: 2 (3) 1 + 2 (3/4) 40 0.5 = 36
        at_end[comm.rank()] = comm.stats().clock;
      },
      CostModel{1.0, 0.5}.with_nodes(2, 0.1, 0.01));
  const double sends[] = {21.5, 0.5, 21.5, 0.0};
  for (int r = 0; r < 4; ++r) {
    EXPECT_NEAR(after_sends[r], sends[r], 1e-12)
        << "rank " << r << ": 0 -> 1 stays inside node 0 (0.5), 0 -> 2 crosses (21)";
    EXPECT_NEAR(at_end[r], 21.5 + 2 + 0.6 + 36, 1e-12)
        << "rank " << r << ": split 2, the node's all-reduce 0.6 (inside), the world's 36";
  }
}

TEST(ThreadComm, NodesRefuseBadSizes) {
  EXPECT_THROW(CostModel{}.with_nodes(0, 1, 1), Error);
  EXPECT_THROW(CostModel{}.with_nodes(2, -1, 1), Error);
  const CostModel tiered = CostModel{1.0, 0.5}.with_nodes(2, 0.1, 0.01);
  EXPECT_EQ(tiered.for_group({2, 3}).alpha, 0.1);
  EXPECT_EQ(tiered.for_group({1, 2}).alpha, 1.0);
  EXPECT_EQ(tiered.for_group({1, 2}).ranks_per_node, 0);
}

// recv_any: whoever sent first is received first, each source's messages
// in the order it sent them, and the source is returned.
TEST(ThreadComm, RecvAnyReturnsTheSourceAndKeepsEachSourcesOrder) {
  std::vector<std::pair<int, double>> got;
  run_ranks(4, [&](Comm& comm) {
    Tensor x = Tensor::zeros({1}, DType::f64);
    if (comm.rank() != 0) {
      for (int k = 0; k < 2; ++k)
        comm.send(Tensor::full({1}, comm.rank() * 10 + k, DType::f64), 0, 5);
      return;
    }
    for (int m = 0; m < 6; ++m) {
      const int from = comm.recv_any(x, 5);
      got.push_back({from, x.item(0)});
    }
  });
  ASSERT_EQ(got.size(), 6u);
  std::vector<int> next(4, 0);
  for (const auto& [from, value] : got) {
    ASSERT_GE(from, 1);
    EXPECT_EQ(value, from * 10 + next[from]) << "source " << from << "'s messages out of order";
    ++next[from];
  }
  for (int r = 1; r < 4; ++r) EXPECT_EQ(next[r], 2) << "source " << r;
}

// recv_for gives up without receiving; the message sent later goes to the
// next receive; a rank waiting with a deadline is not part of a deadlock.
TEST(ThreadComm, RecvForGivesUpAndTheLateMessageStillArrives) {
  bool first = true, second = false;
  double waited = 0, late = 0;
  int any = 0;
  run_ranks(2, [&](Comm& comm) {
    Tensor x = Tensor::zeros({1}, DType::f64);
    if (comm.rank() == 1) {
      comm.barrier();
      comm.send(Tensor::full({1}, 7, DType::f64), 0, 3);
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    first = comm.recv_for(x, 1, 3, 0.05);  // rank 1 waits in the barrier
    any = comm.recv_any_for(x, 3, 0.0);
    waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    comm.barrier();
    second = comm.recv_for(x, 1, 3, 10.0);
    late = x.item(0);
  });
  EXPECT_FALSE(first) << "nothing was sent before the barrier";
  EXPECT_EQ(any, -1);
  EXPECT_GE(waited, 0.05);
  EXPECT_LT(waited, 5.0);
  EXPECT_TRUE(second);
  EXPECT_EQ(late, 7);
}

TEST(ThreadComm, RecvForRefusesBadSecondsAndSyncSends) {
  run_ranks(1, [](Comm& comm) {
    Tensor x = Tensor::zeros({1}, DType::f64);
    EXPECT_THROW(comm.recv_for(x, 0, 0, -1), Error);
    EXPECT_THROW(comm.recv_any_for(x, 0, std::nan("")), Error);
  });
  World world = World::from_env(1);
  world.send_mode = SendMode::sync;
  std::string message;
  try {
    launch(world, [](Comm& comm) {
      Tensor x = Tensor::zeros({1}, DType::f64);
      comm.recv_for(x, 0, 0, 0.01);
    });
  } catch (const std::exception& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("DTP_SEND=sync"), std::string::npos) << message;
}

// collective_cost (dtp/comm.h) is what the clock is charged: a planner that
// calls it predicts each collective exactly, inside a node and across.
TEST(ThreadComm, TheClockChargesCollectiveCost) {
  const CostModel cost = CostModel{1e-5, 1e-9}.with_nodes(2, 1e-6, 1e-11);
  std::vector<double> clocks(4);
  run_ranks(
      4,
      [&](Comm& comm) {
        Comm node = comm.split(comm.rank() / 2, comm.rank());
        const double split = comm.stats().clock;
        Tensor x = Tensor::zeros({1000}, DType::f64);  // 8000 bytes
        comm.all_reduce(x);
        Tensor shard = Tensor::zeros({250}, DType::f64);
        comm.all_gather(shard, x);
        Tensor half = Tensor::zeros({500}, DType::f64);
        node.reduce_scatter(x, half);
        clocks[comm.rank()] = comm.stats().clock - split;
      },
      cost);
  const CostModel outer = cost.for_group({0, 1, 2, 3}), inside = cost.for_group({0, 1});
  const double want = collective_cost("all_reduce", 8000, 4, outer) +
                      collective_cost("all_gather", 8000, 4, outer) +
                      collective_cost("reduce_scatter", 8000, 2, inside);
  for (int r = 0; r < 4; ++r) EXPECT_NEAR(clocks[r], want, 1e-15) << "rank " << r;
}

TEST(ThreadComm, ResetStatsForgetsTheLinks) {
  std::vector<double> clocks(2);
  run_ranks(
      2,
      [&](Comm& comm) {
        Tensor x = Tensor::zeros({1}, DType::f64);
        for (int round = 0; round < 2; ++round) {
          comm.reset_stats();
          if (comm.rank() == 0) {
            comm.send(x, 1);
            comm.send(x, 1);
          } else {
            comm.recv(x, 0);
            comm.recv(x, 0);
          }
          comm.barrier();
        }
        clocks[comm.rank()] = comm.stats().clock;
      },
      CostModel{1.0, 0.0}.with_link_per_peer());
  // Measured from the last reset: 2 messages on one link (and a barrier of
  // ceil(log2 2) = 1 round), not 4 carried over from the first round.
  EXPECT_DOUBLE_EQ(clocks[1], 3.0);
}

TEST(ThreadComm, SplitMakesOrderedSubgroups) {
  const int n = 6;
  std::vector<std::pair<int, int>> placement(n);
  std::vector<double> sums(n);
  run_ranks(n, [&](Comm& comm) {
    // Two groups by parity; keys reverse the order inside each group.
    Comm sub = comm.split(comm.rank() % 2, -comm.rank());
    placement[comm.rank()] = {sub.rank(), sub.size()};
    Tensor x = Tensor::full({1}, comm.rank(), DType::f64);
    sub.all_reduce(x);
    sums[comm.rank()] = x.item(0);
    // Point to point inside the subgroup uses subgroup ranks.
    if (sub.rank() == 0) sub.send(x, 1, 3);
    if (sub.rank() == 1) sub.recv(x, 0, 3);
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(placement[r].second, 3) << "rank " << r;
    EXPECT_EQ(placement[r].first, 2 - r / 2) << "rank " << r;
    EXPECT_EQ(sums[r], r % 2 == 0 ? 0 + 2 + 4 : 1 + 3 + 5) << "rank " << r;
  }
}

TEST(ThreadComm, EveryRankHasItsOwnMemoryTracker) {
  std::vector<std::int64_t> peaks(3);
  run_ranks(3, [&](Comm& comm) {
    Tensor x = Tensor::zeros({100 * (comm.rank() + 1)}, DType::f32, Device::cpu(),
                             MemoryCategory::activations);
    peaks[comm.rank()] = current_memory_tracker()->peak(MemoryCategory::activations);
  });
  EXPECT_EQ(peaks, (std::vector<std::int64_t>{400, 800, 1200}));
}

TEST(Trace, SpansPerRankAsChromeJson) {
  trace::enable();
  run_ranks(2, [](Comm& comm) {
    trace::Scope step("step", "compute");
    Tensor x = Tensor::zeros({4}, DType::f32);
    comm.all_reduce(x);
  });
  trace::disable();
  std::vector<trace::Span> spans = trace::spans();
  int steps = 0, reduces = 0;
  for (const auto& s : spans) {
    steps += s.name == "step";
    reduces += s.name == "all_reduce" && s.category == "comm";
    EXPECT_LE(s.start_us, s.end_us);
  }
  EXPECT_EQ(steps, 2);
  EXPECT_EQ(reduces, 2);
  std::string path = ::testing::TempDir() + "dtp_trace_test.json";
  trace::write_chrome_json(path);
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("\"traceEvents\""), std::string::npos);
  EXPECT_NE(text.find("\"name\":\"all_reduce\""), std::string::npos);
  EXPECT_NE(text.find("\"pid\":1,\"tid\":0"), std::string::npos) << "rank 1 is process 1";
}

}  // namespace
}  // namespace dtp
