// A Comm::all_to_all_v exchange whose every element says where it came from,
// shared by the thread, MPI and GPU tests: rank i sends rank j
// count(i, j) elements (0 to 3, so some pairs send nothing), and element k
// of that block is 1000 i + 10 j + k.
#pragma once

#include <gtest/gtest.h>

#include <vector>

#include "dtp/dtp.h"

namespace dtp::testing {

struct AllToAllVCase {
  static std::int64_t count(int from, int to) { return (from + 2 * to + 1) % 4; }
  static double value(int from, int to, std::int64_t k) {
    return 1000.0 * from + 10.0 * to + static_cast<double>(k);
  }

  AllToAllVCase(int rank, int world, DType dtype = DType::f64, Device device = Device::cpu())
      : rank(rank), world(world) {
    std::vector<double> values;
    for (int to = 0; to < world; ++to) {
      send_counts.push_back(count(rank, to));
      recv_counts.push_back(count(to, rank));
      for (std::int64_t k = 0; k < count(rank, to); ++k) values.push_back(value(rank, to, k));
    }
    std::int64_t received = 0;
    for (std::int64_t c : recv_counts) received += c;
    in = values.empty() ? Tensor::zeros({0}, dtype, device)
                        : Tensor::from_values(values, dtype).to(device);
    out = Tensor::full({received}, -1.0, dtype, device);
  }

  /// out holds, for every source in rank order, its block for this rank.
  ::testing::AssertionResult received_everything() const {
    const std::vector<double> got = out.to_vector();
    std::size_t at = 0;
    for (int from = 0; from < world; ++from)
      for (std::int64_t k = 0; k < count(from, rank); ++k, ++at)
        if (got[at] != value(from, rank, k))
          return ::testing::AssertionFailure()
                 << "all_to_all_v on " << world << " ranks: rank " << rank << "'s out[" << at
                 << "] should be element " << k << " of rank " << from << "'s block for it ("
                 << value(from, rank, k) << "), got " << got[at];
    return ::testing::AssertionSuccess();
  }

  int rank, world;
  std::vector<std::int64_t> send_counts, recv_counts;
  Tensor in, out;
};

}  // namespace dtp::testing
