// Checkpoint files (see dtp/checkpoint.h for the format).
#include "dtp/checkpoint.h"

#include <unistd.h>

#include <bit>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "dtp/error.h"

namespace dtp {

static_assert(std::endian::native == std::endian::little,
              "checkpoints store little-endian data as it is in memory: a big-endian host would "
              "need to swap");

namespace {

constexpr const char* kMagic = "DTPCKPT";
constexpr int kVersion = 1;

/// 64-bit FNV-1a, continued over several pieces.
struct Fnv1a64 {
  std::uint64_t hash = 1469598103934665603ull;
  void add(const void* data, std::size_t bytes) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (std::size_t i = 0; i < bytes; ++i) hash = (hash ^ p[i]) * 1099511628211ull;
  }
  std::string str() const {
    char text[32];
    std::snprintf(text, sizeof text, "fnv1a64:%016llx", static_cast<unsigned long long>(hash));
    return text;
  }
};

std::string shape_json(const Shape& shape) {
  std::string out = "[";
  for (int d = 0; d < shape.ndim(); ++d) {
    if (d) out += ',';
    out += std::to_string(shape[d]);
  }
  return out + "]";
}

Tensor on_host(const Tensor& t) { return t.device().is_cuda() ? t.to(Device::cpu()) : t; }

}  // namespace

const Tensor& Checkpoint::tensor(const std::string& name) const {
  for (const NamedTensor& t : tensors)
    if (t.name == name) return t.tensor;
  std::ostringstream names;
  for (std::size_t i = 0; i < tensors.size() && i < 12; ++i)
    names << (i ? ", " : "") << tensors[i].name;
  if (tensors.size() > 12) names << ", ... (" << tensors.size() << " in all)";
  throw Error("checkpoint: no tensor '" + name + "' (it has " + names.str() + ")");
}

bool Checkpoint::has(const std::string& name) const {
  for (const NamedTensor& t : tensors)
    if (t.name == name) return true;
  return false;
}

void write_checkpoint(const std::string& path, const Checkpoint& checkpoint) {
  std::vector<Tensor> host;
  std::string entries = "[";
  std::int64_t offset = 0;
  Fnv1a64 checksum;
  for (const NamedTensor& t : checkpoint.tensors) {
    DTP_CHECK(t.tensor.defined(), "write_checkpoint ", path, ": tensor '", t.name,
              "' is undefined");
    host.push_back(on_host(t.tensor));
    const std::int64_t bytes = static_cast<std::int64_t>(host.back().nbytes());
    checksum.add(host.back().raw(), static_cast<std::size_t>(bytes));
    JsonLine entry;
    entry.add("name", t.name)
        .add("dtype", dtype_name(t.tensor.dtype()))
        .raw("shape", shape_json(t.tensor.shape()))
        .add("offset", offset)
        .add("bytes", bytes);
    if (entries.size() > 1) entries += ',';
    entries += entry.str();
    offset += bytes;
  }
  const std::string config =
      checkpoint.config.kind == JsonValue::Kind::null ? "{}" : checkpoint.config.dump();
  JsonLine head;
  head.add("format", "dtp-checkpoint")
      .add("version", kVersion)
      .add("kind", checkpoint.kind)
      .add("step", checkpoint.step)
      .raw("config", config)
      .raw("tensors", entries + "]")
      .add("data_bytes", offset)
      .add("checksum", checksum.str());
  const std::string header = head.str();

  const std::string temporary = path + ".tmp";
  {
    std::FILE* file = std::fopen(temporary.c_str(), "wb");
    DTP_CHECK(file != nullptr, "write_checkpoint: cannot create ", temporary, ": ",
              std::strerror(errno));
    bool ok = std::fprintf(file, "%s %d %zu\n", kMagic, kVersion, header.size()) > 0 &&
              std::fwrite(header.data(), 1, header.size(), file) == header.size() &&
              std::fputc('\n', file) != EOF;
    for (const Tensor& t : host)
      ok = ok && (t.nbytes() == 0 || std::fwrite(t.raw(), 1, t.nbytes(), file) == t.nbytes());
    // On disk before the rename: a crash then leaves the old file or the new one.
    ok = ok && std::fflush(file) == 0 && ::fsync(fileno(file)) == 0;
    const int saved_errno = errno;
    ok = std::fclose(file) == 0 && ok;
    if (!ok) {
      std::remove(temporary.c_str());
      throw Error("write_checkpoint: writing " + temporary + " failed (" +
                  std::strerror(saved_errno) + "); " + path + " is unchanged");
    }
  }
  std::error_code error;
  std::filesystem::rename(temporary, path, error);
  if (error) {
    std::remove(temporary.c_str());
    throw Error("write_checkpoint: cannot rename " + temporary + " to " + path + ": " +
                error.message());
  }
}

