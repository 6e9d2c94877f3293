// The planner's clock: one step of a pipeline schedule run on the runtime's
// alpha-beta clock, with the tensor-parallel collectives inside the
// actions and the gradient reductions after them; then the plan and the
// search over layouts.
#include <algorithm>
#include <cmath>
#include <limits>

#include "drivers/12_3d_parallelism/plan.h"
#include "dtp/error.h"

namespace dtp::plan {

namespace {

// The world ranks of one group of the mesh, replica d = 0: w = (d pp + p) tp + t.
int mesh_rank(const Layout& l, int d, int p, int t) { return (d * l.pp + p) * l.tp + t; }

std::vector<int> tp_group_ranks(const Layout& l, int stage) {
  std::vector<int> ranks;
  for (int t = 0; t < l.tp; ++t) ranks.push_back(mesh_rank(l, 0, stage, t));
  return ranks;
}

std::vector<int> dp_group_ranks(const Layout& l, int stage) {
  std::vector<int> ranks;
  for (int d = 0; d < l.dp; ++d) ranks.push_back(mesh_rank(l, d, stage, 0));
  return ranks;
}

double tp_calls_cost(const std::vector<CollectiveCall>& calls, int ranks, const CostModel& group) {
  double seconds = 0;
  for (const CollectiveCall& call : calls)
    seconds += collective_cost(call.kind, static_cast<double>(call.bytes), ranks, group);
  return seconds;
}

// What one action of one virtual stage costs, before any waiting.
struct StageCosts {
  double forward_compute = 0, backward_compute = 0, input_grad_compute = 0, weight_compute = 0;
  double forward_tp = 0, backward_tp = 0;  // TP collectives in each
  double forward_dp = 0, backward_dp = 0;  // FSDP's gathers and reduce-scatters in each
  double send = 0;                         // one boundary message to the next / previous stage
};

double matrix_flops_per_token(const ModelShape& m) {
  // forward_flops_per_token of one block without its attention scores.
  ModelShape one = m;
  one.layers = 1;
  one.vocab = 0;
  return forward_flops_per_token(one) - 4.0 * m.seq * m.hidden;
}

std::vector<StageCosts> stage_costs(const PlanInput& input, const ch05::ActionCosts* fixed) {
  const ModelShape& m = input.model;
  const Layout& l = input.layout;
  const Precision& prec = input.precision;
  const CostModel world = input.cluster.cost_model();
  const std::vector<ch05::UnitRange> ranges = stage_units(input);
  const int virtual_stages = l.pp * l.chunks;
  const std::int64_t tokens = static_cast<std::int64_t>(l.microbatch) * m.seq;
  const double rate = input.cluster.peak_flops * input.cluster.efficiency;
  const double block_forward = matrix_flops_per_token(m) + 4.0 * m.seq * m.hidden;
  const double scores_forward = 4.0 * m.seq * m.hidden;
  std::vector<StageCosts> costs(static_cast<std::size_t>(virtual_stages));
  for (int v = 0; v < virtual_stages; ++v) {
    const int stage = v % l.pp;
    const CostModel tp_cost = world.for_group(tp_group_ranks(l, stage));
    const CostModel dp_cost = world.for_group(dp_group_ranks(l, stage));
    StageCosts& c = costs[static_cast<std::size_t>(v)];
    const ch05::UnitRange& range = ranges[static_cast<std::size_t>(v)];
    double forward_flops = 0, recompute_flops = 0;
    for (int u = range.first; u < range.first + range.count; ++u) {
      auto tp_calls = [&](Pass pass) {
        return tp_calls_cost(tensor_parallel_unit_collectives(
                                 m, u, pass, tokens, prec.activation_bytes, l.sequence_parallel),
                             l.tp, tp_cost);
      };
      const bool block = u >= 1 && u <= m.layers;
      c.forward_tp += tp_calls(Pass::forward);
      c.backward_tp += tp_calls(Pass::backward);
      if (block && l.recompute == Recompute::full) c.backward_tp += tp_calls(Pass::forward);
      if (block) forward_flops += block_forward * tokens;
      if (block && l.recompute == Recompute::full) recompute_flops += block_forward * tokens;
      if (block && l.recompute == Recompute::selective) recompute_flops += scores_forward * tokens;
      if (u == m.layers + 1)
        forward_flops += 2.0 * m.hidden * static_cast<double>(m.padded_vocab(l.tp)) * tokens;
      if (l.zero == 3) {  // FSDP: gather before each pass, reduce-scatter the gradient after B
        const double params = static_cast<double>(unit_parameters_per_rank(m, u, l.tp));
        const double gather =
            collective_cost("all_gather", params * prec.param_bytes, l.dp, dp_cost);
        c.forward_dp += gather;
        c.backward_dp +=
            gather + collective_cost("reduce_scatter", params * prec.grad_bytes, l.dp, dp_cost);
      }
    }
    if (fixed != nullptr) {
      c.forward_compute = fixed->forward;
      c.backward_compute = fixed->backward;
      c.input_grad_compute = fixed->backward_input;
      c.weight_compute = fixed->backward_weight;
    } else {
      c.forward_compute = forward_flops / l.tp / rate;
      c.backward_compute = (2 * forward_flops + recompute_flops) / l.tp / rate;
      c.input_grad_compute = (forward_flops + recompute_flops) / l.tp / rate;
      c.weight_compute = forward_flops / l.tp / rate;
    }
  }
  return costs;
}

// The cost of one boundary message from virtual stage @p from to @p to.
double boundary_send_cost(const PlanInput& input, int from, int to) {
  const Layout& l = input.layout;
  const CostModel pair = input.cluster.cost_model().for_group(
      {mesh_rank(l, 0, from % l.pp, 0), mesh_rank(l, 0, to % l.pp, 0)});
  return pair.alpha + pair.beta * static_cast<double>(boundary_bytes(input));
}

// The reductions after the pipeline on rank @p stage: the replicated
// gradients over TP, then each unit over DP.
double after_pipeline_reductions(const PlanInput& input, int stage) {
  const ModelShape& m = input.model;
  const Layout& l = input.layout;
  const CostModel world = input.cluster.cost_model();
  const CostModel tp_cost = world.for_group(tp_group_ranks(l, stage));
  const CostModel dp_cost = world.for_group(dp_group_ranks(l, stage));
  const std::vector<ch05::UnitRange> ranges = stage_units(input);
  const std::int64_t tokens = static_cast<std::int64_t>(l.microbatch) * m.seq;
  double seconds = 0;
  for (int c = 0; c < l.chunks; ++c) {
    const ch05::UnitRange& range = ranges[static_cast<std::size_t>(c * l.pp + stage)];
    for (int u = range.first; u < range.first + range.count; ++u)
      seconds += tp_calls_cost(
          tensor_parallel_unit_collectives(m, u, Pass::reduction, tokens,
                                           input.precision.grad_bytes, l.sequence_parallel),
          l.tp, tp_cost);
  }
  for (int c = 0; c < l.chunks; ++c) {
    const ch05::UnitRange& range = ranges[static_cast<std::size_t>(c * l.pp + stage)];
    for (int u = range.first; u < range.first + range.count; ++u) {
      const double params = static_cast<double>(unit_parameters_per_rank(m, u, l.tp));
      const double grads = params * input.precision.grad_bytes;
      if (l.zero == 0) seconds += collective_cost("all_reduce", grads, l.dp, dp_cost);
      if (l.zero == 1)
        seconds +=
            collective_cost("reduce_scatter", grads, l.dp, dp_cost) +
            collective_cost("all_gather", params * input.precision.param_bytes, l.dp, dp_cost);
    }
  }
  return seconds;
}

}  // namespace

ch05::Schedule layout_schedule(const PlanInput& input) {
  const Layout& l = input.layout;
  return ch05::make_schedule(l.schedule, l.pp, l.microbatches(), l.chunks);
}

StepClock simulate_step_clock(const PlanInput& input, const ch05::Schedule& schedule,
                              const ch05::ActionCosts* compute_override) {
  const Layout& l = input.layout;
  DTP_CHECK(schedule.stages == l.pp && schedule.chunks == l.chunks,
            "simulate_step_clock: the schedule has ", schedule.stages, " stages x ",
            schedule.chunks, " chunks but the layout pp ", l.pp, " x chunks ", l.chunks);
  const int p = l.pp, m = schedule.microbatches, V = schedule.virtual_stages();
  const std::vector<StageCosts> costs = stage_costs(input, compute_override);
  std::vector<double> forward_send(static_cast<std::size_t>(V)),
      backward_send(static_cast<std::size_t>(V));
  for (int v = 0; v < V; ++v) {
    if (v + 1 < V) forward_send[static_cast<std::size_t>(v)] = boundary_send_cost(input, v, v + 1);
    if (v > 0) backward_send[static_cast<std::size_t>(v)] = boundary_send_cost(input, v, v - 1);
  }
  // arrival[gradient][v][mb]: when virtual stage v's message for mb arrives; NaN until sent.
  const double unknown = std::numeric_limits<double>::quiet_NaN();
  std::vector<std::vector<double>> arrival[2];
  for (auto& by_stage : arrival)
    by_stage.assign(static_cast<std::size_t>(V),
                    std::vector<double>(static_cast<std::size_t>(m), unknown));
  StepClock result;
  result.stages.resize(static_cast<std::size_t>(p));
  std::vector<double> clock(static_cast<std::size_t>(p), 0.0);
  std::vector<std::size_t> next(static_cast<std::size_t>(p), 0);
  std::size_t remaining = 0;
  for (const auto& list : schedule.actions) remaining += list.size();
  while (remaining > 0) {
    bool progressed = false;
    for (int r = 0; r < p; ++r) {
      const auto& list = schedule.actions[static_cast<std::size_t>(r)];
      RankClock& rc = result.stages[static_cast<std::size_t>(r)];
      double& now = clock[static_cast<std::size_t>(r)];
      for (std::size_t& i = next[static_cast<std::size_t>(r)]; i < list.size(); ++i) {
        const ch05::Action& a = list[i];
        const int v = schedule.virtual_stage(r, a.chunk), mb = a.microbatch;
        const StageCosts& c = costs[static_cast<std::size_t>(v)];
        double ready = now;
        if (a.kind == ch05::ActionKind::forward && v > 0)
          ready = arrival[0][static_cast<std::size_t>(v - 1)][static_cast<std::size_t>(mb)];
        if (a.kind == ch05::ActionKind::backward && v + 1 < V)
          ready = arrival[1][static_cast<std::size_t>(v + 1)][static_cast<std::size_t>(mb)];
        if (std::isnan(ready)) break;  // its input has not been sent yet
        const double start = std::max(now, ready);
        rc.idle += start - now;
        now = start;
        double compute = 0, tp = 0, dp = 0;
        if (a.kind == ch05::ActionKind::forward) {
          compute = c.forward_compute;
          tp = c.forward_tp;
          dp = c.forward_dp;
        } else if (a.kind == ch05::ActionKind::backward) {
          compute = schedule.split_backward ? c.input_grad_compute : c.backward_compute;
          tp = c.backward_tp;
          dp = c.backward_dp;
        } else {
          compute = c.weight_compute;
        }
        now += compute + tp + dp;
        rc.compute += compute;
        rc.tp += tp;
        rc.dp += dp;
        if (a.kind == ch05::ActionKind::forward && v + 1 < V) {
          now += forward_send[static_cast<std::size_t>(v)];
          rc.pp += forward_send[static_cast<std::size_t>(v)];
          arrival[0][static_cast<std::size_t>(v)][static_cast<std::size_t>(mb)] = now;
        }
        if (a.kind == ch05::ActionKind::backward && v > 0) {
          now += backward_send[static_cast<std::size_t>(v)];
          rc.pp += backward_send[static_cast<std::size_t>(v)];
          arrival[1][static_cast<std::size_t>(v)][static_cast<std::size_t>(mb)] = now;
        }
        --remaining;
        progressed = true;
      }
    }
    if (!progressed) {
      std::string waits;
      for (int r = 0; r < p; ++r) {
        const auto& list = schedule.actions[static_cast<std::size_t>(r)];
        const std::size_t i = next[static_cast<std::size_t>(r)];
        if (i < list.size())
          waits += "; rank " + std::to_string(r) + " waits at " +
                   ch05::action_name(list[i], schedule.chunks);
      }
      DTP_CHECK(false, "simulate_step_clock: schedule '", schedule.name, "' deadlocks", waits);
    }
  }
  for (int r = 0; r < p; ++r) {
    RankClock& rc = result.stages[static_cast<std::size_t>(r)];
    const double reductions = after_pipeline_reductions(input, r);
    rc.dp += reductions;
    rc.end = clock[static_cast<std::size_t>(r)] + reductions;
    if (rc.end > result.stages[static_cast<std::size_t>(result.slowest)].end) result.slowest = r;
  }
  return result;
}

// --- the plan ------------------------------------------------------------------------

Plan make_plan(const PlanInput& input) {
  input.validate();
  const ModelShape& m = input.model;
  const Layout& l = input.layout;
  Plan plan;
  const ch05::Schedule schedule = layout_schedule(input);
  for (int stage = 0; stage < l.pp; ++stage) {
    const Memory memory = stage_memory_under(input, stage, schedule);
    if (memory.total() > plan.memory.total()) plan.memory = memory;
  }
  plan.fits = static_cast<double>(plan.memory.total()) <= input.cluster.hbm_bytes;
  const StepClock clock = simulate_step_clock(input, schedule);
  const RankClock& slowest = clock.stages[static_cast<std::size_t>(clock.slowest)];
  plan.step_seconds = clock.makespan();
  plan.compute_seconds = slowest.compute;
  plan.tp_seconds = slowest.tp;
  plan.pp_seconds = slowest.pp;
  plan.dp_seconds = slowest.dp;
  plan.bubble_seconds = slowest.idle;
  const double forward = forward_flops_per_token(m);
  plan.model_flops_per_token = 3 * forward;
  double recompute = 0;
  if (l.recompute == Recompute::full)
    recompute = forward - 2.0 * m.hidden * static_cast<double>(m.vocab);
  if (l.recompute == Recompute::selective) recompute = 4.0 * m.layers * m.seq * m.hidden;
  plan.hardware_flops_per_token = plan.model_flops_per_token + recompute;
  const double tokens = static_cast<double>(l.global_batch) * m.seq;
  plan.tokens_per_second = tokens / plan.step_seconds;
  const double per_gpu = plan.tokens_per_second / input.cluster.gpus();
  plan.mfu = per_gpu * plan.model_flops_per_token / input.cluster.peak_flops;
  plan.hfu = per_gpu * plan.hardware_flops_per_token / input.cluster.peak_flops;
  return plan;
}

std::vector<Candidate> search_layouts(const PlanInput& base) {
  std::vector<Candidate> fitting;
  const int gpus = base.cluster.gpus();
  for (int tp = 1; tp <= base.cluster.gpus_per_node; ++tp) {
    if (base.model.heads % tp != 0 || base.model.kv_heads % tp != 0 || gpus % tp != 0) continue;
    for (int pp = 1; pp <= base.model.layers; ++pp) {
      if (base.model.layers % pp != 0 || (gpus / tp) % pp != 0) continue;
      for (int microbatch : {1, 2, 4, 8}) {
        PlanInput input = base;
        input.units.clear();
        input.layout.tp = tp;
        input.layout.pp = pp;
        input.layout.dp = gpus / (tp * pp);
        input.layout.microbatch = microbatch;
        if (pp == 1) {
          input.layout.schedule = ch05::ScheduleKind::one_f_one_b;
          input.layout.chunks = 1;
        }
        try {
          input.validate();
        } catch (const Error&) {
          continue;  // this layout does not divide the model or the batch
        }
        Plan plan = make_plan(input);
        if (plan.fits) fitting.push_back({input.layout, plan});
      }
    }
  }
  std::stable_sort(fitting.begin(), fitting.end(), [](const Candidate& a, const Candidate& b) {
    return a.plan.tokens_per_second > b.plan.tokens_per_second;
  });
  return fitting;
}

}  // namespace dtp::plan
