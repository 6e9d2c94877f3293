// Block quantization (10.1), sign compression with error feedback (10.2) and
// ZeRO++'s three changes to ZeRO-3's communication (10.5).
//
// The arithmetic runs on the host. A compressor copies its input to the host
// (Tensor::to(Device::cpu())), moves only the codes and scales it sends to
// comm.device() for the collective (a GPU under nccl or DTP_DEVICE=cuda),
// reads what arrived back on the host, and copies its result into the
// caller's tensor (copy_from crosses devices). On the CPU these copies are
// plain host copies: the same code runs on every device.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "10_compression/compression.h"

namespace dtp::ch10 {
namespace {

// --- packing codes into 32-bit words ---------------------------------------------

// Writes the low @p bits bits of @p code at bits [(i b) mod 32, ...) of word
// floor(i b / 32). 1, 4 and 8 divide 32, so a code never straddles two words;
// the words must start at 0, since codes are OR-ed in.
void put_code(std::int32_t* words, std::int64_t i, int bits, std::int32_t code) {
  const std::int64_t bit = i * bits;
  const std::uint32_t field = static_cast<std::uint32_t>(code) & ((1u << bits) - 1);
  std::int32_t& word = words[bit / 32];
  word = static_cast<std::int32_t>(static_cast<std::uint32_t>(word) | field << (bit % 32));
}

// The @p bits-bit field of value i, unsigned.
std::uint32_t field_at(const std::int32_t* words, std::int64_t i, int bits) {
  const std::int64_t bit = i * bits;
  const auto word = static_cast<std::uint32_t>(words[bit / 32]);
  return (word >> (bit % 32)) & ((1u << bits) - 1);
}

// Value i as a b-bit two's complement number: the top bit weighs -2^(b-1).
std::int32_t code_at(const std::int32_t* words, std::int64_t i, int bits) {
  const auto field = static_cast<std::int32_t>(field_at(words, i, bits));
  return field >= (1 << (bits - 1)) ? field - (1 << bits) : field;
}

std::int64_t blocks_of(std::int64_t count, std::int64_t block) {
  return (count + block - 1) / block;
}

bool is_float(DType dtype) { return dtype == DType::f32 || dtype == DType::f64; }

// --- 10.1: one scale per block, one code per value ------------------------------

// T is float or double: the divisions happen in the input's own dtype, as
// the contract asks, so every implementation rounds the same way.
template <typename T>
void quantize_values(const Tensor& x, QuantizedTensor& q) {
  const T* values = x.data<T>();
  const T largest_code = static_cast<T>(max_code(q.bits));
  std::int32_t* codes = q.codes.data<std::int32_t>();
  T* scales = q.scales.data<T>();
  for (std::int64_t first = 0, b = 0; first < q.numel; first += q.block, ++b) {
    const std::int64_t end = std::min(first + q.block, q.numel);
    T largest = 0;
    for (std::int64_t i = first; i < end; ++i) largest = std::max(largest, std::abs(values[i]));
    const T scale = largest / largest_code;
    scales[b] = scale;
    for (std::int64_t i = first; i < end; ++i) {
      // nearbyint rounds ties to even; the clamp matters only when the scale
      // itself was rounded down (tiny, subnormal blocks).
      const T code = scale == 0 ? T{0} : std::nearbyint(values[i] / scale);
      put_code(codes, i, q.bits,
               static_cast<std::int32_t>(std::clamp(code, -largest_code, largest_code)));
    }
  }
}

template <typename T>
void dequantize_values(const QuantizedTensor& q, Tensor& out) {
  const T* scales = q.scales.data<T>();
  const std::int32_t* codes = q.codes.data<std::int32_t>();
  T* values = out.data<T>();
  for (std::int64_t i = 0; i < q.numel; ++i)
    values[i] = static_cast<T>(code_at(codes, i, q.bits)) * scales[i / q.block];
}

// --- 10.2: one bit per value, the rest carried to the next step -----------------

// @p x and @p residual are host tensors: x's values in, the average out.
template <typename T>
void sign_all_reduce(Comm& comm, Tensor& x, Tensor& residual) {
  const std::int64_t n = x.numel();
  T* out = x.data<T>();
  T* carried = residual.data<T>();

  // v = x + residual: this step's values plus what earlier steps did not send.
  std::vector<T> v(static_cast<std::size_t>(n));
  T total = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    v[static_cast<std::size_t>(i)] = out[i] + carried[i];
    total += std::abs(v[static_cast<std::size_t>(i)]);
  }
  // s = mean |v|: the one magnitude that stands for every value of the vector.
  const T s = total / static_cast<T>(n);

