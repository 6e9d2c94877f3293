#include "dtp/copy_lane.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "comm/async_worker.h"
#include "dtp/launch.h"
#include "dtp/memory.h"
#include "dtp/trace.h"

namespace dtp {

struct CopyLane::State {
  AsyncWorker worker{std::max(current_rank(), 0), 2};
  // Each queued copy's request and its source, held until drain().
  std::vector<std::pair<std::shared_ptr<RequestState>, Tensor>> queued;
};

CopyLane::CopyLane() : state_(std::make_unique<State>()) {}

CopyLane::~CopyLane() {
  try {
    drain();
  } catch (...) {  // a destructor must not throw; a failed copy was never used
  }
}

Tensor CopyLane::copy_to(const Tensor& source, Device to, MemoryCategory category,
                         const std::string& name) {
  Tensor destination = Tensor::empty(source.shape(), source.dtype(), to, category);
  auto request = state_->worker.submit([source, destination, name]() mutable {
    trace::Scope span(name, "copy");
    destination.copy_from(source);
  });
  state_->queued.emplace_back(std::move(request), source);
  return destination;
}

void CopyLane::drain() {
  // Every copy is waited for before the first error is rethrown: none may
  // still write into a destination its caller is about to drop.
  if (state_->queued.empty()) return;
  trace::Scope span("drain", "copy");
  std::exception_ptr first;
  for (auto& [request, source] : state_->queued) {
    try {
      request->wait();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  state_->queued.clear();
  if (first) std::rethrow_exception(first);
}

std::size_t CopyLane::queued() const { return state_->queued.size(); }

CopyLane& copy_lane() {
  thread_local CopyLane lane;
  return lane;
}

}  // namespace dtp
