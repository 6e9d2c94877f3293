// Checkers of ZeRO++ training (drivers/10_compression/zero_plus_plus.h),
// linked with the reference: puzzle 10.5's collectives composed into
// ZeRO-3. With no part on it must train as one device does; with each part,
// every rank's weights before each unit's forward must be the checker's own
// quantized gather of every rank's master shard, bit for bit, the backward
// must use the very same bits (from the node under hpZ), the gradient
// shards must be the checker's quantized mean, and the bytes of each
// communicator per step must equal the lesson's formula. Rank threads share
// what the hooks recorded; the checker compares after the run.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "10_compression/compression_checks.h"
#include "drivers/10_compression/zero_plus_plus.h"
#include "dtp/dtp.h"
#include "support/training.h"

namespace dtp::ch10 {
namespace {

using dtp::testing::compression::blocks_of;
using dtp::testing::compression::calls_between;
using dtp::testing::compression::calls_text;
using dtp::testing::compression::in_dtype;
using dtp::testing::compression::quantize_like_the_contract;
using dtp::testing::compression::same_bits;
using dtp::testing::compression::text;
using dtp::testing::compression::wire_bytes;

constexpr int kWorld = 4;
constexpr std::int64_t kBlock = 16;  // several blocks per shard of the tiny model

using Values = std::vector<double>;
using PerUnit = std::vector<Values>;  // [unit]

// What one rank did at one step.
struct StepSeen {
  PerUnit shards;       // master parameter shards as the step began
  PerUnit forward;      // each unit's full weights as its forward began
  PerUnit backward;     // and as its backward began
  PerUnit grads;        // its full local gradient, as it became final
  PerUnit grad_shards;  // the reduced gradient shards after backward
  std::map<std::string, std::int64_t> world_calls, node_calls;
  std::int64_t world_bytes = 0, node_bytes = 0;
  double loss = 0;
};
using RankSeen = std::vector<StepSeen>;  // [step]

ZeroPlusPlusParts parts_of(const std::string& list, int node_ranks) {
  return parse_zeropp(list, node_ranks, kBlock);
}

// Trains config.steps steps on @p world rank threads under @p parts,
// recording what the hooks see; returns [rank][step], and the full master
// parameters after the last step, [unit] (rank 0's gather).
std::vector<RankSeen> train(const TrainConfig& config, const ZeroPlusPlusParts& parts, int world,
                            PerUnit* final_params = nullptr) {
  std::vector<RankSeen> seen(static_cast<std::size_t>(world));
  dtp::testing::run_ranks(world, [&](Comm& comm) {
    RankSeen& mine = seen[static_cast<std::size_t>(comm.rank())];
    Trainer trainer(config, comm.rank(), comm.size());
    GPT& model = trainer.model();
    const std::size_t units = model.units().size();
    StepSeen* now = nullptr;
    auto at = [&](PerUnit& v, const Unit& unit) -> Values& {
      v.resize(units);
      return v[static_cast<std::size_t>(unit.index())];
    };
    // Registered before ZeroPlusPlus's own hook, so the gradient is still whole.
    model.on_grad_ready([&](Unit& unit) { at(now->grads, unit) = unit.grads().to_vector(); });
    auto owned = std::make_unique<ZeroPlusPlus>(comm, model, trainer.config(), parts);
    ZeroPlusPlus& zero = *owned;
    model.on_before_forward(
        [&](Unit& unit) { at(now->forward, unit) = unit.params().to_vector(); });
    model.on_before_backward(
        [&](Unit& unit) { at(now->backward, unit) = unit.params().to_vector(); });
    trainer.on_after_backward([&] {
      zero.finish_backward();
      for (std::size_t u = 0; u < units; ++u)
        at(now->grad_shards, *model.units()[u]) =
            zero.gradient_shard(static_cast<int>(u)).to_vector();
    });
    trainer.set_optimizer(std::move(owned));
    mine.resize(static_cast<std::size_t>(config.steps));
    for (std::int64_t s = 0; s < config.steps; ++s) {
      now = &mine[static_cast<std::size_t>(s)];
      for (std::size_t u = 0; u < units; ++u)
        now->shards.push_back(zero.parameter_shard(static_cast<int>(u)).to_vector());
      const CommStats world_before = comm.stats(), node_before = zero.node().stats();
      now->loss = trainer.step().loss;
      const CommStats world_after = comm.stats(), node_after = zero.node().stats();
      now->world_calls = calls_between(world_before, world_after);
      now->world_bytes = world_after.collective_bytes - world_before.collective_bytes;
      if (&zero.node() != &comm) {
        now->node_calls = calls_between(node_before, node_after);
        now->node_bytes = node_after.collective_bytes - node_before.collective_bytes;
      }
    }
    if (final_params == nullptr) return;
    for (Unit* unit : model.units()) {
      const Tensor& shard = zero.parameter_shard(unit->index());
      Tensor full = Tensor::empty(Shape{unit->numel()}, shard.dtype(), shard.device());
      comm.all_gather(shard, full);
      if (comm.rank() == 0) final_params->push_back(full.to_vector());
    }
  });
  return seen;
}

// --- the lesson's bytes --------------------------------------------------------------

struct Traffic {
  std::map<std::string, std::int64_t> world_calls, node_calls;
  std::int64_t world_bytes = 0, node_bytes = 0;
};

// One step's collectives under @p parts, per the lesson: per unit of n
// elements (chunks L_r of chunk_range), a forward gather (qwZ: codes and
// scales of every rank's chunk, sum_r wire(L_r, 8); else n e), a backward
// gather (hpZ: n e inside the node; else as the forward), a gradient
// reduction (qgZ: sum_j wire(L_j, b) through two all_to_all_v; else a
// reduce-scatter of n e); plus the gradient norm's all-reduce of one f64.
Traffic lesson_traffic(const GPT& model, const ZeroPlusPlusParts& parts, int world, DType dtype) {
  Traffic t;
  const auto e = static_cast<std::int64_t>(dtype_size(dtype));
  auto chunks_bytes = [&](std::int64_t n, int bits) {
    std::int64_t total = 0;
    for (int r = 0; r < world; ++r)
      total += wire_bytes(chunk_range(n, world, r).length, bits, parts.block, dtype);
    return total;
  };
  for (const Unit* unit : model.units()) {
    const std::int64_t n = unit->numel();
    const int gathers = parts.hpz_ranks > 0 ? 1 : 2;
    if (parts.qwz) {
      t.world_calls["all_gather"] += 2 * gathers;
      t.world_bytes += gathers * chunks_bytes(n, 8);
    } else {
      t.world_calls["all_gather"] += gathers;
      t.world_bytes += gathers * n * e;
    }
    if (parts.hpz_ranks > 0) {
      t.node_calls["all_gather"] += 1;
      t.node_bytes += n * e;
    }
    if (parts.qgz_bits > 0) {
      t.world_calls["all_to_all_v"] += 2;
      t.world_bytes += chunks_bytes(n, parts.qgz_bits);
    } else {
      t.world_calls["reduce_scatter"] += 1;
      t.world_bytes += n * e;
    }
  }
  t.world_calls["all_reduce"] += 1;
  t.world_bytes += 8;
  return t;
}

// Which other parts' formula @p got matches, to decode a wrong count.
std::string as_if(const GPT& model, const ZeroPlusPlusParts& parts, int world, DType dtype,
                  std::int64_t got) {
  for (const char* list : {"none", "qwz", "hpz", "qgz", "qgz8", "qwz,hpz", "qwz,qgz", "hpz,qgz",
                           "qwz,hpz,qgz", "qwz,qgz8", "qwz,hpz,qgz8"}) {
    const ZeroPlusPlusParts other = parse_zeropp(list, parts.hpz_ranks, parts.block);
    if (other.text() != parts.text() &&
        lesson_traffic(model, other, world, dtype).world_bytes == got)
      return ": that is the world traffic of --zeropp " + std::string(list);
  }
  return "";
}

// --- the checks --------------------------------------------------------------------

// The full weights every rank must see before a unit's forward at a step:
// every rank's master shard, quantized and dequantized under qwZ.
Values expected_weights(const std::vector<RankSeen>& seen, std::size_t step, std::size_t unit,
                        const ZeroPlusPlusParts& parts, DType dtype) {
  Values full;
  for (const RankSeen& rank : seen) {
    const Values& shard = rank[step].shards[unit];
    const Values got =
        parts.qwz ? quantize_like_the_contract(shard, dtype, 8, parts.block).values : shard;
    full.insert(full.end(), got.begin(), got.end());
  }
  return full;
}

// Rank j's gradient shard: the mean over ranks of chunk j of each rank's
// gradient, each chunk quantized and dequantized under qgZ, added in rank
// order and divided by N in the dtype.
Values expected_gradient_shard(const std::vector<RankSeen>& seen, std::size_t step,
                               std::size_t unit, int j, const ZeroPlusPlusParts& parts,
                               DType dtype) {
  const int world = static_cast<int>(seen.size());
  const auto n = static_cast<std::int64_t>(seen[0][step].grads[unit].size());
  const ChunkRange mine = chunk_range(n, world, j);
  Values sum(static_cast<std::size_t>(mine.length), 0.0);
  for (int r = 0; r < world; ++r) {
    const Values& g = seen[static_cast<std::size_t>(r)][step].grads[unit];
    Values chunk(g.begin() + mine.offset, g.begin() + mine.offset + mine.length);
    if (parts.qgz_bits > 0)
      chunk = quantize_like_the_contract(chunk, dtype, parts.qgz_bits, parts.block).values;
    for (std::size_t i = 0; i < chunk.size(); ++i) sum[i] = in_dtype(dtype, sum[i] + chunk[i]);
  }
  for (double& v : sum) v = in_dtype(dtype, v / world);
  return sum;
}

// The first element where @p got differs from @p expected (in bits when
// @p exact, else beyond @p within), as "element i: expected x, got y"; "" when none.
std::string first_difference(const Values& expected, const Values& got, bool exact,
                             const dtp::testing::Closeness& within) {
  if (expected.size() != got.size())
    return std::to_string(got.size()) + " elements, expected " + std::to_string(expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const bool same = exact ? same_bits(expected[i], got[i]) : within.holds(expected[i], got[i]);
    if (same) continue;
    std::string ratio;
    if (expected[i] != 0) {
      char buf[64];
      std::snprintf(buf, sizeof buf, " (got / expected = %.6g)", got[i] / expected[i]);
      ratio = buf;
    }
    return "element " + std::to_string(i) + ": expected " + text(expected[i]) + ", got " +
           text(got[i]) + ratio;
  }
  return "";
}

// Every check of one run; "" when all hold.
std::string check_run(const TrainConfig& config, const ZeroPlusPlusParts& parts, int world) {
  const std::vector<RankSeen> seen = train(config, parts, world);
  const DType dtype = config.model.dtype;
  GPT model(config.resolved_model());
  const std::vector<Unit*> units = model.units();
  const Traffic lesson = lesson_traffic(model, parts, world, dtype);
  const dtp::testing::Closeness within = dtp::testing::training_tolerance(dtype);
  const std::string run = "--zeropp " + parts.text() + " on " + std::to_string(world) + " ranks";
  for (std::size_t s = 0; s < seen[0].size(); ++s)
    for (int r = 0; r < world; ++r) {
      const StepSeen& got = seen[static_cast<std::size_t>(r)][s];
      const std::string where =
          run + ", rank " + std::to_string(r) + ", step " + std::to_string(s + 1);
      if (got.world_calls != lesson.world_calls || got.world_bytes != lesson.world_bytes)
        return where + ": the world's collectives were " + calls_text(got.world_calls) +
               " moving " + std::to_string(got.world_bytes) +
               " bytes; the lesson's formula: " + calls_text(lesson.world_calls) + " moving " +
               std::to_string(lesson.world_bytes) +
               as_if(model, parts, world, dtype, got.world_bytes);
      if (got.node_calls != lesson.node_calls || got.node_bytes != lesson.node_bytes)
        return where + ": inside the hpZ node the collectives were " + calls_text(got.node_calls) +
               " moving " + std::to_string(got.node_bytes) +
               " bytes; the lesson: " + calls_text(lesson.node_calls) + " moving " +
               std::to_string(lesson.node_bytes) +
               " (one plain all-gather per unit in the backward)";
      for (std::size_t u = 0; u < units.size(); ++u) {
        const std::string unit = "unit '" + units[u]->name() + "'";
        const Values weights = expected_weights(seen, s, u, parts, dtype);
        std::string d = first_difference(weights, got.forward[u], true, within);
        if (!d.empty())
          return where + ", " + unit + ", weights before its forward, " + d +
                 (parts.qwz ? " (every rank's shard quantized to 8 bits and dequantized)"
                            : " (every rank's master shard, concatenated)");
        d = first_difference(got.forward[u], got.backward[u], true, within);
        if (!d.empty())
          return where + ", " + unit + ", weights before its backward differ from its forward's, " +
                 d +
                 (parts.hpz_ranks > 0 ? " (hpZ gathers the forward's bits inside the node)"
                                      : " (the backward gathers the same shards again)");
        const Values grads = expected_gradient_shard(seen, s, u, r, parts, dtype);
        d = first_difference(grads, got.grad_shards[u], parts.qgz_bits > 0, within);
        if (!d.empty())
          return where + ", " + unit + ", gradient shard after backward, " + d +
                 (parts.qgz_bits > 0 ? " (the mean over ranks of chunk " + std::to_string(r) +
                                           " of each rank's gradient, quantized to " +
                                           std::to_string(parts.qgz_bits) + " bits)"
                                     : " (the mean over ranks of chunk " + std::to_string(r) + ")");
      }
    }
  return "";
}

TrainConfig zeropp_config() {
  TrainConfig config = dtp::testing::tiny_config(12, 3);
  config.batch = 8;  // 2 sequences per rank on 4 ranks
  return config;
}

TEST(ZeroPlusPlusParts, ParseEveryPartAndRefuseTheRest) {
  ZeroPlusPlusParts all = parse_zeropp("qwz,hpz,qgz", 2, 64);
  EXPECT_TRUE(all.qwz);
  EXPECT_EQ(all.hpz_ranks, 2);
  EXPECT_EQ(all.qgz_bits, 4) << "qgz quantizes gradients to 4 bits, as the ZeRO++ paper";
  EXPECT_EQ(all.block, 64);
  EXPECT_EQ(all.text(), "qwz,hpz:2,qgz:4");
  EXPECT_EQ(parse_zeropp("qgz8", 2, 64).qgz_bits, 8);
  EXPECT_EQ(parse_zeropp("none", 2, 64).text(), "none");
  struct Case {
    const char* list;
    const char* names;
  };
  for (const Case& c : {Case{"qwz,fast", "'fast'"}, Case{"qwz,qwz", "twice"},
                        Case{"qgz,qgz8", "twice"}, Case{"", "'none' or a list"}}) {
    const std::string message =
        dtp::testing::compression::dtp_error_of([&] { (void)parse_zeropp(c.list, 2, 64); });
    EXPECT_NE(message.find(c.names), std::string::npos)
        << "--zeropp '" << c.list << "' should be refused naming " << c.names
        << ", got: " << message;
  }
  const std::string uneven = dtp::testing::compression::dtp_error_of(
      [] { validate_zeropp(parse_zeropp("hpz", 3, 64), 4); });
  EXPECT_NE(uneven.find("--node-ranks 3"), std::string::npos) << uneven;
  EXPECT_NE(uneven.find("world of 4"), std::string::npos) << uneven;
}

TEST(ZeroPlusPlusTraining, WithNoPartItTrainsAsOneDevice) {
  const TrainConfig config = zeropp_config();
  PerUnit params;
  const std::vector<RankSeen> seen = train(config, parts_of("none", 0), kWorld, &params);
  const dtp::testing::ModelState single = dtp::testing::single_device(config);
  const dtp::testing::Closeness within = dtp::testing::training_tolerance(config.model.dtype);
  GPT model(config.resolved_model());
  for (std::size_t s = 0; s < single.losses.size(); ++s) {
    double mean = 0;
    for (const RankSeen& rank : seen) mean += rank[s].loss / kWorld;
    EXPECT_TRUE(within.holds(single.losses[s], mean))
        << "step " << s + 1 << ": ZeRO-3 without parts, loss averaged over ranks " << text(mean)
        << ", one device " << text(single.losses[s]);
  }
  EXPECT_EQ(dtp::testing::compare_units("parameter after the last step", model, single.params,
                                        params, within),
            "")
      << "ZeRO-3 without parts must train as one device on the global batch";
}

TEST(ZeroPlusPlusTraining, EachPartGathersReducesAndMovesTheLessonsBytes) {
  const TrainConfig config = zeropp_config();
  for (const char* list : {"none", "qwz", "hpz", "qgz", "qgz8", "qwz,hpz,qgz"}) {
    const std::string failure = check_run(config, parts_of(list, 2), kWorld);
    EXPECT_EQ(failure, "");
  }
  // hpZ's node as one rank (the whole weights kept) and as the whole world.
  for (int node : {1, 4}) EXPECT_EQ(check_run(config, parts_of("qwz,hpz", node), kWorld), "");
  // An uneven world: chunk_range's last shard is shorter.
  TrainConfig three = config;
  three.batch = 6;
  EXPECT_EQ(check_run(three, parts_of("qwz,qgz", 0), 3), "");
}

}  // namespace
}  // namespace dtp::ch10
