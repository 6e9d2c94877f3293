#include "dtp/tensor.h"

#include <cstdlib>
#include <cstring>
#include <sstream>

#include "core/random.h"
#include "cpu/element.h"
#include "cuda/device_api.h"
#include "dtp/error.h"
#include "dtp/host_cache.h"

namespace dtp {

// --- Shape -------------------------------------------------------------------

namespace {
std::string describe_dims(const std::vector<std::int64_t>& dims) {
  std::string out = "[";
  for (std::size_t i = 0; i < dims.size(); ++i) out += (i ? ", " : "") + std::to_string(dims[i]);
  return out + "]";
}
}  // namespace

Shape::Shape(std::initializer_list<std::int64_t> dims) : Shape(std::vector<std::int64_t>(dims)) {}

Shape::Shape(const std::vector<std::int64_t>& dims) {
  DTP_CHECK(dims.size() <= kMaxDims, "a shape has at most ", kMaxDims, " dimensions, got ",
            dims.size());
  // numel() multiplies the dimensions without checks, so a shape whose
  // element count would overflow an int64 is refused here, once.
  std::int64_t elements = 1;
  for (std::int64_t d : dims) {
    DTP_CHECK(d >= 0, "shape dimensions must be >= 0, got ", d);
    DTP_CHECK(!__builtin_mul_overflow(elements, d, &elements), "shape ", describe_dims(dims),
              " has more elements than a 64-bit count holds");
    dims_[ndim_++] = d;
  }
}

std::int64_t Shape::operator[](int dim) const {
  DTP_CHECK(dim >= 0 && dim < ndim_, "dimension ", dim, " is out of range for shape ", str());
  return dims_[dim];
}

std::int64_t Shape::numel() const {
  std::int64_t n = 1;
  for (int i = 0; i < ndim_; ++i) n *= dims_[i];
  return n;
}

std::string Shape::str() const {
  std::string out = "[";
  for (int i = 0; i < ndim_; ++i) out += (i ? ", " : "") + std::to_string(dims_[i]);
  return out + "]";
}

bool Shape::operator==(const Shape& other) const {
  if (ndim_ != other.ndim_) return false;
  for (int i = 0; i < ndim_; ++i)
    if (dims_[i] != other.dims_[i]) return false;
  return true;
}

ChunkRange chunk_range(std::int64_t numel, int parts, int index) {
  DTP_CHECK(parts >= 1, "chunk_range: parts must be at least 1, got ", parts);
  DTP_CHECK(index >= 0 && index < parts, "chunk_range: index ", index, " is outside [0, ", parts,
            ")");
  DTP_CHECK(numel >= 0, "chunk_range: numel must be >= 0, got ", numel);
  std::int64_t size = (numel + parts - 1) / parts;
  std::int64_t begin = std::min(numel, size * index);
  std::int64_t end = std::min(numel, begin + size);
  return {begin, end - begin};
}

// --- Storage -------------------------------------------------------------------

/// One allocation, charged to the tracker of the rank that made it. Host
/// memory comes from the rank's block cache (dtp/host_cache.h), so a step's
/// buffers are the last step's, with their pages already mapped.
class Storage {
 public:
  Storage(std::size_t bytes, Device device, MemoryCategory category)
      : bytes_(bytes), device_(device), category_(category), tracker_(current_memory_tracker()) {
    if (device.is_cuda()) {
      data_ = cuda::allocate(device, bytes);
    } else {
      cache_ = current_host_cache();
      data_ = cache_->take(bytes);
    }
    tracker_->charge(category_, static_cast<std::int64_t>(bytes_), device_.kind);
  }
  ~Storage() {
    if (device_.is_cuda())
      cuda::release(device_, data_);
    else
      cache_->give_back(data_, bytes_);
    tracker_->release(category_, static_cast<std::int64_t>(bytes_), device_.kind);
  }
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  Device device() const { return device_; }
  MemoryCategory category() const { return category_; }

 private:
  void* data_ = nullptr;
  std::size_t bytes_;
  Device device_;
  MemoryCategory category_;
  std::shared_ptr<MemoryTracker> tracker_;
  std::shared_ptr<HostBlockCache> cache_;  // where host memory came from; null for GPU memory
};

// --- Tensor --------------------------------------------------------------------

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device, MemoryCategory category) {
  Tensor t;
  std::int64_t bytes = 0;
  DTP_CHECK(
      !__builtin_mul_overflow(shape.numel(), static_cast<std::int64_t>(dtype_size(dtype)), &bytes),
      "a tensor of shape ", shape.str(), " and dtype ", dtype_name(dtype),
      " has more bytes than a 64-bit count holds");
  t.storage_ = std::make_shared<Storage>(static_cast<std::size_t>(bytes), device,
                                         charged_category(category));
  t.shape_ = shape;
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device, MemoryCategory category) {
  Tensor t = empty(shape, dtype, device, category);
  t.fill(0.0);
  return t;
}

Tensor Tensor::random_uniform(const Shape& shape, std::uint64_t seed, double low, double high,
                              DType dtype, Device device, MemoryCategory category) {
  Tensor t = empty(shape, dtype, device, category);
  if (device.is_cuda()) {
    cuda::fill_random(t.raw(), dtype, t.numel(), seed, 0, low, high);
    return t;
  }
  for (std::int64_t i = 0; i < t.numel(); ++i)
    t.set_item(i, detail::random_uniform_value(seed, i, low, high));
  return t;
}

