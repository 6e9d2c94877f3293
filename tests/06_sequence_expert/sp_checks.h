// What the chapter 06 attention checkers share: random q, k, v for a whole
// sequence, single-device causal attention and its gradients (the runtime's
// naive attention, not the code under test), each rank's rows worked out
// here from the layout rules (not read from positions_of), and a comparison
// that names rank, tensor, batch row, global position, head and channel, and
// says which mistake a wrong result looks like.
//
// Where they run: the puzzle gets its shards on the rank's device
// (comm.device()) in checker_dtype() (support/checker_precision.h): f64 on
// the CPU, f32 under DTP_CHECK_DTYPE=f32 and on a GPU. The inputs are drawn
// in f64 and rounded to that dtype, and the single-device answers are worked
// out in f64 on the host from the rounded values: the exact answer for the
// inputs the puzzle gets, in either dtype. In f32 only the puzzle's own
// arithmetic rounds; attention_tolerance() says by how much. Placements,
// block counts, messages and bytes (of the dtype's element size) are exact
// in both dtypes.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "06_sequence_expert/sequence_expert.h"
#include "support/checker_precision.h"
#include "support/training.h"

namespace dtp::testing::ch06 {

using namespace dtp::ch06;

// The shape of one attention case: B sequences of T positions, H heads of D.
struct Dims {
  std::int64_t B = 2, T = 24, H = 12, D = 2;
  std::int64_t numel() const { return B * T * H * D; }
  std::int64_t row() const { return H * D; }  // elements of one position
};

// The positions rank r of n holds, by the chapter's rules, as (start, length) pairs.
inline std::vector<std::pair<std::int64_t, std::int64_t>> rows_of_rank(std::int64_t T, int n, int r,
                                                                       bool zigzag) {
  if (!zigzag) return {{r * (T / n), T / n}};
  const std::int64_t c = T / (2 * n);
  return {{r * c, c}, {(2 * n - 1 - r) * c, c}};
}

// The rows of `ranges` of a whole [B, T, row] tensor, concatenated per batch row.
inline std::vector<double> shard_of(
    const std::vector<double>& full, const Dims& d,
    const std::vector<std::pair<std::int64_t, std::int64_t>>& ranges) {
  std::vector<double> out;
  for (std::int64_t b = 0; b < d.B; ++b)
    for (const auto& [start, length] : ranges)
      out.insert(out.end(), full.begin() + (b * d.T + start) * d.row(),
                 full.begin() + (b * d.T + start + length) * d.row());
  return out;
}

// Attention over a whole sequence on the host, with any visibility rule: the
// checker's own arithmetic, for the "your result looks like ..." decodes.
inline std::vector<double> host_attention(
    const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v,
    const Dims& d, const std::function<bool(std::int64_t, std::int64_t)>& visible) {
  std::vector<double> out(static_cast<std::size_t>(d.numel()), 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d.D));
  auto at = [&](std::int64_t b, std::int64_t t, std::int64_t h) {
    return ((b * d.T + t) * d.H + h) * d.D;
  };
  for (std::int64_t b = 0; b < d.B; ++b)
    for (std::int64_t h = 0; h < d.H; ++h)
      for (std::int64_t i = 0; i < d.T; ++i) {
        std::vector<double> w(static_cast<std::size_t>(d.T), 0.0);
        double top = -INFINITY, sum = 0;
        for (std::int64_t j = 0; j < d.T; ++j) {
          if (!visible(i, j)) continue;
          double s = 0;
          for (std::int64_t c = 0; c < d.D; ++c) s += q[at(b, i, h) + c] * k[at(b, j, h) + c];
          w[j] = s * scale;
          top = std::max(top, w[j]);
        }
        if (top == -INFINITY) continue;
        for (std::int64_t j = 0; j < d.T; ++j) {
          w[j] = visible(i, j) ? std::exp(w[j] - top) : 0.0;
          sum += w[j];
        }
        for (std::int64_t j = 0; j < d.T; ++j)
          for (std::int64_t c = 0; c < d.D; ++c)
            out[at(b, i, h) + c] += w[j] / sum * v[at(b, j, h) + c];
      }
  return out;
}

