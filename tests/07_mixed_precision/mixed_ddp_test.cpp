// Checkers for 7.4: mixed precision under data parallelism.
//
// Every rank trains on its own batch. The expected update is the checker's
// own (CheckerRun: the same ops in the same order on a second copy of the
// model), with the gradients averaged through the same communicator in the
// dtype asked for. World sizes are powers of two, so dividing by the world
// is exact in any format and the comparisons are bitwise. After every step
// the masters and the 16-bit model must be bitwise equal on all ranks. Each
// rank's model lives on its device (comm.device(): the GPU in the gpu flavour).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "07_mixed_precision/mixed_precision.h"
#include "dtp/dtp.h"
#include "mixed_test_helpers.h"
#include "support/harness.h"

namespace dtp::ch07 {
namespace {

using testing::batch_of;
using testing::CheckerRun;
using testing::first_difference;
using testing::small_config;

// @p v with 9 significant digits.
std::string decimal(double v) {
  std::ostringstream out;
  out.precision(9);
  out << v;
  return out.str();
}

// Fails the calling rank with @p message (the harness names the rank).
void require(bool ok, const std::string& message) {
  if (!ok) throw Error(message);
}

// "" when @p t is bitwise the same on every rank, else where it differs.
std::string differs_across_ranks(Comm& comm, const Tensor& t) {
  Tensor low = Tensor::empty({t.numel()}, DType::f64, t.device()),
         high = Tensor::empty({t.numel()}, DType::f64, t.device());
  ops::cast(t, low);
  ops::cast(t, high);
  comm.all_reduce(low, ReduceOp::min);
  comm.all_reduce(high, ReduceOp::max);
  return first_difference(low, high);
}

void expect_replicated(Comm& comm, MasterWeights& masters, const std::string& when) {
  for (std::size_t i = 0; i < masters.buffers().size(); ++i) {
    const std::string name = masters.model().units()[i]->name();
    const std::string master_diff = differs_across_ranks(comm, masters.buffers()[i].params);
    const std::string model_diff = differs_across_ranks(comm, masters.model().units()[i]->params());
    require(master_diff.empty(), when + ": the f32 masters of " + name +
                                     " differ across ranks (min vs max over ranks: " + master_diff +
                                     ")");
    require(model_diff.empty(), when + ": the 16-bit parameters of " + name +
                                    " differ across ranks (min vs max over ranks: " + model_diff +
                                    ")");
  }
}

TEST(Puzzle7_4_mixed_ddp, FoundOnAnyRankIsTrueEverywhereWhenOneRankFoundOne) {
  for (int world = 1; world <= 4; ++world) {
    if (!dtp::testing::world_fits(world)) continue;
    dtp::testing::run_ranks(world, [&](Comm& comm) {
      require(!found_on_any_rank(comm, false),
              "world " + std::to_string(world) +
                  ": no rank found anything, but found_on_any_rank returned true");
      for (int r = 0; r < world; ++r)
        require(found_on_any_rank(comm, comm.rank() == r),
                "world " + std::to_string(world) + ": only rank " + std::to_string(r) +
                    " found a non-finite gradient; every rank must get true (all_reduce the flag "
                    "with max)");
    });
  }
}

// One step on each rank of @p world in @p reduce_dtype, against the checker.
// With @p loss_scale > 0 the step runs with a LossScaler starting there
// (growth_interval 1000: it stays there), so the gradients travel scaled.
void expect_step_matches(int world, DType model_dtype, DType reduce_dtype, double loss_scale = 0) {
  dtp::testing::run_ranks(world, [&](Comm& comm) {
    const GPTConfig config = small_config(model_dtype, comm.device());
    const std::string label = std::string(dtype_name(model_dtype)) + " model, reduce in " +
                              dtype_name(reduce_dtype) + ", world " + std::to_string(world) +
                              (loss_scale > 0 ? ", loss scale " + decimal(loss_scale) : "");
    GPT model(config);
    MasterWeights masters(model);
    AdamW adam(masters.buffers());
    std::unique_ptr<LossScaler> scaler;
    if (loss_scale > 0)
      scaler = std::make_unique<LossScaler>(ScalerConfig{loss_scale, 2, 0.5, 1000});
    CheckerRun expected(config);
    for (int step = 1; step <= 2; ++step) {
      const Batch batch = batch_of(config, 2, 100 * step + comm.rank());
      const double scale = scaler ? scaler->scale() : 1.0;
      comm.reset_stats();
      const MixedStep got = ddp_mixed_precision_step(comm, masters, adam, scaler.get(), batch, 3e-3,
                                                     1.0, reduce_dtype);
      const std::int64_t bytes = comm.stats().collective_bytes;

      // The checker's step: local gradients of the scaled loss, averaged in reduce_dtype.
      expected.model.zero_grad();
      CheckerRun::Step want;
      want.loss = expected.model.forward(batch.inputs, batch.targets);
      expected.model.backward(scale);
      std::vector<Unit*> units = expected.model.units();
      for (std::size_t i = 0; i < units.size(); ++i) {
        if (reduce_dtype != DType::f32) {
          comm.all_reduce(units[i]->grads());
          ops::scale(units[i]->grads(), 1.0 / world);
        }
        ops::cast(units[i]->grads(), expected.grads[i]);
        if (reduce_dtype == DType::f32) {
          comm.all_reduce(expected.grads[i]);
          ops::scale(expected.grads[i], 1.0 / world);
        }
      }
      want = expected.update(want, scale, 3e-3, 1.0);

      const std::int64_t N = model.parameter_count();
      const std::int64_t want_bytes = N * static_cast<std::int64_t>(dtype_size(reduce_dtype));
      if (world > 1)
        require(bytes >= want_bytes && bytes <= want_bytes + 64,
                label + ", step " + std::to_string(step) + ": the step's collectives moved " +
                    std::to_string(bytes) + " bytes; averaging " + std::to_string(N) +
                    " gradients in " + dtype_name(reduce_dtype) + " moves " +
                    std::to_string(want_bytes) +
                    (bytes >= 2 * want_bytes - 64 && bytes <= 2 * want_bytes + 64
                         ? " (twice that: reduced in f32 where the model's 16 bits were asked for?)"
                     : bytes * 2 >= want_bytes - 64 && bytes * 2 <= want_bytes + 64
                         ? " (half that: reduced the 16-bit gradients where f32 was asked for?)"
                         : ""));
      require(got.loss == want.loss,
              label + ": the loss must be this rank's forward on its own batch");
      const double ratio = got.grad_norm / want.grad_norm;
      require(got.grad_norm == want.grad_norm,
              label + ", step " + std::to_string(step) + ": grad_norm is " +
                  decimal(got.grad_norm) + ", the norm of the averaged unscaled gradients is " +
                  decimal(want.grad_norm) + " (x" + decimal(ratio) + ")" +
                  (scale != 1 && std::fabs(ratio - scale) <= 1e-3 * scale
                       ? ": the loss scale. It is the norm of the scaled gradients: divide it "
                         "by the scale the backward used"
                       : ""));
      for (std::size_t i = 0; i < units.size(); ++i) {
        const std::string diff = first_difference(expected.masters[i], masters.buffers()[i].params);
        require(diff.empty(),
                label + ", step " + std::to_string(step) + ", master of " + units[i]->name() +
                    ": " + diff + " (expected: the gradients summed over ranks in " +
                    dtype_name(reduce_dtype) + ", divided by the world, then clip and AdamW)");
      }
      expect_replicated(comm, masters, label + ", after step " + std::to_string(step));
    }
  });
}

TEST(Puzzle7_4_mixed_ddp, AveragingInF32MatchesTheCheckersStep) {
  for (int world : {1, 2, 4})
    if (dtp::testing::world_fits(world)) expect_step_matches(world, DType::bf16, DType::f32);
}

TEST(Puzzle7_4_mixed_ddp, AveragingInSixteenBitsMatchesTheCheckersStep) {
  for (int world : {2, 4})
    if (dtp::testing::world_fits(world)) {
      expect_step_matches(world, DType::bf16, DType::bf16);
      expect_step_matches(world, DType::f16, DType::f16);
    }
}

// With a loss scaler the gradients travel scaled; grad_norm is still the
// norm of the true (unscaled) averaged gradients, and the update the
// checker's.
TEST(Puzzle7_4_mixed_ddp, WithALossScalerGradNormIsTheUnscaledNorm) {
  for (int world : {1, 2})
    if (dtp::testing::world_fits(world)) {
      expect_step_matches(world, DType::f16, DType::f32, 1024);
      expect_step_matches(world, DType::f16, DType::f16, 1024);
    }
}

TEST(Puzzle7_4_mixed_ddp, AnOverflowOnOneRankIsASkipOnEveryRank) {
  for (int world : {2, 4}) {
    if (!dtp::testing::world_fits(world)) continue;
    for (DType reduce : {DType::f16, DType::f32}) {
      dtp::testing::run_ranks(world, [&](Comm& comm) {
        const GPTConfig config = small_config(DType::f16, comm.device());
        const std::string label =
            "world " + std::to_string(world) + ", reduce in " + dtype_name(reduce);
        GPT model(config);
        MasterWeights masters(model);
        AdamW adam(masters.buffers());
        LossScaler scaler({1024.0, 2.0, 0.5, 100});
        MixedStep first = ddp_mixed_precision_step(
            comm, masters, adam, &scaler, batch_of(config, 2, 7 + comm.rank()), 3e-3, 1.0, reduce);
        require(first.stepped,
                label + ": a first step with finite gradients everywhere was skipped");
        // The last rank's block.0 gradient gets an inf during the next backward.
        if (comm.rank() == world - 1)
          model.on_grad_ready([](Unit& unit) {
            if (unit.name() == "block.0")
              unit.grads().set_item(0, std::numeric_limits<double>::infinity());
          });
        std::vector<std::vector<double>> before;
        for (const ParamBuffer& b : masters.buffers()) before.push_back(b.params.to_vector());
        const MixedStep second = ddp_mixed_precision_step(
            comm, masters, adam, &scaler, batch_of(config, 2, 17 + comm.rank()), 3e-3, 1.0, reduce);
        require(!second.stepped,
                label + ": rank " + std::to_string(world - 1) +
                    " had an inf in block.0's gradient; every rank must skip the step");
        require(scaler.scale() == 512.0,
                label +
                    ": after the skipped step the scale must be 512 (halved) on every "
                    "rank, got " +
                    std::to_string(scaler.scale()));
        require(adam.steps() == 1, label + ": the optimizer stepped on the skipped step");
        for (std::size_t i = 0; i < before.size(); ++i)
          require(masters.buffers()[i].params.to_vector() == before[i],
                  label + ": a skipped step changed the masters of " + model.units()[i]->name());
        expect_replicated(comm, masters, label + ", after the skipped step");
      });
    }
  }
}

// With a scaler the skip is decided by every rank together: one
// found_on_any_rank (an all-reduce of a flag) on top of the step's gradient
// all-reduces. An inf on one rank also reaches the others through the
// gradient sum here, so deciding from the local unscale passes every value
// check in DDP, and breaks as soon as the gradients are sharded (ZeRO).
TEST(Puzzle7_4_mixed_ddp, WithALossScalerTheSkipIsDecidedByFoundOnAnyRank) {
  dtp::testing::run_ranks(2, [&](Comm& comm) {
    const GPTConfig config = small_config(DType::f16, comm.device());
    GPT model(config);
    MasterWeights masters(model);
    AdamW adam(masters.buffers());
    for (DType reduce : {DType::f16, DType::f32}) {
      comm.reset_stats();
      ddp_mixed_precision_step(comm, masters, adam, nullptr, batch_of(config, 2, 3 + comm.rank()),
                               3e-3, 1.0, reduce);
      const std::int64_t without = comm.stats().collective_calls["all_reduce"];
      LossScaler scaler({1024.0, 2.0, 0.5, 100});
      comm.reset_stats();
      ddp_mixed_precision_step(comm, masters, adam, &scaler, batch_of(config, 2, 5 + comm.rank()),
                               3e-3, 1.0, reduce);
      const std::int64_t with = comm.stats().collective_calls["all_reduce"];
      require(
          with == without + 1,
          "reduce in " + std::string(dtype_name(reduce)) + ": a step with a loss scaler made " +
              std::to_string(with) + " all-reduce(s), one without made " + std::to_string(without) +
              "; expected exactly one more: found_on_any_rank's " +
              "flag, so that every rank skips together" +
              (with == without ? " (the skip was decided from this rank's unscale alone)" : ""));
    }
  });
}

TEST(Puzzle7_4_mixed_ddp, AReduceDtypeOtherThanTheModelsOrF32IsRefused) {
  dtp::testing::run_ranks(1, [&](Comm& comm) {
    const GPTConfig config = small_config(DType::bf16, comm.device());
    GPT model(config);
    MasterWeights masters(model);
    AdamW adam(masters.buffers());
    const std::string message = dtp::testing::error_of([&] {
      ddp_mixed_precision_step(comm, masters, adam, nullptr, batch_of(config, 2, 1), 1e-3, 1.0,
                               DType::f16);
    });
    require(message.find("reduce_dtype") != std::string::npos &&
                message.find("bf16") != std::string::npos &&
                message.find("f32") != std::string::npos,
            "a bf16 model with reduce_dtype f16 must be refused naming reduce_dtype, the model's "
            "bf16 and f32; "
            "got: " +
                message);
  });
}

}  // namespace
}  // namespace dtp::ch07