  // c = s sign(v) with sign(0) = +1 (bit 1); what c misses stays here.
  Tensor signs = Tensor::zeros(Shape{packed_words(n, 1)}, DType::i32);
  std::int32_t* sign_words = signs.data<std::int32_t>();
  for (std::int64_t i = 0; i < n; ++i) {
    const bool positive = v[static_cast<std::size_t>(i)] >= 0;
    if (positive) put_code(sign_words, i, 1, 1);
    carried[i] = v[static_cast<std::size_t>(i)] - (positive ? s : -s);
  }

  // Every rank's signs and s: ceil(n / 32) words and one value per rank,
  // gathered on comm.device(), then read on the host.
  const int world = comm.size();
  const Device device = comm.device();
  const std::int64_t words = packed_words(n, 1);
  Tensor all_signs = Tensor::empty(Shape{words * world}, DType::i32, device);
  Tensor all_s = Tensor::empty(Shape{world}, x.dtype(), device);
  comm.all_gather(signs.to(device), all_signs);
  comm.all_gather(Tensor::full(Shape{1}, static_cast<double>(s), x.dtype(), device), all_s);
  const Tensor signs_here = all_signs.to(Device::cpu());
  const Tensor s_here = all_s.to(Device::cpu());

  // x = (c_0 + ... + c_{N-1}) / N, in rank order on every rank: the same bits everywhere.
  const std::int32_t* every_sign = signs_here.data<std::int32_t>();
  const T* every_s = s_here.data<T>();
  for (std::int64_t i = 0; i < n; ++i) {
    T sum = 0;
    for (int r = 0; r < world; ++r) {
      const T s_r = every_s[r];
      sum += field_at(every_sign + r * words, i, 1) == 1 ? s_r : -s_r;
    }
    out[i] = sum / static_cast<T>(world);
  }
}

// --- 10.5: where each rank's chunk lives in a buffer of every rank's ------------

// The codes and scales of a chunk of @p length values, @p bits bits each.
struct WireCounts {
  std::int64_t words = 0, scales = 0;
};
WireCounts wire_counts(std::int64_t length, int bits, std::int64_t block) {
  return {packed_words(length, bits), blocks_of(length, block)};
}

// The views of @p codes and @p scales that hold chunk after chunk, in order.
std::vector<QuantizedTensor> split_chunks(const Tensor& codes, const Tensor& scales,
                                          const std::vector<std::int64_t>& lengths, int bits,
                                          std::int64_t block) {
  std::vector<QuantizedTensor> chunks;
  std::int64_t word = 0, scale = 0;
  for (std::int64_t length : lengths) {
    const WireCounts counts = wire_counts(length, bits, block);
    chunks.push_back(
        {codes.slice(word, counts.words), scales.slice(scale, counts.scales), bits, block, length});
    word += counts.words;
    scale += counts.scales;
  }
  return chunks;
}

// The parts one after another in one 1-D tensor: what all_to_all_v sends.
Tensor concatenate(const std::vector<Tensor>& parts, DType dtype) {
  std::int64_t count = 0;
  for (const Tensor& part : parts) count += part.numel();
  Tensor all = Tensor::empty(Shape{count}, dtype);
  std::int64_t at = 0;
  for (const Tensor& part : parts) {
    Tensor place = all.slice(at, part.numel());
    place.copy_from(part);
    at += part.numel();
  }
  return all;
}

// out = (d_0 + d_1 + ... + d_{N-1}) / N, added in rank order: one fixed
// order, so the result does not depend on which rank computes it.
template <typename T>
void mean_in_rank_order(const std::vector<Tensor>& pieces, Tensor& out) {
  const auto world = static_cast<T>(pieces.size());
  std::vector<const T*> from;
  for (const Tensor& piece : pieces) from.push_back(piece.data<T>());
  T* to = out.data<T>();
  for (std::int64_t i = 0; i < out.numel(); ++i) {
    T sum = 0;
    for (const T* piece : from) sum += piece[i];
    to[i] = sum / world;
  }
}

void check_chunk(const char* what, const Tensor& chunk, const Tensor& full, ChunkRange range,
                 int rank, int parts, Device device) {
  DTP_CHECK(chunk.device() == device && full.device() == device, what, ": the chunk is on ",
            chunk.device().str(), " and the full tensor on ", full.device().str(),
            "; both must be on the communicator's device, ", device.str());
  DTP_CHECK(chunk.numel() == range.length, what, ": rank ", rank, "'s chunk of ", full.numel(),
            " values in ", parts, " parts has ", range.length, " values (chunk_range), got ",
            chunk.numel());
  DTP_CHECK(chunk.dtype() == full.dtype(), what, ": the chunk is ", dtype_name(chunk.dtype()),
            " but the full tensor is ", dtype_name(full.dtype()));
}

}  // namespace