// How near the puzzle's attention output and gradients must be to the
// exact single-device answer. In f64 the online softmax and the ring's
// merges round in another order than the naive attention, a few ulps of
// 2^-53. In f32 a value sums up to T = 48 terms (softmax weights times
// values; backward, products of values up to ~2), each off by a few
// roundings, the score's included (D <= 4 products, which exp() turns into
// a relative error of the weight): ~150 roundings of 2^-24 (6e-8) x a
// magnitude up to ~1 is 1e-5, absolute and relative. Measured at most
// 5.8e-7 (dv of magnitude 1.1; Ulysses, ring, zigzag and hybrid, every
// degree). The mistakes the messages decode are off by 1e-2 or more (a block
// lost, a mask wrong, another rank's rows).
inline Closeness attention_tolerance(DType dtype) {
  return tolerance(dtype, {1e-10, 1e-9}, {1e-5, 1e-5});
}

// " (f32, tolerance ...)" after a failure in f32, where the tolerance is
// worth reading; "" in f64, whose tolerance is far below any mistake.
inline std::string tolerance_note(DType dtype, const Closeness& within) {
  if (dtype == DType::f64) return "";
  return std::string(" (") + dtype_name(dtype) + ", tolerance " + within.str() + ")";
}

// The bytes of one element of the checker's dtype on @p rank's device: what
// a message or collective moves per value.
inline std::int64_t element_bytes(const Comm& rank) {
  return static_cast<std::int64_t>(dtype_size(checker_dtype(rank.device())));
}

// One attention problem and its single-device answer: the runtime's naive
// attention in f64 on the host, from the inputs rounded to the case's dtype.
struct Case {
  Dims d;
  DType dtype = DType::f64;             // what the puzzle computes in
  Tensor q, k, v, dout;                 // whole sequence [B, T, H, D], f64 on the host
  std::vector<double> out, dq, dk, dv;  // single-device results
  std::vector<double> qv, kv, vv;       // the inputs as vectors
};

// Uniform values in [low, high), rounded to @p dtype, as an f64 host tensor.
inline Tensor random_in(const Shape& shape, std::uint64_t seed, double low, double high,
                        DType dtype) {
  const Tensor drawn = Tensor::random_uniform(shape, seed, low, high, DType::f64);
  if (dtype == DType::f64) return drawn;
  return Tensor::from_values(Tensor::from_values(drawn.to_vector(), dtype).to_vector(), DType::f64)
      .view(shape);
}

inline Case make_case(const Dims& d, std::uint64_t seed, DType dtype = checker_dtype()) {
  Case c;
  c.d = d;
  c.dtype = dtype;
  const Shape shape{d.B, d.T, d.H, d.D};
  c.q = random_in(shape, seed, -1.5, 1.5, dtype);
  c.k = random_in(shape, seed + 1, -1.5, 1.5, dtype);
  c.v = random_in(shape, seed + 2, -1.0, 1.0, dtype);
  c.dout = random_in(shape, seed + 3, -1.0, 1.0, dtype);
  Tensor out = Tensor::empty(shape, DType::f64),
         probs = Tensor::empty({d.B, d.H, d.T, d.T}, DType::f64);
  ops::attention_forward(c.q, c.k, c.v, out, probs);
  Tensor dq = Tensor::empty(shape, DType::f64), dk = Tensor::empty(shape, DType::f64),
         dv = Tensor::empty(shape, DType::f64);
  ops::attention_backward(c.q, c.k, c.v, probs, c.dout, dq, dk, dv);
  c.out = out.to_vector(), c.dq = dq.to_vector(), c.dk = dk.to_vector(), c.dv = dv.to_vector();
  c.qv = c.q.to_vector(), c.kv = c.k.to_vector(), c.vv = c.v.to_vector();
  return c;
}

// This rank's shard of a whole tensor, as the puzzle takes it: on @p on (the
// rank's comm.device()) in checker_dtype(on).
inline Tensor shard_tensor(const Tensor& full, const Dims& d, int n, int r, bool zigzag,
                           Device on) {
  const std::vector<double> rows = shard_of(full.to_vector(), d, rows_of_rank(d.T, n, r, zigzag));
  return Tensor::from_values(rows, checker_dtype(on), on).view({d.B, d.T / n, d.H, d.D});
}

// A wrong result that a known mistake produces, to name it in the message.
struct LookAlike {
  std::string mistake;
  std::vector<double> values;  // this rank's rows
};

