// Chapter 08 — LoRA.
//
// Replace each `throw dtp::NotSolved(...)` with your code, then run
//     ./dtp grade 08
// to see which puzzles pass. The contract is in chapters/08_lora/lora.h; the
// lesson (the low-rank update, memory, merging, LoRA under DDP) is in
// chapters/08_lora/README.md.
//
// Tools you may use:
//   ops::matmul(a, b, out, transpose_a, transpose_b, alpha, beta)
//                                    out = alpha * op(a) op(b) + beta * out; a tensor
//                                    [..., k] is read as a matrix of rows of k
//   Tensor::empty(shape, dtype, device, MemoryCategory::activations)
//   model.units(), model.block(i), unit->freeze(), target_linear(block, name)
//   Tensor::zeros({n}, dtype, device, MemoryCategory::params), t.slice(offset, n).view(shape)
//   Rng rng(Rng::derive(seed, block)); ops::fill_normal(t, 0.0, std, rng)
//   model.on_grad_ready([](Unit& u) {...}), comm.iall_reduce(t, ReduceOp::avg)
// The `(void)x;` lines only silence unused-parameter warnings: delete them.
#include "08_lora/lora.h"

namespace dtp::ch08 {

Tensor lora_forward(const Tensor& x, const Tensor& a, const Tensor& b, double scale, Tensor& y) {
  // About 4 lines.
  // h = x A^T as a fresh [rows, r] activation (rows = x.numel() / in,
  // r = a.size(0); matmul reads x as rows of in), then y += scale * h B^T.
  // Return h.
  (void)x, (void)a, (void)b, (void)scale, (void)y;
  throw dtp::NotSolved("8.1 lora_linear");
}

void lora_backward_input(const Tensor& dy, const Tensor& a, const Tensor& b, double scale,
                         Tensor& dx) {
  // About 3 lines: g = dy B ([..., r]), then dx += scale * g A.
  (void)dy, (void)a, (void)b, (void)scale, (void)dx;
  throw dtp::NotSolved("8.1 lora_linear");
}

void lora_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& h, const Tensor& b,
                          double scale, Tensor& grad_a, Tensor& grad_b) {
  // About 4 lines: g = dy B again; dA += scale * g^T x; dB += scale * dy^T h.
  (void)dy, (void)x, (void)h, (void)b, (void)scale, (void)grad_a, (void)grad_b;
  throw dtp::NotSolved("8.1 lora_linear");
}

void merge(Tensor& weight, const Tensor& a, const Tensor& b, double scale) {
  // About 1 line: W += scale * B A.
  (void)weight, (void)a, (void)b, (void)scale;
  throw dtp::NotSolved("8.2 merge");
}

void unmerge(Tensor& weight, const Tensor& a, const Tensor& b, double scale) {
  // About 1 line: W -= scale * B A.
  (void)weight, (void)a, (void)b, (void)scale;
  throw dtp::NotSolved("8.2 merge");
}

LoraModel::LoraModel(GPT& model, const LoraConfig& config) : model_(model), config_(config) {
  // About 35 lines.
  // 1. Check config.rank >= 1 and every target (target_linear throws for a
  //    bad one) before changing anything.
  // 2. Freeze every unit of the model.
  // 3. For each block i: count its adapters' elements (r * in for A, out * r
  //    for B, per target), make one params buffer and one grads buffer of
  //    that many elements (the model's dtype and device; MemoryCategory
  //    params and grads; zeros), and for each target in order make a
  //    LoraLinear whose a, b, grad_a, grad_b are views at the right offsets
  //    (A then B). Draw A from normal(0, 1/sqrt(in)) with
  //    Rng(Rng::derive(config.seed, i)), targets in order; B stays 0.
  // 4. Attach: target_linear(block, name).adapter = the LoraLinear.
  throw dtp::NotSolved("8.3 lora_model");
}

LoraModel::~LoraModel() {
  // About 2 lines: set every adapted Linear's adapter back to nullptr.
}

std::vector<ParamBuffer> LoraModel::buffers() const {
  // About 3 lines: {"block.<i>.lora", params_[i], grads_[i]} per block.
  throw dtp::NotSolved("8.3 lora_model");
}

std::int64_t LoraModel::trainable_parameters() const {
  // About 3 lines.
  throw dtp::NotSolved("8.3 lora_model");
}

void LoraModel::zero_grad() {
  // About 1 line.
  throw dtp::NotSolved("8.3 lora_model");
}

const LoraLinear& LoraModel::adapter(int block, const std::string& target) const {
  // About 5 lines; throw (DTP_CHECK) naming the adapted targets when missing.
  (void)block, (void)target;
  throw dtp::NotSolved("8.3 lora_model");
}

void LoraModel::merge_all() {
  // About 5 lines: merge each adapter into its Linear's weight, detach it.
  throw dtp::NotSolved("8.2 merge");
}

void LoraModel::unmerge_all() {
  // About 5 lines: the reverse.
  throw dtp::NotSolved("8.2 merge");
}

LoraDataParallel::LoraDataParallel(Comm& comm, GPT& model, LoraModel& lora)
    : comm_(comm), model_(model), lora_(lora) {
  // About 4 lines: size requests_ and started_ per block, then
  // model_.on_grad_ready([this](Unit& u) { on_unit_ready(u); });
  throw dtp::NotSolved("8.4 lora_ddp");
}

LoraDataParallel::~LoraDataParallel() {
  // About 3 lines: wait for requests in flight (catch and drop errors: never
  // throw from a destructor), then model_.clear_grad_ready_hooks().
}

void LoraDataParallel::on_unit_ready(Unit& unit) {
  // About 6 lines: for a block unit (index 1..layers), start
  // comm_.iall_reduce(that block's adapter gradient buffer, ReduceOp::avg):
  // lora_.buffers()[unit.index() - 1].grads (a handle to the buffer itself).
  (void)unit;
  throw dtp::NotSolved("8.4 lora_ddp");
}

void LoraDataParallel::finish() {
  // About 6 lines: check every block started (DTP_CHECK naming it), wait, re-arm.
  throw dtp::NotSolved("8.4 lora_ddp");
}

}  // namespace dtp::ch08
