// Chapter 10 — communication compression: block quantization (10.1), sign
// compression with error feedback (10.2) and ZeRO++ (10.5).
//
// Replace each `throw dtp::NotSolved(...)` with your code, then run
//     ./dtp grade 10
// to see which puzzles pass. The contract is in
// chapters/10_compression/compression.h (it says how codes are packed into
// words, bit by bit); the lesson is in chapters/10_compression/README.md.
//
// 10.1 works on host tensors. 10.2 and 10.5 are handed tensors on
// comm.device() (a GPU under nccl): compute on host copies, and move only
// the codes and scales you send to comm.device() (the contract's file
// comment says how).
//
// Tools you may use:
//   packed_words(count, bits), max_code(bits)
//                                          words for count codes; 127 for 8 bits, 7 for 4
//   QuantizedTensor{codes, scales, bits, block, numel}
//   t.data<float>(), t.data<double>(), t.data<std::int32_t>()
//                                          the elements of a host tensor; pick by t.dtype()
//   comm.device()                          where this rank's tensors and collectives live
//   t.to(Device::cpu()), t.to(comm.device())
//                                          a copy on the host (to compute) or on the
//                                          rank's device (to send or receive)
//   std::nearbyint(v), std::clamp(v, lo, hi), std::isfinite(v)
//   static_cast<std::uint32_t>(word) >> shift, & mask, |
//                                          bit fields; shift and mask in unsigned, then
//                                          static_cast<std::int32_t> back
//   Tensor::zeros(shape, dtype), Tensor::empty(shape, dtype), Tensor::full(shape, value, dtype)
//                                          on the host; a last argument comm.device() puts
//                                          a buffer on the rank's device
//   t.flatten(), t.slice(start, length), t.clone(), dst.copy_from(src)
//                                          slices are views: writing one writes t;
//                                          copy_from copies across devices too
//   chunk_range(numel, parts, index)       {offset, length} of chunk index
//   comm.all_gather(shard, full)           full = every rank's shard, in rank order
//   comm.all_to_all_v(in, send_counts, out, recv_counts)
//                                          counts per peer, blocks in rank order
//   comm.rank(), comm.size()
//   DTP_CHECK(condition, "message parts", value, ...)
//                                          throws dtp::Error with the message
// The `(void)x;` lines only silence unused-parameter warnings: delete them.
#include "10_compression/compression.h"

namespace dtp::ch10 {

QuantizedTensor quantize_blocks(const Tensor& x, int bits, std::int64_t block) {
  // About 30 lines: check bits, block and that every value is finite; then
  // per block its scale, and per value its code, OR-ed into its word.
  (void)x;
  (void)bits;
  (void)block;
  throw dtp::NotSolved("10.1 block_quantization");
}

void dequantize_blocks(const QuantizedTensor& q, Tensor& out) {
  // About 12 lines: read each code back (sign-extend its b bits), times its
  // block's scale.
  (void)q;
  (void)out;
  throw dtp::NotSolved("10.1 block_quantization");
}

SignAllReduce::SignAllReduce(Comm& comm, std::int64_t numel, DType dtype) : comm_(comm) {
  // About 3 lines: check numel and dtype, then a zero residual.
  (void)numel;
  (void)dtype;
  throw dtp::NotSolved("10.2 sign_all_reduce");
}

void SignAllReduce::all_reduce(Tensor& x) {
  // About 35 lines: v, s, the sign bits and the new residual; two
  // all-gathers; then every rank's c added in rank order, divided by N.
  (void)x;
  throw dtp::NotSolved("10.2 sign_all_reduce");
}

void quantized_all_gather(Comm& comm, const Tensor& shard, Tensor& full, std::int64_t block) {
  // About 25 lines: quantize the shard; all-gather codes and scales; then
  // dequantize every rank's part (yours too) into its chunk of full.
  (void)comm;
  (void)shard;
  (void)full;
  (void)block;
  throw dtp::NotSolved("10.5 zero_plus_plus");
}

void quantized_reduce_scatter(Comm& comm, const Tensor& full, Tensor& shard, int bits,
                              std::int64_t block) {
  // About 35 lines: quantize every chunk of full; one all_to_all_v for the
  // codes, one for the scales; dequantize what arrived and average it.
  (void)comm;
  (void)full;
  (void)shard;
  (void)bits;
  (void)block;
  throw dtp::NotSolved("10.5 zero_plus_plus");
}

Tensor secondary_shard(Comm& node, const Tensor& full) {
  // About 2 lines.
  (void)node;
  (void)full;
  throw dtp::NotSolved("10.5 zero_plus_plus");
}

void secondary_all_gather(Comm& node, const Tensor& secondary, Tensor& full) {
  // About 3 lines.
  (void)node;
  (void)secondary;
  (void)full;
  throw dtp::NotSolved("10.5 zero_plus_plus");
}

}  // namespace dtp::ch10