Checkpoint read_checkpoint(const std::string& path) {
  // A regular file only: opening a FIFO would wait for a writer, and a
  // device has no size.
  std::error_code status_error;
  const std::filesystem::file_status status = std::filesystem::status(path, status_error);
  DTP_CHECK(std::filesystem::exists(status), "read_checkpoint: no such file ", path);
  DTP_CHECK(std::filesystem::is_regular_file(status), "read_checkpoint: ", path,
            " is not a regular file (a checkpoint is a file that dtp train --save wrote)");
  std::ifstream in(path, std::ios::binary);
  DTP_CHECK(in.good(), "read_checkpoint: cannot open ", path, ": ", std::strerror(errno));
  const auto file_bytes = static_cast<std::int64_t>(std::filesystem::file_size(path));
  auto fail = [&path](const std::string& what) -> Error {
    return Error("read_checkpoint " + path + ": " + what);
  };

  std::string first;
  std::getline(in, first);
  char magic[16] = {};
  int version = 0;
  long long header_bytes = -1;
  if (std::sscanf(first.c_str(), "%15s %d %lld", magic, &version, &header_bytes) != 3 ||
      std::strcmp(magic, kMagic) != 0)
    throw fail(
        "not a DTP checkpoint (it does not start with \"DTPCKPT <version> <header bytes>\")");
  if (version != kVersion)
    throw fail("format version " + std::to_string(version) + "; this build reads version " +
               std::to_string(kVersion));
  // Compared with the file's size before any sum: a huge count must not overflow.
  if (header_bytes < 2 || header_bytes > file_bytes)
    throw fail("the file is " + std::to_string(file_bytes) + " bytes, too short for its " +
               std::to_string(header_bytes) + "-byte header: truncated");
  const std::int64_t data_start = static_cast<std::int64_t>(first.size()) + 1 + header_bytes + 1;
  if (data_start > file_bytes)
    throw fail("the file is " + std::to_string(file_bytes) + " bytes, too short for its " +
               std::to_string(header_bytes) + "-byte header: truncated");

  std::string header_text(static_cast<std::size_t>(header_bytes), '\0');
  in.read(header_text.data(), header_bytes);
  if (in.get() != '\n')
    throw fail("the header does not end where its first line says (a corrupt file)");
  JsonValue header;
  try {
    header = parse_json(header_text);
  } catch (const Error& e) {
    throw fail(std::string("the header is not valid JSON (a corrupt file): ") + e.what());
  }

  Checkpoint checkpoint;
  std::int64_t data_bytes = 0;
  std::string expected_checksum;
  try {
    checkpoint.kind = header.at("kind").as_string("kind");
    checkpoint.step = header.at("step").as_int("step");
    checkpoint.config = header.at("config");
    data_bytes = header.at("data_bytes").as_int("data_bytes");
    expected_checksum = header.at("checksum").as_string("checksum");
  } catch (const Error& e) {
    throw fail(std::string("the header lacks a field (a corrupt file): ") + e.what());
  }
  if (checkpoint.kind != "training" && checkpoint.kind != "model")
    throw fail("the header's kind is '" + checkpoint.kind +
               "'; a checkpoint is a 'training' or a 'model' one");
  if (checkpoint.step < 0)
    throw fail("the header says step " + std::to_string(checkpoint.step) +
               "; a step count is 0 or more");
  if (data_bytes < 0 || data_bytes > file_bytes)
    throw fail("the header says " + std::to_string(data_bytes) +
               " bytes of data follow it, but the file is " + std::to_string(file_bytes) +
               " bytes (a corrupt header)");
  if (data_start + data_bytes != file_bytes)
    throw fail("the header says " + std::to_string(data_bytes) + " bytes of data follow it, but " +
               std::to_string(file_bytes - data_start) + " do: " +
               (data_start + data_bytes > file_bytes ? "truncated" : "extra bytes at the end"));

  std::vector<char> data(static_cast<std::size_t>(data_bytes));
  in.read(data.data(), data_bytes);
  if (in.gcount() != data_bytes) throw fail("could not read the data (truncated while reading?)");
  Fnv1a64 checksum;
  checksum.add(data.data(), data.size());
  if (checksum.str() != expected_checksum)
    throw fail("the data's checksum is " + checksum.str() + " but the header says " +
               expected_checksum + ": the file is corrupt");

  // Each tensor's entry. The checksum covers the data, not the header, so
  // the entries are checked against each other: the writer lays the tensors
  // out back to back in file order, so each must start where the one before
  // it ended and the last must end where the data does.
  struct Entry {
    std::string name;
    DType dtype;
    std::vector<std::int64_t> dims;
    std::int64_t offset, bytes;
  };
  std::vector<Entry> entries;
  try {
    for (const JsonValue& entry : header.at("tensors").items) {
      Entry e;
      e.name = entry.at("name").as_string("tensor name");
      e.dtype = parse_dtype(entry.at("dtype").as_string(e.name + ".dtype"));
      for (const JsonValue& d : entry.at("shape").items)
        e.dims.push_back(d.as_int(e.name + ".shape"));
      e.offset = entry.at("offset").as_int(e.name + ".offset");
      e.bytes = entry.at("bytes").as_int(e.name + ".bytes");
      entries.push_back(std::move(e));
    }
  } catch (const Error& e) {
    throw fail(std::string("the header's list of tensors is damaged (a corrupt file): ") +
               e.what());
  }
  std::int64_t end = 0;  // where the previous tensor's bytes ended
  std::set<std::string> names;
  for (const Entry& e : entries) {
    if (!names.insert(e.name).second)
      throw fail("two tensors are called '" + e.name + "' (a corrupt header)");
    std::int64_t needed = static_cast<std::int64_t>(dtype_size(e.dtype));
    for (std::int64_t d : e.dims)
      if (d < 0 || __builtin_mul_overflow(needed, d, &needed))
        throw fail("tensor '" + e.name + "' has an impossible shape (a corrupt header)");
    const Shape shape(e.dims);
    if (e.bytes != needed)
      throw fail("tensor '" + e.name + "' is " + std::to_string(e.bytes) + " bytes, but " +
                 shape.str() + " of " + dtype_name(e.dtype) + " needs " + std::to_string(needed));
    if (e.offset != end)
      throw fail("tensor '" + e.name + "' starts at data byte " + std::to_string(e.offset) +
                 ", but the tensor before it ends at byte " + std::to_string(end) +
                 " (a corrupt header)");
    if (e.offset + e.bytes > data_bytes)
      throw fail("tensor '" + e.name + "' lies outside the data (bytes " +
                 std::to_string(e.offset) + " to " + std::to_string(e.offset + e.bytes) + " of " +
                 std::to_string(data_bytes) + ")");
    end = e.offset + e.bytes;
    Tensor t = Tensor::empty(shape, e.dtype);
    if (e.bytes > 0)
      std::memcpy(t.raw(), data.data() + e.offset, static_cast<std::size_t>(e.bytes));
    checkpoint.tensors.push_back({e.name, t});
  }
  if (end != data_bytes)
    throw fail("the tensors end at data byte " + std::to_string(end) + " but the data holds " +
               std::to_string(data_bytes) + " (a corrupt header)");
  return checkpoint;
}

}  // namespace dtp