// "" when got (this rank's rows) equals expected within attention_tolerance()
// of @p dtype; else where it differs first (batch row, global position,
// head, channel), expected and got, how many differ, and which look-alike it
// equals, if any.
inline std::string compare_rows(const std::string& what, int rank, const Dims& d, int n,
                                bool zigzag, DType dtype, const std::vector<double>& expected,
                                const Tensor& got_tensor,
                                const std::vector<LookAlike>& look_alikes = {}) {
  const Closeness within = attention_tolerance(dtype);
  const std::string head = "rank " + std::to_string(rank) + "'s " + what;
  if (!got_tensor.defined()) return head + " is an undefined tensor (never assigned)";
  if (got_tensor.numel() != static_cast<std::int64_t>(expected.size()))
    return head + " has " + std::to_string(got_tensor.numel()) + " elements, expected " +
           std::to_string(expected.size()) + " ([" + std::to_string(d.B) + ", " +
           std::to_string(d.T / n) + ", " + std::to_string(d.H) + ", " + std::to_string(d.D) +
           "]); got " + got_tensor.describe();
  const std::vector<double> got = got_tensor.to_vector();
  std::int64_t wrong = 0, first = -1;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!within.holds(expected[i], got[i])) {
      ++wrong;
      if (first < 0) first = static_cast<std::int64_t>(i);
    }
  if (wrong == 0) return "";
  // Locate the first wrong element: local row -> global position through the ranges.
  const std::int64_t Tl = d.T / n, per_row = d.row();
  const std::int64_t b = first / (Tl * per_row), local = first / per_row % Tl,
                     h = first % per_row / d.D, c = first % d.D;
  std::int64_t position = local;
  for (const auto& [start, length] : rows_of_rank(d.T, n, rank, zigzag)) {
    if (position < length) {
      position += start;
      break;
    }
    position -= length;
  }
  std::string message = head + " differs from single-device causal attention" +
                        tolerance_note(dtype, within) + " in " + std::to_string(wrong) + " of " +
                        std::to_string(got.size()) + " elements; first at batch row " +
                        std::to_string(b) + ", position " + std::to_string(position) +
                        " (local row " + std::to_string(local) + "), head " + std::to_string(h) +
                        ", channel " + std::to_string(c) + ": expected " + number(expected[first]) +
                        ", got " + number(got[first]);
  for (const LookAlike& alike : look_alikes) {
    bool same = alike.values.size() == got.size();
    for (std::size_t i = 0; same && i < got.size(); ++i)
      same = within.holds(alike.values[i], got[i]);
    if (same) return message + "\n    it equals " + alike.mistake;
  }
  bool all_zero = true;
  for (double g : got) all_zero = all_zero && g == 0.0;
  if (all_zero) message += "\n    it is all zeros: never written, or (dk, dv) never came home";
  return message;
}

// Where rank r's mask puts the key at position j when it takes the block in
// hand at step s for rank (r + s)'s instead of rank (r - s)'s: the same
// offset in the same range of the mirrored owner (2r - owner) mod n.
inline std::int64_t mirrored_position(std::int64_t j, std::int64_t T, int n, int r, bool zigzag) {
  for (int owner = 0; owner < n; ++owner) {
    const auto ranges = rows_of_rank(T, n, owner, zigzag);
    for (std::size_t i = 0; i < ranges.size(); ++i)
      if (j >= ranges[i].first && j < ranges[i].first + ranges[i].second)
        return rows_of_rank(T, n, ((2 * r - owner) % n + n) % n, zigzag)[i].first + j -
               ranges[i].first;
  }
  return j;
}

// Look-alikes of a forward output on rank r: attention over its own keys
// only, attention without the causal mask, and (for n >= 3, where r + s and
// r - s differ) blocks masked with the wrong owner's positions.
inline std::vector<LookAlike> forward_look_alikes(const Case& c, int n, int r, bool zigzag) {
  const auto mine = rows_of_rank(c.d.T, n, r, zigzag);
  auto own = [&](std::int64_t j) {
    for (const auto& [start, length] : mine)
      if (j >= start && j < start + length) return true;
    return false;
  };
  std::vector<LookAlike> alikes;
  if (n >= 3)
    alikes.push_back(
        {"a ring whose mask took the block at step s for rank (r + s) mod n's: the key/value "
         "block at step s comes from rank (r - s) mod n (blocks travel to r + 1, from r - 1); "
         "got the positions of (r + s), so the mask hid the wrong keys",
         shard_of(host_attention(c.qv, c.kv, c.vv, c.d,
                                 [&](std::int64_t i, std::int64_t j) {
                                   return mirrored_position(j, c.d.T, n, r, zigzag) <= i;
                                 }),
                  c.d, mine)});
  std::vector<LookAlike> common = {
      {"causal attention over this rank's own keys only: the other ranks' key/value blocks never "
       "arrived, or were not merged (ops::attention_merge inside attend_block)",
       shard_of(host_attention(c.qv, c.kv, c.vv, c.d,
                               [&](std::int64_t i, std::int64_t j) { return j <= i && own(j); }),
                c.d, mine)},
      {"attention WITHOUT the causal mask (every query sees every key)",
       shard_of(
           host_attention(c.qv, c.kv, c.vv, c.d, [](std::int64_t, std::int64_t) { return true; }),
           c.d, mine)}};
  alikes.insert(alikes.end(), common.begin(), common.end());
  return alikes;
}

