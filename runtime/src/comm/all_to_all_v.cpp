// Comm::all_to_all_v: the checks every backend shares. A mixture-of-experts
// layer computes its counts from the router, so a wrong count is a likely
// student mistake; left to the backend it would read past a buffer or hang.
// Every rank therefore sees the whole count matrix first and reaches the
// same verdict, so a disagreement fails every rank with one message.
#include <algorithm>
#include <numeric>
#include <sstream>

#include "comm/backend.h"
#include "dtp/comm.h"
#include "dtp/error.h"
#include "dtp/trace.h"

namespace dtp {
namespace {

void check_counts(const char* name, const std::vector<std::int64_t>& counts, int world,
                  const Tensor& buffer, const char* buffer_name) {
  DTP_CHECK(static_cast<int>(counts.size()) == world, "all_to_all_v: ", name, " has ",
            counts.size(), " entries but the communicator has ", world,
            " ranks (one count per peer)");
  for (std::size_t r = 0; r < counts.size(); ++r)
    DTP_CHECK(counts[r] >= 0, "all_to_all_v: ", name, "[", r, "] is ", counts[r],
              "; counts must be >= 0");
  const std::int64_t total = std::accumulate(counts.begin(), counts.end(), std::int64_t{0});
  DTP_CHECK(total == buffer.numel(), "all_to_all_v: ", name, " add up to ", total, " elements but ",
            buffer_name, " holds ", buffer.numel(), " (", buffer.describe(), ")");
}

/// Row r of the result: rank r's send_counts then its recv_counts.
std::vector<std::vector<std::int64_t>> everyones_counts(CommBackend& backend,
                                                        const std::vector<std::int64_t>& send,
                                                        const std::vector<std::int64_t>& recv) {
  const int n = backend.size();
  std::vector<double> mine;
  for (std::int64_t c : send) mine.push_back(static_cast<double>(c));  // exact below 2^53
  for (std::int64_t c : recv) mine.push_back(static_cast<double>(c));
  Tensor shard = Tensor::from_values(mine).to(backend.device());
  Tensor all = Tensor::zeros({2 * n * n}, DType::f64, backend.device());
  // A check, not part of the algorithm: the clock is put back afterwards.
  const double clock = backend.clock();
  backend.all_gather(shard, all);
  backend.set_clock(clock);
  const std::vector<double> values = all.to_vector();
  std::vector<std::vector<std::int64_t>> rows(n);
  for (int r = 0; r < n; ++r)
    for (int k = 0; k < 2 * n; ++k)
      rows[r].push_back(static_cast<std::int64_t>(values[r * 2 * n + k]));
  return rows;
}

}  // namespace

void Comm::all_to_all_v(const Tensor& in, const std::vector<std::int64_t>& send_counts, Tensor& out,
                        const std::vector<std::int64_t>& recv_counts) {
  DTP_CHECK(in.defined() && out.defined(), "all_to_all_v: in or out is an undefined tensor");
  DTP_CHECK(in.dtype() == out.dtype(), "all_to_all_v: in is ", in.describe(), " but out is ",
            out.describe(), "; dtypes must match");
  const int n = size();
  check_counts("send_counts", send_counts, n, in, "in");
  check_counts("recv_counts", recv_counts, n, out, "out");
  trace::Scope span("all_to_all_v", "comm");

  const auto counts = everyones_counts(*backend_, send_counts, recv_counts);
  std::ostringstream wrong;
  int mismatches = 0;
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      const std::int64_t sent = counts[i][j], expected = counts[j][n + i];
      if (sent == expected) continue;
      if (++mismatches <= 4)
        wrong << "\n  rank " << i << " sends " << sent << " elements to rank " << j
              << " (its send_counts[" << j << "]) but rank " << j << " expects " << expected
              << " from rank " << i << " (its recv_counts[" << i << "])";
    }
  if (mismatches > 0) {
    std::ostringstream message;
    message << "all_to_all_v: the ranks disagree on " << mismatches << " count"
            << (mismatches > 1 ? "s" : "") << ":" << wrong.str()
            << (mismatches > 4 ? "\n  ..." : "")
            << "\nRank j's recv_counts[i] must equal rank i's send_counts[j] (exchange the counts "
               "first, "
               "e.g. with an all_to_all of one count per peer).";
    throw CommMismatch(message.str());
  }

  // The clock charges the busiest rank's link: what it sends to or receives from the others.
  double busiest = 0;
  for (int r = 0; r < n; ++r) {
    std::int64_t sent = 0, received = 0;
    for (int k = 0; k < n; ++k)
      if (k != r) sent += counts[r][k], received += counts[r][n + k];
    busiest = std::max(busiest, static_cast<double>(std::max(sent, received)));
  }
  backend_->all_to_all_v(in, send_counts, out, recv_counts,
                         busiest * static_cast<double>(in.element_size()));
  count_collective("all_to_all_v", in);
}

}  // namespace dtp
