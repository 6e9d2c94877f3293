// Puzzle 8.4: LoRA under data parallelism. Every rank holds the same frozen
// base, so only the adapters' gradients need averaging: one asynchronous
// all-reduce per block, started the moment the block's backward is done,
// so it overlaps the backward of the blocks below.
#include "08_lora/lora.h"

namespace dtp::ch08 {

LoraDataParallel::LoraDataParallel(Comm& comm, GPT& model, LoraModel& lora)
    : comm_(comm), model_(model), lora_(lora) {
  const std::size_t blocks = static_cast<std::size_t>(model.num_blocks());
  requests_.resize(blocks);
  started_.assign(blocks, false);
  model_.on_grad_ready([this](Unit& unit) { on_unit_ready(unit); });
}

LoraDataParallel::~LoraDataParallel() {
  for (Request& request : requests_) {
    try {
      if (request.valid()) request.wait();
    } catch (...) {  // a failed peer: the launch reports it; never throw here
    }
  }
  model_.clear_grad_ready_hooks();
}

void LoraDataParallel::on_unit_ready(Unit& unit) {
  const int block = unit.index() - 1;  // units: embedding, block.0 ..., head
  if (block < 0 || block >= model_.num_blocks()) return;
  Tensor grads = lora_.buffers()[static_cast<std::size_t>(block)].grads;
  requests_[static_cast<std::size_t>(block)] = comm_.iall_reduce(grads, ReduceOp::avg);
  started_[static_cast<std::size_t>(block)] = true;
}

void LoraDataParallel::finish() {
  for (std::size_t block = 0; block < requests_.size(); ++block) {
    DTP_CHECK(started_[block], "LoRA DDP: block ", block,
              "'s adapter gradients were never all-reduced since the "
              "last finish() (did its grad-ready hook run? finish() once per backward)");
    requests_[block].wait();
    started_[block] = false;
  }
}

}  // namespace dtp::ch08