// Look-alikes of a gradient on rank r: another rank's rows of the right answer.
inline std::vector<LookAlike> gradient_look_alikes(const std::vector<double>& full, const Dims& d,
                                                   int n, int r, bool zigzag,
                                                   const std::string& name) {
  std::vector<LookAlike> out;
  for (int j = 0; j < n; ++j)
    if (j != r)
      out.push_back({"rank " + std::to_string(j) + "'s " + name +
                         " rows: the gradients went home to the wrong rank",
                     shard_of(full, d, rows_of_rank(d.T, n, j, zigzag))});
  return out;
}

// The rank whose positions hold position i.
inline int owner_of(std::int64_t i, std::int64_t T, int n, bool zigzag) {
  for (int owner = 0; owner < n; ++owner)
    for (const auto& [start, length] : rows_of_rank(T, n, owner, zigzag))
      if (i >= start && i < start + length) return owner;
  return 0;
}

// dq, dk and dv of a backward that uses the forward's (right) softmax
// statistics but sums over the keys `used` allows instead of the causal ones:
// what a ring backward that masks blocks with the wrong positions returns.
inline std::vector<std::vector<double>> host_gradients_over(
    const Case& c, const std::function<bool(std::int64_t, std::int64_t)>& used) {
  const Dims& d = c.d;
  const std::vector<double> dout = c.dout.to_vector();
  std::vector<std::vector<double>> grads(3, std::vector<double>(c.qv.size(), 0.0));
  std::vector<double>&dq = grads[0], &dk = grads[1], &dv = grads[2];
  const double scale = 1.0 / std::sqrt(static_cast<double>(d.D));
  auto at = [&](std::int64_t b, std::int64_t t, std::int64_t h) {
    return static_cast<std::size_t>(((b * d.T + t) * d.H + h) * d.D);
  };
  auto dot = [&](const std::vector<double>& x, std::size_t a, const std::vector<double>& y,
                 std::size_t b) {
    double sum = 0;
    for (std::int64_t e = 0; e < d.D; ++e) sum += x[a + e] * y[b + e];
    return sum;
  };
  for (std::int64_t b = 0; b < d.B; ++b)
    for (std::int64_t h = 0; h < d.H; ++h)
      for (std::int64_t i = 0; i < d.T; ++i) {
        const std::size_t qi = at(b, i, h);
        double top = -INFINITY, sum = 0;
        for (std::int64_t j = 0; j <= i; ++j)
          top = std::max(top, scale * dot(c.qv, qi, c.kv, at(b, j, h)));
        for (std::int64_t j = 0; j <= i; ++j)
          sum += std::exp(scale * dot(c.qv, qi, c.kv, at(b, j, h)) - top);
        const double delta = dot(dout, qi, c.out, qi);
        for (std::int64_t j = 0; j < d.T; ++j) {
          if (!used(i, j)) continue;
          const std::size_t kj = at(b, j, h);
          const double p = std::exp(scale * dot(c.qv, qi, c.kv, kj) - top) / sum;
          const double ds = p * (dot(dout, qi, c.vv, kj) - delta);
          for (std::int64_t e = 0; e < d.D; ++e) {
            dv[kj + e] += p * dout[qi + e];
            dq[qi + e] += scale * ds * c.kv[kj + e];
            dk[kj + e] += scale * ds * c.qv[qi + e];
          }
        }
      }
  return grads;
}