// --- 10.1 ---------------------------------------------------------------------------

QuantizedTensor quantize_blocks(const Tensor& x, int bits, std::int64_t block) {
  DTP_CHECK(bits == 4 || bits == 8, "quantize_blocks: bits must be 4 or 8, got ", bits);
  DTP_CHECK(block >= 1, "quantize_blocks: block must be at least 1 value, got ", block);
  DTP_CHECK(x.ndim() == 1 && is_float(x.dtype()) && x.device().is_cpu(),
            "quantize_blocks: x must be a 1-D f32 or f64 tensor on the cpu, got ", x.describe());
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    const double value = x.item(i);
    DTP_CHECK(std::isfinite(value), "quantize_blocks: x[", i, "] = ", value,
              " is not finite: no scale can represent it");
  }
  QuantizedTensor q;
  q.bits = bits;
  q.block = block;
  q.numel = x.numel();
  q.codes = Tensor::zeros(Shape{packed_words(q.numel, bits)}, DType::i32);
  q.scales = Tensor::empty(Shape{blocks_of(q.numel, block)}, x.dtype());
  if (x.dtype() == DType::f64)
    quantize_values<double>(x, q);
  else
    quantize_values<float>(x, q);
  return q;
}

void dequantize_blocks(const QuantizedTensor& q, Tensor& out) {
  DTP_CHECK(q.bits == 4 || q.bits == 8, "dequantize_blocks: bits must be 4 or 8, got ", q.bits);
  DTP_CHECK(q.block >= 1, "dequantize_blocks: block must be at least 1, got ", q.block);
  DTP_CHECK(q.codes.dtype() == DType::i32 && q.codes.numel() == packed_words(q.numel, q.bits),
            "dequantize_blocks: ", q.numel, " codes of ", q.bits, " bits need ",
            packed_words(q.numel, q.bits), " i32 words, got ", q.codes.describe());
  DTP_CHECK(is_float(q.scales.dtype()) && q.scales.numel() == blocks_of(q.numel, q.block),
            "dequantize_blocks: ", q.numel, " values in blocks of ", q.block, " need ",
            blocks_of(q.numel, q.block), " f32 or f64 scales, got ", q.scales.describe());
  DTP_CHECK(out.numel() == q.numel && out.dtype() == q.scales.dtype() && out.device().is_cpu(),
            "dequantize_blocks: out must hold ", q.numel, " ", dtype_name(q.scales.dtype()),
            " values on the cpu, got ", out.describe());
  if (out.dtype() == DType::f64)
    dequantize_values<double>(q, out);
  else
    dequantize_values<float>(q, out);
}

// --- 10.2 ---------------------------------------------------------------------------

SignAllReduce::SignAllReduce(Comm& comm, std::int64_t numel, DType dtype) : comm_(comm) {
  DTP_CHECK(numel >= 1, "SignAllReduce: numel must be at least 1, got ", numel);
  DTP_CHECK(is_float(dtype), "SignAllReduce: dtype must be f32 or f64, got ", dtype_name(dtype));
  residual_ = Tensor::zeros(Shape{numel}, dtype);
}

void SignAllReduce::all_reduce(Tensor& x) {
  DTP_CHECK(x.ndim() == 1 && x.numel() == residual_.numel() && x.dtype() == residual_.dtype() &&
                x.device() == comm_.device(),
            "SignAllReduce::all_reduce: x must be ", dtype_name(residual_.dtype()), "[",
            residual_.numel(), "] on ", comm_.device().str(), " (the communicator's device), got ",
            x.describe());
  Tensor values = x.to(Device::cpu());
  if (x.dtype() == DType::f64)
    sign_all_reduce<double>(comm_, values, residual_);
  else
    sign_all_reduce<float>(comm_, values, residual_);
  x.copy_from(values);
}

// --- 10.5 ---------------------------------------------------------------------------

