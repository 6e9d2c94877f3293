// 1-bit Adam (10.3) and PowerSGD (10.4): optimizers whose data-parallel
// traffic is compressed, with error feedback so that what compression drops
// is sent later instead of lost.
//
// Both compute on the host. 1-bit Adam reads and writes its state with
// to_vector() and copy_from (its m and v sit beside the parameters, on the
// model's device); PowerSGD keeps Q and E on the host, copies each gradient
// there, and moves only P and Q to comm.device() for their all-reduces.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "10_compression/compression.h"
#include "dtp/nn_ops.h"

namespace dtp::ch10 {

namespace {

// Writes @p values (computed in double) into @p t, rounding each to t's dtype.
void store_values(Tensor& t, const std::vector<double>& values) {
  t.copy_from(Tensor::from_values(values, t.dtype(), t.device()).view(t.shape()));
}

// p = p - lr * m / (sqrt(v) + eps), element by element: the update both
// phases of 1-bit Adam share.
void adam_parameter_update(Tensor& params, const Tensor& m, const Tensor& v, double lr,
                           double eps) {
  std::vector<double> p = params.to_vector();
  const std::vector<double> mv = m.to_vector(), vv = v.to_vector();
  for (std::size_t i = 0; i < p.size(); ++i) p[i] = p[i] - lr * mv[i] / (std::sqrt(vv[i]) + eps);
  store_values(params, p);
}

}  // namespace

OneBitAdam::OneBitAdam(Comm& comm, GPT& model, const OneBitAdamConfig& config)
    : comm_(comm), model_(model), config_(config) {
  for (Unit* unit : model_.units()) {
    const Tensor& params = unit->params();
    m_.push_back(
        Tensor::zeros(params.shape(), params.dtype(), params.device(), MemoryCategory::optimizer));
    v_.push_back(
        Tensor::zeros(params.shape(), params.dtype(), params.device(), MemoryCategory::optimizer));
    compressors_.emplace_back(comm_, params.numel(), params.dtype());
  }
}

void OneBitAdam::step() {
  const OneBitAdamConfig& c = config_;
  std::vector<Unit*> units = model_.units();
  const bool frozen = compressing();
  for (std::size_t u = 0; u < units.size(); ++u) {
    Tensor& grads = units[u]->grads();
    // Warm-up is plain data-parallel Adam: the variance it settles on is
    // what the compressed phase divides by, so it must see the true mean.
    if (!frozen) comm_.all_reduce(grads, ReduceOp::avg);
    const std::vector<double> g = grads.to_vector();
    std::vector<double> m = m_[u].to_vector();
    for (std::size_t i = 0; i < m.size(); ++i) m[i] = c.beta1 * m[i] + (1 - c.beta1) * g[i];
    store_values(m_[u], m);
    if (frozen) {
      // The momentum is a running mean, so it tolerates the 1-bit
      // compressor's error far better than a single step's gradient; the
      // residual sends what this step's signs missed with the next step.
      compressors_[u].all_reduce(m_[u]);
    } else {
      std::vector<double> v = v_[u].to_vector();
      for (std::size_t i = 0; i < v.size(); ++i)
        v[i] = c.beta2 * v[i] + (1 - c.beta2) * g[i] * g[i];
      store_values(v_[u], v);
    }
    adam_parameter_update(units[u]->params(), m_[u], v_[u], c.lr, c.eps);
  }
  ++steps_;
}

namespace {

// Makes the columns of @p p ([rows, r]) orthonormal in place: Gram-Schmidt,
// column 0 first, in double.
void orthonormalize_columns(Tensor& p) {
  const std::int64_t rows = p.size(0), r = p.size(1);
  std::vector<double> a = p.to_vector();
  auto at = [&](std::int64_t i, std::int64_t j) -> double& {
    return a[static_cast<std::size_t>(i * r + j)];
  };
  for (std::int64_t j = 0; j < r; ++j) {
    for (std::int64_t k = 0; k < j; ++k) {
      double dot = 0;
      for (std::int64_t i = 0; i < rows; ++i) dot += at(i, j) * at(i, k);
      for (std::int64_t i = 0; i < rows; ++i) at(i, j) -= dot * at(i, k);
    }
    double norm = 0;
    for (std::int64_t i = 0; i < rows; ++i) norm += at(i, j) * at(i, j);
    norm = std::sqrt(norm);
    if (norm == 0) continue;  // a zero column has no direction: it stays 0
    for (std::int64_t i = 0; i < rows; ++i) at(i, j) /= norm;
  }
  store_values(p, a);
}

// The mean over the ranks of host tensor @p t, in place: a copy of it
// crosses the wire on comm.device() and the mean comes back.
void all_reduce_mean(Comm& comm, Tensor& t) {
  Tensor wire = t.to(comm.device());
  comm.all_reduce(wire, ReduceOp::avg);
  t.copy_from(wire);
}

}  // namespace

PowerSgd::PowerSgd(Comm& comm, GPT& model, int low_rank, std::uint64_t seed)
    : comm_(comm), model_(model), low_rank_(low_rank) {
  DTP_CHECK(low_rank_ >= 1, "PowerSgd: rank ", low_rank_, " must be at least 1");
  // One stream for every matrix, so that every rank draws the same Q.
  Rng rng(seed);
  std::vector<Unit*> units = model_.units();
  for (std::size_t u = 0; u < units.size(); ++u) {
    for (const ParamView& param : units[u]->parameters()) {
      if (param.shape.ndim() != 2) continue;
      const std::int64_t out = param.shape[0], in = param.shape[1];
      DTP_CHECK(low_rank_ <= std::min(out, in), "PowerSgd: rank ", low_rank_,
                " exceeds min(out, in) = ", std::min(out, in), " of unit '", units[u]->name(),
                "' parameter '", param.name, "' ", param.shape.str(), ": a rank-", low_rank_,
                " factorization needs r <= ", std::min(out, in));
      // Q and E live on the host, where the products that use them run.
      const DType dtype = units[u]->params().dtype();
      const Device host = Device::cpu();
      Matrix matrix{static_cast<int>(u), param.name,
                    Tensor::empty(Shape{in, low_rank_}, dtype, host, MemoryCategory::optimizer),
                    Tensor::zeros(param.shape, dtype, host, MemoryCategory::optimizer)};
      ops::fill_normal(matrix.q, 0, 1, rng);
      matrices_.push_back(std::move(matrix));
    }
  }
}

void PowerSgd::all_reduce_gradients() {
  std::vector<Unit*> units = model_.units();
  for (Matrix& matrix : matrices_) {
    Tensor g = units[static_cast<std::size_t>(matrix.unit)]->parameter(matrix.name).grad;
    const DType dtype = g.dtype();
    const std::int64_t out = g.size(0);
    // M carries what earlier steps' rank-r approximations missed.
    Tensor m = Tensor::empty(g.shape(), dtype);
    ops::add(g.to(Device::cpu()), matrix.error, m);
    // One power-iteration step from last step's Q: P spans M's dominant
    // columns, and a Q that already points there (the warm start) makes one
    // step enough. P and Q are what travel: r (out + in) values, not out in.
    Tensor p = Tensor::empty(Shape{out, low_rank_}, dtype);
    ops::matmul(m, matrix.q, p);
    all_reduce_mean(comm_, p);
    orthonormalize_columns(p);
    ops::matmul(m, p, matrix.q, /*transpose_a=*/true);
    all_reduce_mean(comm_, matrix.q);
    // G = P Q^T, the same on every rank; E = M - G is this rank's own.
    Tensor approximation = Tensor::empty(g.shape(), dtype);
    ops::matmul(p, matrix.q, approximation, false, /*transpose_b=*/true);
    matrix.error.copy_from(m);
    ops::axpy(matrix.error, -1.0, approximation);
    g.copy_from(approximation);
  }
  for (Unit* unit : units)
    for (ParamView& param : unit->parameters())
      if (param.shape.ndim() != 2) comm_.all_reduce(param.grad, ReduceOp::avg);
}

}  // namespace dtp::ch10