// The four checks of a sequence-parallel attention run on rank r.
inline std::string compare_attention(const Case& c, int n, int r, bool zigzag, const Tensor& out,
                                     const Tensor& dq, const Tensor& dk, const Tensor& dv) {
  const auto mine = rows_of_rank(c.d.T, n, r, zigzag);
  std::string failure =
      compare_rows("output", r, c.d, n, zigzag, c.dtype, shard_of(c.out, c.d, mine), out,
                   forward_look_alikes(c, n, r, zigzag));
  if (!failure.empty() || !dq.defined()) return failure;
  std::vector<std::vector<double>> mirrored;  // worked out only when a gradient is wrong
  int index = 0;
  for (const auto& [name, full, got] :
       {std::tuple<std::string, const std::vector<double>*, const Tensor*>{"dq", &c.dq, &dq},
        {"dk", &c.dk, &dk},
        {"dv", &c.dv, &dv}}) {
    std::vector<LookAlike> alikes = gradient_look_alikes(*full, c.d, n, r, zigzag, name);
    failure =
        compare_rows(name, r, c.d, n, zigzag, c.dtype, shard_of(*full, c.d, mine), *got, alikes);
    if (!failure.empty() && n >= 3) {
      if (mirrored.empty())
        mirrored = host_gradients_over(c, [&](std::int64_t i, std::int64_t j) {
          return mirrored_position(j, c.d.T, n, owner_of(i, c.d.T, n, zigzag), zigzag) <= i;
        });
      alikes.push_back(
          {"a ring backward whose mask took the block at step s for rank (r + s) mod "
           "n's: the key/value block at step s comes from rank (r - s) mod n; got "
           "the positions of (r + s), so the mask hid the wrong keys",
           shard_of(mirrored[static_cast<std::size_t>(index)], c.d, mine)});
      failure =
          compare_rows(name, r, c.d, n, zigzag, c.dtype, shard_of(*full, c.d, mine), *got, alikes);
    }
    if (!failure.empty()) return failure;
    ++index;
  }
  return "";
}

// Sequence-parallel degrees a case runs at, under the backend's limits.
inline std::vector<int> degrees(std::initializer_list<int> wanted) {
  std::vector<int> out;
  for (int n : wanted)
    if (world_fits(n)) out.push_back(n);
  return out;
}

// Runs ring attention (forward, and backward when `backward`) at degree n and
// compares everything; `extra` adds per-rank checks of the counts.
inline void check_ring(
    const Case& c, int n, bool zigzag, bool backward,
    const std::function<std::string(Comm&, std::int64_t fwd_blocks, std::int64_t bwd_blocks,
                                    const CommStats& fwd, const CommStats& bwd)>& extra) {
  const std::string what = std::string(zigzag ? "zigzag" : "contiguous") + " ring attention" +
                           (backward ? ", forward and backward" : ", forward");
  run_and_report(what, n, [&](Comm& sp) -> std::string {
    const int r = sp.rank();
    RingAttention ring(sp, zigzag ? SequenceLayout::zigzag : SequenceLayout::contiguous);
    sp.reset_stats();
    reset_block_computations();
    const Device on = sp.device();
    const Tensor out = ring.forward(shard_tensor(c.q, c.d, n, r, zigzag, on),
                                    shard_tensor(c.k, c.d, n, r, zigzag, on),
                                    shard_tensor(c.v, c.d, n, r, zigzag, on));
    const CommStats forward = sp.stats();
    const std::int64_t forward_blocks = block_computations();
    Tensor dq, dk, dv;
    CommStats backward_stats;
    std::int64_t backward_blocks = 0;
    if (backward) {
      sp.reset_stats();
      reset_block_computations();
      ring.backward(shard_tensor(c.dout, c.d, n, r, zigzag, on), dq, dk, dv);
      backward_stats = sp.stats();
      backward_blocks = block_computations();
    }
    std::string failure = compare_attention(c, n, r, zigzag, out, dq, dk, dv);
    if (!failure.empty()) return failure;
    return extra ? extra(sp, forward_blocks, backward_blocks, forward, backward_stats) : "";
  });
}

// The refusal of a length that does not split: n ranks holding `local`
// positions each (threads only where n exceeds mpiexec's ranks).
inline void check_refusal(int n, std::int64_t local, bool zigzag, const std::string& expected) {
  if (!world_fits(n)) return;
  const std::string error = error_of([&] {
    run_ranks(n, [&](Comm& sp) {
      const Tensor x = Tensor::zeros({1, local, 2, 4}, checker_dtype(sp.device()), sp.device());
      RingAttention(sp, zigzag ? SequenceLayout::zigzag : SequenceLayout::contiguous)
          .forward(x, x, x);
    });
  });
  EXPECT_NE(error.find(expected), std::string::npos)
      << "ring attention on " << n << " ranks of " << local
      << " positions should be refused with \"" << expected
      << "\" (positions_of says it); got: " << error;
}

}  // namespace dtp::testing::ch06