void quantized_all_gather(Comm& comm, const Tensor& shard, Tensor& full, std::int64_t block) {
  constexpr int kBits = 8;
  const int world = comm.size();
  const Device device = comm.device();
  check_chunk("quantized_all_gather", shard, full, chunk_range(full.numel(), world, comm.rank()),
              comm.rank(), world, device);
  const QuantizedTensor mine = quantize_blocks(shard.flatten().to(Device::cpu()), kBits, block);

  // Every rank's shard length, and from it where its codes and scales land.
  std::vector<std::int64_t> lengths;
  WireCounts total;
  for (int r = 0; r < world; ++r) {
    lengths.push_back(chunk_range(full.numel(), world, r).length);
    total.words += wire_counts(lengths.back(), kBits, block).words;
    total.scales += wire_counts(lengths.back(), kBits, block).scales;
  }
  Tensor codes = Tensor::empty(Shape{total.words}, DType::i32, device);
  Tensor scales = Tensor::empty(Shape{total.scales}, full.dtype(), device);
  comm.all_gather(mine.codes.to(device), codes);
  comm.all_gather(mine.scales.to(device), scales);

  // Every shard, this rank's own included, from its codes: the same bits on every rank.
  const std::vector<QuantizedTensor> shards =
      split_chunks(codes.to(Device::cpu()), scales.to(Device::cpu()), lengths, kBits, block);
  Tensor values = Tensor::empty(Shape{full.numel()}, full.dtype());
  for (int r = 0; r < world; ++r) {
    Tensor place = values.slice(chunk_range(full.numel(), world, r).offset,
                                lengths[static_cast<std::size_t>(r)]);
    dequantize_blocks(shards[static_cast<std::size_t>(r)], place);
  }
  full.copy_from(values);
}

void quantized_reduce_scatter(Comm& comm, const Tensor& full, Tensor& shard, int bits,
                              std::int64_t block) {
  const int world = comm.size();
  const Device device = comm.device();
  const ChunkRange mine = chunk_range(full.numel(), world, comm.rank());
  check_chunk("quantized_reduce_scatter", shard, full, mine, comm.rank(), world, device);

  // Chunk j of full, quantized, goes to rank j: codes and scales in rank order.
  const Tensor flat = full.flatten().to(Device::cpu());
  std::vector<Tensor> codes_out, scales_out;
  std::vector<std::int64_t> send_words, send_scales;
  for (int j = 0; j < world; ++j) {
    const ChunkRange range = chunk_range(full.numel(), world, j);
    const QuantizedTensor q = quantize_blocks(flat.slice(range.offset, range.length), bits, block);
    codes_out.push_back(q.codes);
    scales_out.push_back(q.scales);
    send_words.push_back(q.codes.numel());
    send_scales.push_back(q.scales.numel());
  }

  // Every rank sends this rank a chunk of the same length: this rank's.
  const WireCounts each = wire_counts(mine.length, bits, block);
  Tensor codes_in = Tensor::empty(Shape{each.words * world}, DType::i32, device);
  Tensor scales_in = Tensor::empty(Shape{each.scales * world}, full.dtype(), device);
  comm.all_to_all_v(concatenate(codes_out, DType::i32).to(device), send_words, codes_in,
                    std::vector<std::int64_t>(static_cast<std::size_t>(world), each.words));
  comm.all_to_all_v(concatenate(scales_out, full.dtype()).to(device), send_scales, scales_in,
                    std::vector<std::int64_t>(static_cast<std::size_t>(world), each.scales));

  // d_0 .. d_{N-1}, then their mean.
  std::vector<Tensor> received;
  for (const QuantizedTensor& q : split_chunks(
           codes_in.to(Device::cpu()), scales_in.to(Device::cpu()),
           std::vector<std::int64_t>(static_cast<std::size_t>(world), mine.length), bits, block)) {
    received.push_back(Tensor::empty(Shape{mine.length}, full.dtype()));
    dequantize_blocks(q, received.back());
  }
  Tensor mean = Tensor::empty(Shape{mine.length}, full.dtype());
  if (full.dtype() == DType::f64)
    mean_in_rank_order<double>(received, mean);
  else
    mean_in_rank_order<float>(received, mean);
  shard.copy_from(mean);
}

Tensor secondary_shard(Comm& node, const Tensor& full) {
  const ChunkRange range = chunk_range(full.numel(), node.size(), node.rank());
  return full.flatten().slice(range.offset, range.length).clone();
}

// hpZ moves the weights as they are: no host copy, the gather runs where they live.
void secondary_all_gather(Comm& node, const Tensor& secondary, Tensor& full) {
  check_chunk("secondary_all_gather", secondary, full,
              chunk_range(full.numel(), node.size(), node.rank()), node.rank(), node.size(),
              node.device());
  node.all_gather(secondary, full);
}

}  // namespace dtp::ch10
