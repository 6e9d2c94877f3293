// Puzzle 1.7: parameter-server all-reduce.
//
// The simplest all-reduce and the baseline the others beat: everyone sends all
// of x to one server, the server adds and sends the total back. The server
// receives and sends (N - 1) * S bytes through its one link, so its cost grows
// with N while every other rank sits idle.
#include "01_collectives/collectives.h"

namespace dtp::ch01 {
namespace {

constexpr int kPushTag = 700;
constexpr int kPullTag = 701;

}  // namespace

void parameter_server_all_reduce(Comm& comm, Tensor& x, int root) {
  const int world = comm.size();
  Tensor flat = x.flatten();
  if (comm.rank() != root) {
    comm.send(flat, root, kPushTag);
    comm.recv(flat, root, kPullTag);
    return;
  }
  Tensor incoming = Tensor::empty(flat.shape(), flat.dtype(), flat.device(), MemoryCategory::comm);
  for (int r = 0; r < world; ++r) {
    if (r == root) continue;
    comm.recv(incoming, r, kPushTag);
    ops::accumulate(flat, incoming);
  }
  for (int r = 0; r < world; ++r) {
    if (r != root) comm.send(flat, r, kPullTag);
  }
}

}  // namespace dtp::ch01
