// The alpha-beta model's time of each message schedule, for n >= 2 ranks and
// size S: alpha per message round on the critical path, beta per byte a rank
// sends on it. Chapter 01's formulas; reduction arithmetic is not charged.
// "library" and "native" are charged as the bandwidth-optimal schedule the
// runtime's clock uses: rings for all-reduce, all-gather, reduce-scatter and
// all-to-all, binomial trees for broadcast and reduce.
#pragma once

namespace dtp::bench::collectives::alpha_beta {

inline int ceil_log2(int n) {
  int rounds = 0;
  while ((1 << rounds) < n) ++rounds;
  return rounds;
}

/// A reduce-scatter then an all-gather around the ring: 2(n - 1) rounds of S/n.
inline double ring_all_reduce(int n, double S, double alpha, double beta) {
  const double share = double(n - 1) / n;
  return 2 * (n - 1) * alpha + 2 * share * S * beta;
}

/// A reduce up a binomial tree, then a broadcast down it.
inline double tree_all_reduce(int n, double S, double alpha, double beta) {
  const double log_rounds = ceil_log2(n);
  return 2 * log_rounds * (alpha + S * beta);
}

/// Recursive halving then doubling on the largest power of two p <= n.
inline double halving_doubling_all_reduce(int n, double S, double alpha, double beta) {
  int p = 1;
  while (p * 2 <= n) p *= 2;
  const int log_p = ceil_log2(p);
  double time = 2 * log_p * alpha + 2.0 * (p - 1) / p * S * beta;
  if (p < n) time += 2 * (alpha + S * beta);  // fold the extra ranks in and back out
  return time;
}

/// Every rank sends chunk j to rank j, then its summed chunk to everyone. One
/// link per rank queues each step's n - 1 messages: the ring's time, in two steps.
inline double direct_all_reduce(int n, double S, double alpha, double beta) {
  return ring_all_reduce(n, S, alpha, beta);
}

/// Every rank sends S to the root and receives S back.
inline double parameter_server_all_reduce(int n, double S, double alpha, double beta) {
  return 2 * (n - 1) * (alpha + S * beta);  // the root's link carries every message
}

/// A ring of n - 1 rounds, each moving S/n: all-gather, reduce-scatter, pairwise all-to-all.
inline double ring(int n, double S, double alpha, double beta) {
  const double share = double(n - 1) / n;
  return (n - 1) * alpha + share * S * beta;
}

/// A binomial tree of ceil(log2 n) rounds, each moving S: broadcast, reduce.
inline double tree(int n, double S, double alpha, double beta) {
  const double log_rounds = ceil_log2(n);
  return log_rounds * (alpha + S * beta);
}

/// One message each way: sendrecv.
inline double one_message(int, double S, double alpha, double beta) { return alpha + S * beta; }

}  // namespace dtp::bench::collectives::alpha_beta
