// The sequence-parallel attention numbers of dtp-bench-sequence-expert
// (parts 1 and 2): the reference's Ulysses, ring, zigzag and hybrid, and the
// single-device peer, run forward and backward on every rank's shards, with
// each rank's times, memory and communication counters collected. What the
// numbers mean, and the printing and JSON, are in bench/sequence_expert/
// (attention.cpp and tiers.cpp).
#pragma once

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "06_sequence_expert/sequence_expert.h"
#include "dtp/launch.h"
#include "dtp/memory.h"
#include "link_tiers.h"

namespace dtp::bench::sp {

using dtp::Tensor;
using dtp::ch06::PositionRange;
using dtp::ch06::SequenceLayout;

inline double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

inline double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// --- the methods ---------------------------------------------------------------------

enum class Method { flash, ulysses, ring, zigzag, hybrid };

inline const char* method_name(Method m) {
  switch (m) {
    case Method::flash:
      return "flash";
    case Method::ulysses:
      return "ulysses";
    case Method::ring:
      return "ring";
    case Method::zigzag:
      return "zigzag";
    case Method::hybrid:
      return "hybrid";
  }
  return "?";
}

inline Method parse_method(const std::string& name) {
  for (Method m : {Method::flash, Method::ulysses, Method::ring, Method::zigzag, Method::hybrid})
    if (name == method_name(m)) return m;
  throw std::invalid_argument("unknown method '" + name +
                              "' (flash, ulysses, ring, zigzag, hybrid)");
}

struct Dims {
  std::int64_t B = 1, T = 256, H = 8, D = 32;
  dtp::DType dtype = dtp::DType::f32;
  std::int64_t e() const { return static_cast<std::int64_t>(dtp::dtype_size(dtype)); }
  std::int64_t numel() const { return B * T * H * D; }
};

// One configuration: a method on n ranks (u: the hybrid's Ulysses group).
struct Case {
  Method method = Method::flash;
  int n = 1, u = 1;
  SequenceLayout layout() const {
    return method == Method::zigzag ? SequenceLayout::zigzag : SequenceLayout::contiguous;
  }
  std::string label() const {
    std::string s = std::string(method_name(method)) + " n=" + std::to_string(n);
    return method == Method::hybrid ? s + " u=" + std::to_string(u) : s;
  }
};

// Whether the reference can run the case on this shape, and why not.
inline std::string cannot_run(const Case& c, const Dims& d) {
  if (c.method == Method::flash && c.n != 1) return "flash is the one-rank peer";
  if (d.T % c.n != 0) return "T does not divide by n";
  if (c.method == Method::ulysses && d.H % c.n != 0) return "H does not divide by n";
  if (c.method == Method::zigzag && d.T % (2 * c.n) != 0) return "T does not divide by 2n";
  if (c.method == Method::hybrid && (c.n < 4 || c.n % c.u != 0 || d.H % c.u != 0))
    return "needs n >= 4, u | n, u | H";
  return "";
}

// Runs forward, then backward, of case @p c on this rank's shards; each part
// runs as around("forward" or "backward", part), which times it. Returns the
// output, dq, dk, dv and the bytes the method keeps between the two parts.
struct Pass {
  Tensor out, dq, dk, dv;
  std::int64_t saved_bytes = 0;
};

template <typename Around>
Pass run_pass(dtp::Comm& comm, const Case& c, const Tensor& q, const Tensor& k, const Tensor& v,
              const Tensor& dout, Around&& around) {
  dtp::MemoryTracker& tracker = *dtp::current_memory_tracker();
  Pass p;
  auto forward_then_backward = [&](auto&& forward, auto&& backward, std::int64_t kept_inputs) {
    const std::int64_t before = tracker.total_live();
    around("forward", [&] { p.out = forward(); });
    // Every rank past its forward: no message of it is still in flight (the
    // thread backend charges an eager send's copy to its sender until received).
    comm.barrier();
    p.saved_bytes =
        tracker.total_live() - before - static_cast<std::int64_t>(p.out.nbytes()) + kept_inputs;
    around("backward", [&] { backward(); });
  };
  const int H = static_cast<int>(q.size(2));
  switch (c.method) {
    case Method::flash: {
      Tensor row_max, row_sum;
      const dtp::Shape stats{q.size(0), q.size(2), q.size(1)};
      forward_then_backward(
          [&] {
            Tensor out =
                Tensor::empty(q.shape(), q.dtype(), q.device(), dtp::MemoryCategory::activations);
            row_max = Tensor::empty(stats, q.dtype(), q.device(), dtp::MemoryCategory::activations);
            row_sum = Tensor::empty(stats, q.dtype(), q.device(), dtp::MemoryCategory::activations);
            dtp::ops::flash_attention_forward(q, k, v, out, row_max, row_sum);
            return out;
          },
          [&] {
            p.dq = Tensor::empty(q.shape(), q.dtype(), q.device());
            p.dk = Tensor::empty(q.shape(), q.dtype(), q.device());
            p.dv = Tensor::empty(q.shape(), q.dtype(), q.device());
            dtp::ops::flash_attention_backward(q, k, v, p.out, row_max, row_sum, dout, p.dq, p.dk,
                                               p.dv);
            row_max = row_sum = Tensor();
          },
          // The peer keeps the caller's q, k, v and its output for the backward, not copies.
          static_cast<std::int64_t>(4 * q.nbytes()));
      break;
    }
    case Method::ulysses: {
      dtp::ch06::UlyssesAttention attention(comm, H);
      forward_then_backward([&] { return attention.forward(q, k, v); },
                            [&] { attention.backward(dout, p.dq, p.dk, p.dv); }, 0);
      break;
    }
    case Method::ring:
    case Method::zigzag: {
      dtp::ch06::RingAttention attention(comm, c.layout());
      forward_then_backward([&] { return attention.forward(q, k, v); },
                            [&] { attention.backward(dout, p.dq, p.dk, p.dv); }, 0);
      break;
    }
    case Method::hybrid: {
      dtp::ch06::HybridAttention attention(comm, c.u, H);
      forward_then_backward([&] { return attention.forward(q, k, v); },
                            [&] { attention.backward(dout, p.dq, p.dk, p.dv); }, 0);
      break;
    }
  }
  return p;
}

// --- part 1: time and memory per rank ---------------------------------------------

// The whole sequence, and the peer's answers (filled by the flash case).
struct Problem {
  Dims d;
  Tensor q, k, v, dout;
  Tensor out, dq, dk, dv;
};

inline Problem make_problem(const Dims& d, std::uint64_t seed) {
  Problem p;
  p.d = d;
  const dtp::Shape shape{d.B, d.T, d.H, d.D};
  p.q = Tensor::random_uniform(shape, seed, -1, 1, d.dtype);
  p.k = Tensor::random_uniform(shape, seed + 1, -1, 1, d.dtype);
  p.v = Tensor::random_uniform(shape, seed + 2, -1, 1, d.dtype);
  p.dout = Tensor::random_uniform(shape, seed + 3, -1, 1, d.dtype);
  return p;
}

inline double max_abs_difference(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.to_vector(), y = b.to_vector();
  if (x.size() != y.size()) return INFINITY;
  double worst = 0;
  for (std::size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::abs(x[i] - y[i]));
  return worst;
}

struct RankNumbers {
  std::vector<double> forward_s, backward_s,
      cpu_s;  // one per timed round (cpu: forward + backward)
  std::int64_t blocks = 0, peak_bytes = 0, saved_bytes = 0, input_bytes = 0, comm_peak_bytes = 0;
  double max_abs_error = 0;
};

// One round of case @p c: launch, warm-up passes, one timed pass. The flash
// case stores its results in @p problem as the reference for the others.
inline std::vector<RankNumbers> run_attention_round(const Case& c, Problem& problem, int warmup) {
  std::vector<RankNumbers> ranks(static_cast<std::size_t>(c.n));
  dtp::launch(dtp::World::from_env(c.n), [&](dtp::Comm& comm) {
    const int r = comm.rank();
    const std::vector<PositionRange> mine =
        dtp::ch06::positions_of(problem.d.T, c.n, r, c.layout());
    const Tensor q = dtp::ch06::take_positions(problem.q, mine),
                 k = dtp::ch06::take_positions(problem.k, mine),
                 v = dtp::ch06::take_positions(problem.v, mine),
                 dout = dtp::ch06::take_positions(problem.dout, mine);
    dtp::MemoryTracker& tracker = *dtp::current_memory_tracker();
    RankNumbers& out = ranks[static_cast<std::size_t>(r)];
    out.input_bytes = static_cast<std::int64_t>(4 * q.nbytes());
    Pass pass;
    for (int round = 0; round <= warmup; ++round) {
      const bool timed = round == warmup;
      double cpu = 0;
      pass = Pass{};  // the last round's tensors must not count in this round's peak
      comm.barrier();
      tracker.reset_peaks();
      dtp::ch06::reset_block_computations();
      pass = run_pass(comm, c, q, k, v, dout, [&](const char* part, auto&& body) {
        comm.barrier();
        const double wall0 = wall_seconds(), cpu0 = thread_cpu_seconds();
        body();
        const double wall = wall_seconds() - wall0;
        cpu += thread_cpu_seconds() - cpu0;
        if (timed)
          (std::string(part) == "forward" ? out.forward_s : out.backward_s).push_back(wall);
      });
      if (timed) {
        out.cpu_s.push_back(cpu);
        out.blocks = dtp::ch06::block_computations();
        out.peak_bytes = tracker.total_peak();
        out.comm_peak_bytes = tracker.peak(dtp::MemoryCategory::comm);
        out.saved_bytes = pass.saved_bytes;
      }
    }
    if (c.method == Method::flash) {
      problem.out = pass.out, problem.dq = pass.dq, problem.dk = pass.dk, problem.dv = pass.dv;
      return;
    }
    if (!problem.out.defined()) {  // no peer in this run: no error to report
      out.max_abs_error = NAN;
      return;
    }
    double worst = 0;
    for (auto [mine_t, whole] :
         {std::pair{&pass.out, &problem.out}, std::pair{&pass.dq, &problem.dq},
          std::pair{&pass.dk, &problem.dk}, std::pair{&pass.dv, &problem.dv}})
      worst = std::max(worst, max_abs_difference(*mine_t, dtp::ch06::take_positions(*whole, mine)));
    out.max_abs_error = worst;
  });
  return ranks;
}

// The share of the causal scores the busiest rank computes (README section 4).
inline double busiest_share(const Case& c) {
  const double n = c.n;
  switch (c.method) {
    case Method::flash:
      return 1.0;
    case Method::ulysses:
    case Method::zigzag:
      return 1.0 / n;
    case Method::ring:
      return (2 * n - 1) / (n * n);
    case Method::hybrid: {
      const double groups = static_cast<double>(c.n / c.u);
      return (2 * groups - 1) / (groups * groups) / c.u;
    }
  }
  return 1.0;
}

// README sections 2 and 3: q, k, v, output and two statistics, this rank's share.
inline std::int64_t formula_saved_bytes(const Dims& d, int n) {
  return (4 * d.B * (d.T / n) * d.H * d.D + 2 * d.B * d.H * (d.T / n)) * d.e();
}

// --- part 2: bytes and the clock -----------------------------------------------------

using Tier = dtp::bench::Tier;  // link_tiers.h

// One clock unit: attend_block's charge of 1 per block becomes 1 fs.
constexpr double kClockUnit = 1e-15;

// Section 6's formulas, in seconds; S = local bytes of one q, u = Ulysses group, g = ring length.
struct CommFormula {
  double forward_s = 0, backward_s = 0, forward_bytes = 0, backward_bytes = 0;
};

inline CommFormula comm_formula(const Case& c, double S, const Tier& t) {
  const double a = t.alpha_s, b = 1.0 / t.bandwidth_Bps;
  auto all_to_alls = [&](int g) { return g > 1 ? 4 * ((g - 1) * a + (g - 1.0) / g * S * b) : 0.0; };
  auto a2a_bytes = [&](int g) { return 4 * (g - 1.0) / g * S; };
  auto ring_forward = [&](int g) { return (g - 1) * (a + 2 * S * b); };
  auto ring_backward = [&](int g) {
    return g > 1 ? (g - 1) * (a + 4 * S * b) + a + 2 * S * b : 0.0;
  };
  auto ring_backward_bytes = [&](int g) { return g > 1 ? (4.0 * g - 2) * S : 0.0; };
  const int u = c.method == Method::ulysses ? c.n : (c.method == Method::hybrid ? c.u : 1);
  const int g = c.n / u;
  return {all_to_alls(u) + ring_forward(g), all_to_alls(u) + ring_backward(g),
          a2a_bytes(u) + 2.0 * (g - 1) * S, a2a_bytes(u) + ring_backward_bytes(g)};
}

struct CommNumbers {
  double clock_forward = 0, clock_total = 0;  // in clock units
  std::int64_t p2p_forward = 0, p2p_backward = 0, a2a_forward = 0, a2a_backward = 0;
  std::int64_t messages = 0, collectives = 0;
};

// The counters of every communicator the method used, summed.
inline CommNumbers counters(const std::vector<dtp::Comm*>& comms) {
  CommNumbers n;
  for (dtp::Comm* c : comms) {
    const dtp::CommStats s = c->stats();
    n.p2p_forward += s.bytes_sent;
    n.a2a_forward += s.collective_bytes;
    n.messages += s.messages_sent;
    n.collectives += s.total_collective_calls();
    n.clock_forward = s.clock;  // one clock per rank, shared by its communicators
  }
  return n;
}

inline std::vector<CommNumbers> run_tier_case(const Case& c, const Dims& d, const Tier& tier) {
  std::vector<CommNumbers> ranks(static_cast<std::size_t>(c.n));
  dtp::World world = dtp::World::from_env(c.n);
  world.cost = dtp::CostModel{tier.alpha_s / kClockUnit, 1.0 / tier.bandwidth_Bps / kClockUnit};
  dtp::launch(world, [&](dtp::Comm& comm) {
    const dtp::Shape local{d.B, d.T / c.n, d.H, d.D};
    const Tensor q = Tensor::zeros(local, d.dtype), k = Tensor::zeros(local, d.dtype),
                 v = Tensor::zeros(local, d.dtype), dout = Tensor::zeros(local, d.dtype);
    std::vector<dtp::Comm*> comms = {&comm};
    std::unique_ptr<dtp::ch06::HybridAttention> hybrid;
    std::unique_ptr<dtp::ch06::UlyssesAttention> ulysses;
    std::unique_ptr<dtp::ch06::RingAttention> ring;
    if (c.method == Method::hybrid) {
      hybrid = std::make_unique<dtp::ch06::HybridAttention>(comm, c.u, static_cast<int>(d.H));
      comms = {&hybrid->inner(), &hybrid->outer()};
    } else if (c.method == Method::ulysses) {
      ulysses = std::make_unique<dtp::ch06::UlyssesAttention>(comm, static_cast<int>(d.H));
    } else {
      ring = std::make_unique<dtp::ch06::RingAttention>(comm, c.layout());
    }
    for (dtp::Comm* x : comms) x->reset_stats();
    Tensor out, dq, dk, dv;
    out = hybrid    ? hybrid->forward(q, k, v)
          : ulysses ? ulysses->forward(q, k, v)
                    : ring->forward(q, k, v);
    const CommNumbers after_forward = counters(comms);
    if (hybrid)
      hybrid->backward(dout, dq, dk, dv);
    else if (ulysses)
      ulysses->backward(dout, dq, dk, dv);
    else
      ring->backward(dout, dq, dk, dv);
    const CommNumbers after_backward = counters(comms);
    CommNumbers& mine = ranks[static_cast<std::size_t>(comm.rank())];
    mine = after_forward;
    mine.clock_total = after_backward.clock_forward;
    mine.p2p_backward = after_backward.p2p_forward - after_forward.p2p_forward;
    mine.a2a_backward = after_backward.a2a_forward - after_forward.a2a_forward;
    mine.messages = after_backward.messages;
    mine.collectives = after_backward.collectives;
  });
  return ranks;
}

}  // namespace dtp::bench::sp
