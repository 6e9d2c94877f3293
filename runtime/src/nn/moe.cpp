// MoeMlp: router, host-side routing, and each expert run on exactly the rows
// routed to it. Gathering rows is an embedding lookup whose "table" is the
// activations and whose "ids" are token rows; adding expert outputs back is
// the embedding's backward (a scatter-add). Within one expert every row is
// distinct, so the scatter has no collisions and the result is deterministic.
#include "dtp/error.h"
#include "dtp/nn.h"

namespace dtp {

namespace {
std::vector<double> as_doubles(const std::vector<std::int32_t>& rows) {
  return std::vector<double>(rows.begin(), rows.end());
}

template <class T>
void append(std::vector<T>& to, const std::vector<T>& from) {
  to.insert(to.end(), from.begin(), from.end());
}

// Routes the N tokens in G equal consecutive groups, each by the rules of
// moe_route on its own, and merges them into one routing of N tokens (rows
// renumbered, load and importance averaged). Fills the balance loss (the
// groups' mean) and its gradient per group.
MoeRouting route_in_groups(const std::vector<double>& probs, int E, int k, double cf, int G,
                           double& balance, std::vector<double>& gradient) {
  const std::int64_t N = static_cast<std::int64_t>(probs.size()) / E;
  DTP_CHECK(N % G == 0, "MoeMlp forward: the batch's ", N, " tokens do not split into ", G,
            " equal routing groups (moe_groups)");
  const std::int64_t per_group = N / G;
  MoeRouting merged;
  merged.tokens = N;
  merged.experts = E;
  merged.top_k = k;
  merged.rows.resize(static_cast<std::size_t>(E));
  merged.weights.resize(static_cast<std::size_t>(E));
  merged.load.assign(static_cast<std::size_t>(E), 0.0);
  merged.importance.assign(static_cast<std::size_t>(E), 0.0);
  balance = 0;
  gradient.clear();
  for (int g = 0; g < G; ++g) {
    const auto first = probs.begin() + static_cast<std::ptrdiff_t>(g * per_group * E);
    const MoeRouting r = moe_route(
        std::vector<double>(first, first + static_cast<std::ptrdiff_t>(per_group * E)), E, k, cf);
    merged.capacity = r.capacity;  // the same for every group
    append(merged.choice, r.choice);
    append(merged.weight, r.weight);
    append(merged.kept, r.kept);
    for (std::size_t e = 0; e < static_cast<std::size_t>(E); ++e) {
      for (std::int32_t row : r.rows[e])
        merged.rows[e].push_back(static_cast<std::int32_t>(g * per_group + row));
      append(merged.weights[e], r.weights[e]);
      merged.load[e] += r.load[e] / G;
      merged.importance[e] += r.importance[e] / G;
      // d (mean over groups) / d probs[n][e] for n in group g.
      gradient.push_back(r.balance_gradient(static_cast<int>(e)) / G);
    }
    balance += r.balance_loss() / G;
  }
  return merged;
}
}  // namespace

MoeMlp::MoeMlp(const GPTConfig& config)
    : router(config.d_model, config.experts, false),
      router_std(config.init_std),
      experts(static_cast<std::size_t>(config.experts), Mlp(config)),
      top_k(config.top_k),
      capacity_factor(config.capacity_factor),
      aux_loss_coef(config.aux_loss_coef),
      groups(config.moe_groups),
      first_held(config.experts / config.expert_shards * config.expert_shard),
      held(config.experts / config.expert_shards) {}

void MoeMlp::declare(std::vector<ParamSpec>& layout, const std::string& prefix) const {
  router.declare(layout, prefix + ".router", router_std);
  for (std::size_t e = 0; e < experts.size(); ++e) {
    const std::size_t first_spec = layout.size();
    experts[e].declare(layout, prefix + ".expert." + std::to_string(e));
    if (!holds(static_cast<int>(e)))
      for (std::size_t i = first_spec; i < layout.size(); ++i) layout[i].held = false;
  }
}

void MoeMlp::bind(const Unit& unit, const std::string& prefix) {
  router.bind(unit, prefix + ".router");
  for (std::size_t e = 0; e < experts.size(); ++e)
    if (holds(static_cast<int>(e))) experts[e].bind(unit, prefix + ".expert." + std::to_string(e));
}

void MoeMlp::require_every_expert(const char* pass) const {
  DTP_CHECK(held == static_cast<int>(experts.size()), "MoeMlp ", pass,
            ": this layer holds only experts ", first_held, " to ", first_held + held - 1, " of ",
            experts.size(),
            " (GPTConfig::expert_shards); it runs through a MoeCore that reaches the others "
            "(expert parallelism)");
}

Tensor MoeMlp::forward(const Tensor& x, MoeSaved& saved) const {
  const std::int64_t C = router.in_features;
  const int E = static_cast<int>(experts.size());
  DTP_CHECK(E >= 1, "MoeMlp forward: the layer has no experts");
  require_every_expert("forward");
  DTP_CHECK(x.defined() && x.ndim() >= 1 && x.size(x.ndim() - 1) == C,
            "MoeMlp forward: input must be [..., ", C, "], got ", x.describe());
  const std::int64_t N = x.numel() / C;
  const Tensor rows_in = x.view(Shape{N, C});

  // Router: probabilities on the device, decisions on the host.
  Tensor logits = router.forward(rows_in, saved.router);
  saved.probs = Tensor::empty(logits.shape(), x.dtype(), x.device(), MemoryCategory::activations);
  ops::softmax_forward(logits, saved.probs);
  double balance = 0;
  saved.routing = route_in_groups(saved.probs.to_vector(), E, top_k, capacity_factor, groups,
                                  balance, saved.balance_gradient);
  saved.aux_loss = aux_loss_coef * balance;

  Tensor y = Tensor::zeros(Shape{N, C}, x.dtype(), x.device(), MemoryCategory::activations);
  saved.rows.assign(experts.size(), Tensor());
  saved.weights.assign(experts.size(), Tensor());
  saved.outputs.assign(experts.size(), Tensor());
  saved.experts.assign(experts.size(), MlpSaved{});
  for (std::size_t e = 0; e < experts.size(); ++e) {
    const auto& taken = saved.routing.rows[e];
    if (taken.empty()) continue;  // an idle expert: no rows, no work, no gradient
    const std::int64_t n_e = static_cast<std::int64_t>(taken.size());
    saved.rows[e] = Tensor::from_values(as_doubles(taken), DType::i32, x.device());
    saved.weights[e] = Tensor::from_values(saved.routing.weights[e], x.dtype(), x.device());
    Tensor gathered =
        Tensor::empty(Shape{n_e, C}, x.dtype(), x.device(), MemoryCategory::activations);
    ops::embedding_forward(saved.rows[e], rows_in, gathered);
    saved.outputs[e] = experts[e].forward(gathered, saved.experts[e]);
    Tensor weighted = saved.outputs[e].clone();
    ops::scale_rows(weighted, saved.weights[e]);
    ops::embedding_backward(saved.rows[e], weighted, y);  // y[row] += weight * expert(x[row])
  }
  return y.view(x.shape());
}

Tensor MoeMlp::backward(const Tensor& dy, MoeSaved& saved, double loss_scale,
                        PendingWeightGrads* defer) const {
  DTP_CHECK(saved.probs.defined(),
            "MoeMlp backward: no saved activations (forward not run, or already released)");
  require_every_expert("backward");
  const std::int64_t C = router.in_features;
  const MoeRouting& routing = saved.routing;
  const std::int64_t N = routing.tokens;
  const std::size_t E = experts.size();
  DTP_CHECK(dy.defined() && dy.numel() == N * C, "MoeMlp backward: dy must have ", N, " rows of ",
            C, ", got ", dy.describe());
  const Tensor dy_rows = dy.view(Shape{N, C});
  Tensor dx = Tensor::zeros(Shape{N, C}, dy.dtype(), dy.device(), MemoryCategory::other);

  // d probs[n][e]: the balance loss's share for every token, plus, where
  // token n was kept by expert e, dy[n] . expert_e(x[n]) (the combine weight's gradient).
  std::vector<double> dprobs(static_cast<std::size_t>(N) * E, 0.0);
  const std::int64_t per_group = N / groups;
  for (std::int64_t n = 0; n < N; ++n)
    for (std::size_t e = 0; e < E; ++e)
      dprobs[static_cast<std::size_t>(n) * E + e] =
          loss_scale * aux_loss_coef *
          saved.balance_gradient[static_cast<std::size_t>(n / per_group) * E + e];
  for (std::size_t e = 0; e < E; ++e) {
    const auto& taken = routing.rows[e];
    if (taken.empty()) continue;
    const std::int64_t n_e = static_cast<std::int64_t>(taken.size());
    Tensor d_out = Tensor::empty(Shape{n_e, C}, dy.dtype(), dy.device(), MemoryCategory::other);
    ops::embedding_forward(saved.rows[e], dy_rows, d_out);  // the rows of dy this expert wrote
    Tensor d_weight = Tensor::empty(Shape{n_e}, dy.dtype(), dy.device(), MemoryCategory::other);
    ops::row_dot(d_out, saved.outputs[e], d_weight);
    const std::vector<double> d_weights = d_weight.to_vector();
    for (std::int64_t i = 0; i < n_e; ++i)
      dprobs[static_cast<std::size_t>(taken[static_cast<std::size_t>(i)]) * E + e] +=
          d_weights[static_cast<std::size_t>(i)];
    ops::scale_rows(d_out, saved.weights[e]);
    Tensor d_in = experts[e].backward(d_out, saved.experts[e], defer);
    ops::embedding_backward(saved.rows[e], d_in, dx);
  }

  // Through the softmax and the router.
  Tensor d_probs = Tensor::from_values(dprobs, dy.dtype(), dy.device()).view(saved.probs.shape());
  Tensor d_logits =
      Tensor::empty(saved.probs.shape(), dy.dtype(), dy.device(), MemoryCategory::other);
  ops::softmax_backward(saved.probs, d_probs, d_logits);
  Tensor dx_router = router.backward(d_logits, saved.router, defer);
  ops::axpy(dx, 1.0, dx_router);
  saved = MoeSaved{};
  return dx.view(dy.shape());
}

}  // namespace dtp
