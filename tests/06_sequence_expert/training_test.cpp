// Sequence and expert parallelism inside the GPT: `dtp train --strategy sp`
// and `--strategy ep` run the chapter's puzzle classes in every block
// (drivers/06_sequence_expert/). Each run is compared with single-device
// training of the same global batch: first the gradients right after the
// first synchronization (a wrong scale shows as a ratio, a missing exchange
// as this rank's own gradient), then the loss, parameters and gradients after
// K steps, with every replicated parameter bitwise equal across the group
// after every step. Expert parallelism on m ranks routes each rank's tokens
// as one group, so its single-device peer routes in m groups (moe_groups).
// The model runs on the rank's device in checker_dtype(), the single-device
// run in the same dtype, compared within support/training.h's tolerances
// for that dtype: in f32 they bound sums of up to 288 tokens' terms added in
// another order, and these runs add at most 64 tokens' (the attention's
// online softmax and the experts' gathered rows change the order too).
// Measured in f32 at most 8.9e-8 (first-step gradients; the bound is 4e-6 +
// 2e-5 |e|), 3.7e-8 after 3 steps (5e-6 + 2e-5 |e|).
#include <map>

#include "drivers/06_sequence_expert/ep_strategy.h"
#include "drivers/06_sequence_expert/sp_strategy.h"
#include "moe_checks.h"