Tensor Tensor::to(Device device) const {
  DTP_CHECK(defined(), "to: undefined tensor");
  Tensor t = empty(shape_, dtype_, device, category());
  t.copy_from(*this);
  return t;
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device,
                    MemoryCategory category) {
  Tensor t = empty(shape, dtype, device, category);
  t.fill(value);
  return t;
}

Tensor Tensor::from_values(const std::vector<double>& values, DType dtype, Device device) {
  Tensor t = empty({static_cast<std::int64_t>(values.size())}, dtype);
  for (std::size_t i = 0; i < values.size(); ++i)
    t.set_item(static_cast<std::int64_t>(i), values[i]);
  return device.is_cpu() ? t : t.to(device);
}

Device Tensor::device() const { return storage_ ? storage_->device() : Device::cpu(); }

MemoryCategory Tensor::category() const {
  return storage_ ? storage_->category() : MemoryCategory::other;
}

std::string Tensor::describe() const {
  if (!defined()) return "undefined tensor";
  return std::string(dtype_name(dtype_)) + shape_.str() + " on " + device().str();
}

void Tensor::check_dtype(DType expected) const {
  DTP_CHECK(defined(), "use of an undefined tensor");
  DTP_CHECK(dtype_ == expected, "tensor is ", describe(), " but was accessed as ",
            dtype_name(expected));
}

void* Tensor::raw() {
  DTP_CHECK(defined(), "use of an undefined tensor");
  return static_cast<char*>(storage_->data()) + offset_ * static_cast<std::int64_t>(element_size());
}

const void* Tensor::raw() const { return const_cast<Tensor*>(this)->raw(); }

Tensor Tensor::slice(std::int64_t start, std::int64_t length) const {
  DTP_CHECK(defined(), "slice of an undefined tensor");
  DTP_CHECK(start >= 0 && length >= 0 && start + length <= numel(), "slice [", start, ", ",
            start + length, ") is outside ", describe(), " (", numel(), " elements)");
  Tensor t = *this;
  t.offset_ = offset_ + start;
  t.shape_ = Shape{length};
  return t;
}

std::vector<Tensor> Tensor::chunk(int parts) const {
  DTP_CHECK(parts >= 1, "chunk: parts must be at least 1, got ", parts);
  std::vector<Tensor> chunks;
  chunks.reserve(parts);
  for (int i = 0; i < parts; ++i) {
    ChunkRange range = chunk_range(numel(), parts, i);
    chunks.push_back(slice(range.offset, range.length));
  }
  return chunks;
}

Tensor Tensor::view(const Shape& shape) const {
  DTP_CHECK(defined(), "view of an undefined tensor");
  DTP_CHECK(shape.numel() == numel(), "view: cannot view ", describe(), " (", numel(),
            " elements) as ", shape.str(), " (", shape.numel(), " elements)");
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

Tensor Tensor::flatten() const { return view(Shape{numel()}); }

Tensor Tensor::clone() const {
  DTP_CHECK(defined(), "clone of an undefined tensor");
  Tensor t = empty(shape_, dtype_, device(), category());
  t.copy_from(*this);
  return t;
}

bool Tensor::shares_storage_with(const Tensor& other) const {
  return storage_ != nullptr && storage_ == other.storage_;
}

void Tensor::copy_from(const Tensor& source) {
  DTP_CHECK(defined() && source.defined(), "copy_from: both tensors must be defined");
  DTP_CHECK(dtype_ == source.dtype_ && numel() == source.numel(), "copy_from: cannot copy ",
            source.describe(), " into ", describe(), ": dtype and element count must match");
  if (nbytes() == 0 || raw() == source.raw()) return;
  if (device().is_cpu() && source.device().is_cpu()) {
    std::memmove(raw(), source.raw(), nbytes());
  } else {
    cuda::copy(raw(), device(), source.raw(), source.device(), nbytes());
  }
}

void Tensor::fill(double value) {
  if (device().is_cuda()) return cuda::fill(raw(), dtype_, numel(), value);
  detail::with_element(dtype_, [&](auto zero) {
    using T = decltype(zero);
    T v = detail::from_double<T>(value);
    T* p = static_cast<T*>(raw());
    for (std::int64_t i = 0, n = numel(); i < n; ++i) p[i] = v;
  });
}

double Tensor::item(std::int64_t index) const {
  DTP_CHECK(index >= 0 && index < numel(), "item: index ", index, " is outside ", describe());
  if (device().is_cuda()) return slice(index, 1).to(Device::cpu()).item(0);
  double out = 0;
  detail::with_element(dtype_, [&](auto zero) {
    using T = decltype(zero);
    out = detail::to_double(static_cast<const T*>(raw())[index]);
  });
  return out;
}

void Tensor::set_item(std::int64_t index, double value) {
  DTP_CHECK(index >= 0 && index < numel(), "set_item: index ", index, " is outside ", describe());
  if (device().is_cuda()) {
    Tensor one = slice(index, 1);
    return one.fill(value);
  }
  detail::with_element(dtype_, [&](auto zero) {
    using T = decltype(zero);
    static_cast<T*>(raw())[index] = detail::from_double<T>(value);
  });
}

std::vector<double> Tensor::to_vector() const {
  if (device().is_cuda()) return to(Device::cpu()).to_vector();
  std::vector<double> out(static_cast<std::size_t>(numel()));
  for (std::int64_t i = 0; i < numel(); ++i) out[static_cast<std::size_t>(i)] = item(i);
  return out;
}

}  // namespace dtp
