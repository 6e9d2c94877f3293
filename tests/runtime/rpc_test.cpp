// The request/response layer (dtp/rpc.h) on rank threads: a server that
// answers whoever asks first, payloads of any size, an unknown method
// refused by name, and a call that gets no answer in time.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "dtp/dtp.h"
#include "dtp/rpc.h"
#include "support/harness.h"

namespace dtp {
namespace {

const std::vector<std::string> kMethods = {"pull", "push"};
enum Method { kPull = 0, kPush = 1 };

// Ranks 1..3 push a payload of rank + 1 values under their own key, then
// pull it back; rank 0 stores what is pushed and answers pulls, six
// requests in whatever order they come.
TEST(Rpc, TheServerAnswersWhoeverAsksFirst) {
  std::vector<std::vector<double>> pulled(4);
  std::vector<std::int64_t> versions(4, -1);
  std::vector<std::int64_t> received;
  testing::run_ranks(4, [&](Comm& comm) {
    if (comm.rank() == 0) {
      rpc::Server server(comm, kMethods, DType::f64);
      std::map<std::int64_t, Tensor> store;
      for (int served = 0; served < 6; ++served) {
        const std::optional<rpc::Request> request = server.next(10.0);
        ASSERT_TRUE(request.has_value()) << "request " << served << " did not come";
        if (request->method == kPush) {
          store[request->key] = request->payload.clone();
          server.reply(*request, Tensor(), request->version + 1);
        } else {
          server.reply(*request, store.at(request->key), 100 + request->key);
        }
      }
      received = server.received();
      return;
    }
    rpc::Client client(comm, 0, kMethods, DType::f64, 10.0);
    std::vector<double> mine(static_cast<std::size_t>(comm.rank() + 1), comm.rank() * 1.5);
    const rpc::Response pushed =
        client.call(kPush, comm.rank(), 7, Tensor::from_values(mine, DType::f64, comm.device()));
    EXPECT_EQ(pushed.status, rpc::Status::ok);
    EXPECT_EQ(pushed.version, 8);
    EXPECT_FALSE(pushed.payload.defined());
    const rpc::Response back = client.call(kPull, comm.rank(), 0, Tensor());
    pulled[static_cast<std::size_t>(comm.rank())] = back.payload.to_vector();
    versions[static_cast<std::size_t>(comm.rank())] = back.version;
  });
  for (int r = 1; r < 4; ++r) {
    EXPECT_EQ(pulled[r], std::vector<double>(static_cast<std::size_t>(r + 1), r * 1.5))
        << "rank " << r;
    EXPECT_EQ(versions[r], 100 + r);
  }
  EXPECT_EQ(received, (std::vector<std::int64_t>{3, 3}));
}

TEST(Rpc, AnUnknownMethodIsRefusedByName) {
  std::string message;
  std::int64_t unknown = 0;
  testing::run_ranks(2, [&](Comm& comm) {
    if (comm.rank() == 0) {
      rpc::Server server(comm, kMethods, DType::f64);
      const std::optional<rpc::Request> request = server.next(10.0);  // after the bad one
      ASSERT_TRUE(request.has_value());
      EXPECT_EQ(request->method, kPull);
      server.reply(*request, Tensor(), 0);
      unknown = server.unknown();
      return;
    }
    rpc::Client client(comm, 0, {"pull", "push", "evict"}, DType::f64, 10.0);
    try {
      client.call(2, 5, 0, Tensor());
    } catch (const Error& e) {
      message = e.what();
    }
    client.call(kPull, 0, 0, Tensor());
  });
  EXPECT_NE(message.find("server rank 0 does not serve evict (number 2)"), std::string::npos)
      << message;
  EXPECT_EQ(unknown, 1);
}

// The server answers only after the client gave up; the late answer is
// dropped by the client's next call, which gets its own.
TEST(Rpc, ACallWithoutAnAnswerTimesOutAndItsLateAnswerIsDropped) {
  std::string message;
  std::int64_t second = -1;
  bool idle = true;
  testing::run_ranks(2, [&](Comm& comm) {
    if (comm.rank() == 0) {
      rpc::Server server(comm, kMethods, DType::f64);
      idle = server.next(0.02).has_value();  // nothing yet: the client waits at the barrier
      comm.barrier();
      const std::optional<rpc::Request> first = server.next(10.0);
      comm.barrier();  // the client has timed out
      server.reply(*first, Tensor(), 1);
      const std::optional<rpc::Request> next = server.next(10.0);
      server.reply(*next, Tensor(), 2);
      return;
    }
    rpc::Client client(comm, 0, kMethods, DType::f64, 0.5);
    comm.barrier();
    try {
      client.call(kPull, 3, 0, Tensor());
    } catch (const rpc::Timeout& e) {
      message = e.what();
    }
    comm.barrier();
    second = client.call(kPull, 4, 0, Tensor()).version;
  });
  EXPECT_FALSE(idle) << "next(0.02) with no request must return nothing";
  EXPECT_NE(message.find("rank 1 called pull(key 3) on server rank 0 and got no answer in 0.5 s"),
            std::string::npos)
      << message;
  EXPECT_EQ(second, 2) << "the second call must get its own answer, not the first's late one";
}

TEST(Rpc, BadArgumentsAreRefused) {
  testing::run_ranks(2, [](Comm& comm) {
    EXPECT_THROW(rpc::Server(comm, {}, DType::f64), Error);
    EXPECT_THROW(rpc::Client(comm, comm.rank(), kMethods, DType::f64, 1.0), Error);
    EXPECT_THROW(rpc::Client(comm, 5, kMethods, DType::f64, 1.0), Error);
    EXPECT_THROW(rpc::Client(comm, 1 - comm.rank(), kMethods, DType::f64, 0.0), Error);
  });
}

}  // namespace
}  // namespace dtp