namespace dtp::testing::ch06 {
namespace {

// --- sequence parallelism ---------------------------------------------------------------------

// tiny_config with 4 heads (Ulysses up to 4 ranks) and 8 positions (zigzag:
// 2 x 4 chunks), on @p on (a rank's comm.device()) in checker_dtype(on).
TrainConfig sp_config(Device on = checker_device()) {
  TrainConfig config = tiny_config(/*global_batch=*/4, /*steps=*/3);
  config.model.heads = 4;
  config.model.device = on;
  config.model.dtype = checker_dtype(on);
  return config;
}

struct SpCase {
  SequenceParallelKind kind;
  int n;
  int ulysses = 2;
  std::string str() const {
    return std::string("--sp-kind ") + sequence_parallel_kind_name(kind) + " --sp " +
           std::to_string(n) +
           (kind == SequenceParallelKind::hybrid ? " --sp-ulysses " + std::to_string(ulysses) : "");
  }
  SequenceParallelRunOptions options() const { return {.sp = n, .kind = kind, .ulysses = ulysses}; }
};

std::vector<SpCase> sp_cases(SequenceParallelKind kind) {
  std::vector<SpCase> cases;
  if (kind == SequenceParallelKind::hybrid)
    cases = {{kind, 4, 2}, {kind, 2, 2}};
  else
    cases = {{kind, 2}, {kind, 4}};
  std::vector<SpCase> fitting;
  for (const SpCase& c : cases)
    if (world_fits(c.n)) fitting.push_back(c);
  return fitting;
}

GradientWording sp_wording() {
  GradientWording w;
  w.local =
      "this rank's own gradient (the loss of its positions alone), never averaged over the group";
  w.local_example = "this rank's own gradient";
  w.other =
      "neither the single-device gradient, a multiple of it, nor this rank's own: are the "
      "attention's "
      "dk and dv for other ranks' positions lost or sent to the wrong rank (the backward), or the "
      "output of some positions wrong (the forward)?";
  return w;
}

// Every unit's gradient as its backward finishes: before the group's average.
void capture_local(GPT& model, UnitGradients& local) {
  local.assign(model.units().size(), {});
  model.on_grad_ready([&local](Unit& unit) {
    local[static_cast<std::size_t>(unit.index())] = unit.grads().to_vector();
  });
}

void first_step_equals_single_device(SequenceParallelKind kind, const std::string& puzzle) {
  const TrainConfig config = sp_config();
  const UnitGradients expected = first_step_gradients(config);
  for (const SpCase& c : sp_cases(kind))
    run_and_report(puzzle + " in the GPT, first-step gradients, " + c.str(), c.n, [&](Comm& sp) {
      SequenceParallelTrainer trainer(sp_config(sp.device()), sp, c.options());
      UnitGradients local;
      capture_local(trainer.model(), local);
      trainer.forward_backward();
      return check_first_step_gradients(expected, local, trainer.model(), sp.rank(), sp.size(), 1,
                                        sp_wording());
    });
}

void training_equals_single_device(SequenceParallelKind kind, const std::string& puzzle) {
  const TrainConfig config = sp_config();
  const ModelState expected = single_device(config);
  for (const SpCase& c : sp_cases(kind))
    run_and_report(
        puzzle + " in the GPT, " + std::to_string(config.steps) + " steps, " + c.str(), c.n,
        [&](Comm& sp) {
          SequenceParallelTrainer trainer(sp_config(sp.device()), sp, c.options());
          std::vector<double> losses;
          for (std::int64_t s = 0; s < config.steps; ++s) {
            losses.push_back(trainer.step().loss);
            std::vector<std::pair<std::string, Tensor>> params;
            for (Unit* unit : trainer.model().units())
              for (const ParamView& p : unit->parameters())
                params.push_back({"step " + std::to_string(s + 1) + " unit '" + unit->name() +
                                      "' '" + p.name + "'",
                                  p.value});
            const std::string m = check_replicas_agree(
                sp, params,
                "The ranks' gradients are averaged before the update, so their attention "
                "results must be the same numbers: does one rank compute in another order?",
                "SP");
            if (!m.empty()) return "rank " + std::to_string(sp.rank()) + ":" + m;
          }
          return compare_with_single(expected, trainer.model(), losses, sp.rank());
        });
}

TEST(Puzzle6_1_ulysses, InTheGptFirstStepGradientsEqualTheSingleDeviceGradients) {
  first_step_equals_single_device(SequenceParallelKind::ulysses, "6.1 Ulysses");
}
TEST(Puzzle6_1_ulysses, InTheGptTrainingEqualsSingleDeviceTraining) {
  training_equals_single_device(SequenceParallelKind::ulysses, "6.1 Ulysses");
}
TEST(Puzzle6_3_ring_backward, InTheGptFirstStepGradientsEqualTheSingleDeviceGradients) {
  first_step_equals_single_device(SequenceParallelKind::ring, "6.2-6.3 ring attention");
}
TEST(Puzzle6_3_ring_backward, InTheGptTrainingEqualsSingleDeviceTraining) {
  training_equals_single_device(SequenceParallelKind::ring, "6.2-6.3 ring attention");
}
TEST(Puzzle6_4_zigzag, InTheGptFirstStepGradientsEqualTheSingleDeviceGradients) {
  first_step_equals_single_device(SequenceParallelKind::zigzag, "6.4 zigzag");
}
TEST(Puzzle6_4_zigzag, InTheGptTrainingEqualsSingleDeviceTraining) {
  training_equals_single_device(SequenceParallelKind::zigzag, "6.4 zigzag");
}
TEST(Puzzle6_5_hybrid, InTheGptFirstStepGradientsEqualTheSingleDeviceGradients) {
  first_step_equals_single_device(SequenceParallelKind::hybrid, "6.5 hybrid");
}
TEST(Puzzle6_5_hybrid, InTheGptTrainingEqualsSingleDeviceTraining) {
  training_equals_single_device(SequenceParallelKind::hybrid, "6.5 hybrid");
}

// --- expert parallelism -----------------------------------------------------------------------

// tiny_config with 4 experts, top-2 and a capacity that drops choices, on
// @p on (a rank's comm.device()) in checker_dtype(on).
TrainConfig ep_config(int routing_groups, Device on = checker_device()) {
  TrainConfig config = tiny_config(/*global_batch=*/8, /*steps=*/3);
  config.model.device = on;
  config.model.dtype = checker_dtype(on);
  config.model.experts = 4;
  config.model.top_k = 2;
  config.model.capacity_factor = 1.0;
  config.model.aux_loss_coef = 0.05;
  config.model.moe_groups = routing_groups;
  return config;
}

std::vector<int> ep_worlds() {
  std::vector<int> worlds;
  for (int m : {2, 4})
    if (world_fits(m)) worlds.push_back(m);
  return worlds;
}

// The single-device model's layout: where each named parameter sits in its
// unit's flat vectors, and every expert's size. An ep rank's model holds
// only its own experts, so its offsets differ from these after the prefix.
struct WholeLayout {
  std::vector<std::map<std::string, std::int64_t>> offset;  // per unit
  std::vector<std::map<int, std::int64_t>> expert_numel;    // per unit: expert -> its parameters
  std::int64_t parameters = 0;                              // Psi
  std::int64_t element_size = 0;
};

// Built before the ranks start, so that its model is in no rank's memory tracker.
WholeLayout whole_layout(const TrainConfig& config) {
  WholeLayout layout;
  Trainer whole(config);
  layout.element_size = static_cast<std::int64_t>(dtype_size(config.model.dtype));
  for (const Unit* unit : whole.model().units()) {
    layout.offset.emplace_back();
    layout.expert_numel.emplace_back();
    for (const ParamView& p : unit->parameters()) {
      layout.offset.back()[p.name] = p.offset;
      if (expert_of(p.name) >= 0) layout.expert_numel.back()[expert_of(p.name)] += p.shape.numel();
    }
    layout.parameters += unit->numel();
  }
  return layout;
}

bool owned(int expert, const ExpertParallelTrainer& trainer) {
  return expert >= trainer.first_expert() &&
         expert < trainer.first_expert() + trainer.local_experts();
}

// "" when this rank's tracker holds the parameters and gradients of the
// replicated part and of its own experts, and nothing of the other ranks' experts.
std::string check_ep_memory(const WholeLayout& whole, const ExpertParallelTrainer& trainer) {
  std::int64_t others = 0;  // parameters of the experts other ranks hold
  for (const auto& experts : whole.expert_numel)
    for (const auto& [e, numel] : experts)
      if (!owned(e, trainer)) others += numel;
  const std::int64_t want = (whole.parameters - others) * whole.element_size;
  std::string m;
  for (MemoryCategory c : {MemoryCategory::params, MemoryCategory::grads}) {
    const std::int64_t got = current_memory_tracker()->live(c);
    if (got == want) continue;
    m +=
        "\n    live " + std::string(memory_category_name(c)) + " bytes: expected " +
        std::to_string(want) + " (everything but the other ranks' experts), got " +
        std::to_string(got) +
        (got - want == others * whole.element_size ? ": every expert's, the other ranks' too" : "");
  }
  return m;
}

GradientWording ep_wording() {
  GradientWording w;
  w.local = "this rank's own gradient (its tokens alone), never averaged over the group";
  w.local_example = "this rank's own gradient";
  w.other =
      "neither the single-device gradient, a multiple of it, nor this rank's own: does an expert "
      "miss the share of some rank's tokens (the backward's exchange), or a token the gradient of "
      "an "
      "expert on another rank (the combine's backward)?";
  return w;
}

TEST(Puzzle6_7_expert_parallel, InTheGptFirstStepGradientsEqualSingleDeviceRoutingInGroups) {
  for (int m : ep_worlds()) {
    const UnitGradients expected = first_step_gradients(ep_config(m));
    const WholeLayout whole = whole_layout(ep_config(m));
    run_and_report(
        "6.7 expert parallelism in the GPT, first-step gradients, --world " + std::to_string(m), m,
        [&](Comm& ep) {
          ExpertParallelTrainer trainer(ep_config(1, ep.device()), ep);
          UnitGradients local;
          capture_local(trainer.model(), local);
          trainer.forward_backward();
          const UnitGradients got = gradients_of(trainer.model());
          std::vector<Unit*> units = trainer.model().units();
          std::vector<GradientPiece> pieces;
          for (std::size_t u = 0; u < units.size(); ++u)
            for (const ParamView& p : units[u]->parameters()) {  // this rank's experts only
              const auto o = static_cast<std::size_t>(p.offset);
              const auto on_one_device = static_cast<std::size_t>(whole.offset[u].at(p.name));
              const std::string name = "'" + units[u]->name() + "' '" + p.name + "'";
              pieces.push_back({name, &expected[u][on_one_device], &local[u][o], &got[u][o],
                                p.shape.numel(), [name](std::int64_t i) {
                                  return "unit " + name + " element " + std::to_string(i);
                                }});
            }
          return judge_gradient_pieces(pieces,
                                       "gradients after synchronization (experts on their owner)",
                                       ep.rank(), m, 1, ep_wording(), model_dtype(trainer.model()));
        });
  }
}

TEST(Puzzle6_7_expert_parallel, InTheGptTrainingEqualsSingleDeviceTrainingRoutingInGroups) {
  for (int m : ep_worlds()) {
    const ModelState expected = single_device(ep_config(m));
    const WholeLayout whole = whole_layout(ep_config(m));
    run_and_report(
        "6.7 expert parallelism in the GPT, 3 steps, --world " + std::to_string(m), m,
        [&](Comm& ep) {
          ExpertParallelTrainer trainer(ep_config(1, ep.device()), ep);
          const Closeness within = training_tolerance(model_dtype(trainer.model()));
          const std::string who =
              "rank " + std::to_string(ep.rank()) + " (experts " +
              std::to_string(trainer.first_expert()) + ".." +
              std::to_string(trainer.first_expert() + trainer.local_experts() - 1) + ")";
          if (const std::string m = check_ep_memory(whole, trainer); !m.empty())
            return who + " holds the wrong share of the model:" + m;
          std::vector<double> losses;
          std::vector<Unit*> units = trainer.model().units();
          for (std::int64_t s = 0; s < 3; ++s) {
            losses.push_back(trainer.step().loss);
            std::vector<std::pair<std::string, Tensor>> replicated;
            for (Unit* unit : units)
              for (const ParamView& p : unit->parameters())
                if (expert_of(p.name) < 0)
                  replicated.push_back({"step " + std::to_string(s + 1) + " unit '" + unit->name() +
                                            "' '" + p.name + "'",
                                        p.value});
            const std::string m = check_replicas_agree(
                ep, replicated,
                "Everything but the experts is replicated: the router's gradient must be averaged "
                "over the group like every other one.",
                "EP");
            if (!m.empty()) return who + ":" + m;
          }
          std::string m;
          for (std::size_t s = 0; s < losses.size(); ++s)
            if (!within.holds(expected.losses[s], losses[s]))
              m += "\n    step " + std::to_string(s + 1) +
                   " loss (mean over ranks, balance losses included): expected " +
                   number(expected.losses[s]) + ", got " + number(losses[s]);
          for (std::size_t u = 0; u < units.size(); ++u) {
            const std::vector<double> params = units[u]->params().to_vector(),
                                      grads = units[u]->grads().to_vector();
            for (const ParamView& p : units[u]->parameters()) {  // this rank's experts only
              for (std::int64_t i = 0; i < p.shape.numel(); ++i) {
                const auto at = static_cast<std::size_t>(p.offset + i);
                const auto want =
                    static_cast<std::size_t>(whole.offset[u].at(p.name) + i);  // on one device
                const bool param_ok = within.holds(expected.params[u][want], params[at]);
                if (param_ok && within.holds(expected.grads[u][want], grads[at])) continue;
                m += "\n    unit '" + units[u]->name() + "' '" + p.name + "' element " +
                     std::to_string(i) + " " + (param_ok ? "gradient" : "value") +
                     " after 3 steps: expected " +
                     number(param_ok ? expected.grads[u][want] : expected.params[u][want]) +
                     ", got " + number(param_ok ? grads[at] : params[at]);
                break;
              }
            }
          }
          if (m.empty()) return std::string();
          return who + " differs from single-device training routed in " +
                 std::to_string(ep.size()) +
                 " groups (GPTConfig::moe_groups) on the same global batch" +
                 tolerance_note(model_dtype(trainer.model()), within) + ":" + m;
        });
  }
}

}  // namespace
}  // namespace dtp::testing::ch06
