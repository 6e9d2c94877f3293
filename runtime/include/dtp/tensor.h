/// @file tensor.h
/// @brief Tensor: contiguous, row-major, up to 4-D, owning shared storage plus an offset.
///
/// Views (slice, chunk, view) share storage and cost nothing; they are how
/// shards and buckets are made. Every allocation is charged to the memory
/// tracker of the rank that made it (see memory.h).
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "dtp/device.h"
#include "dtp/dtype.h"
#include "dtp/memory.h"

namespace dtp {

/// A shape of 0 to 4 dimensions. A 0-D shape holds one element.
class Shape {
 public:
  /// Most dimensions a Shape (and so a Tensor) can have.
  static constexpr int kMaxDims = 4;
  Shape() = default;
  /// Sizes outermost first, e.g. {2, 3}; throws dtp::Error on too many dims or a negative size.
  Shape(std::initializer_list<std::int64_t> dims);
  /// As the initializer-list form, for sizes known only at run time.
  explicit Shape(const std::vector<std::int64_t>& dims);
  /// Number of dimensions, 0 to kMaxDims.
  int ndim() const { return ndim_; }
  /// Size of dimension @p dim; throws dtp::Error unless 0 <= dim < ndim().
  std::int64_t operator[](int dim) const;
  /// Product of the sizes: 1 for a 0-D shape, 0 if any size is 0.
  std::int64_t numel() const;
  /// "[2, 3]".
  std::string str() const;
  /// Same number of dimensions and the same sizes.
  bool operator==(const Shape& other) const;

 private:
  std::array<std::int64_t, kMaxDims> dims_{};
  int ndim_ = 0;
};

/// One part of a buffer split into `parts` pieces: elements [offset, offset + length).
struct ChunkRange {
  std::int64_t offset = 0;  ///< index of the chunk's first element
  std::int64_t length = 0;  ///< elements in the chunk; 0 for chunks past the end
};

/// The DTP chunking rule, used by Tensor::chunk and by every collective:
/// each chunk has ceil(numel / parts) elements, except that the last non-empty
/// chunk holds what is left and chunks past the end are empty.
/// Example: 10 elements in 4 parts gives 3, 3, 3, 1; 5 in 4 gives 2, 2, 1, 0.
ChunkRange chunk_range(std::int64_t numel, int parts, int index);

class Storage;

/// A contiguous row-major view of shared storage.
class Tensor {
 public:
  /// An undefined tensor (defined() is false).
  Tensor() = default;

  /// Uninitialized memory, charged to the current rank's tracker under @p category.
  static Tensor empty(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu(),
                      MemoryCategory category = MemoryCategory::other);
  /// As empty(), with every element 0.
  static Tensor zeros(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu(),
                      MemoryCategory category = MemoryCategory::other);
  /// As empty(), with every element set to @p value converted to @p dtype.
  static Tensor full(const Shape& shape, double value, DType dtype = DType::f32,
                     Device device = Device::cpu(),
                     MemoryCategory category = MemoryCategory::other);
  /// Uniform values in [low, high) from a counter-based generator: the same
  /// seed gives the same values on every device.
  static Tensor random_uniform(const Shape& shape, std::uint64_t seed, double low = -1.0,
                               double high = 1.0, DType dtype = DType::f32,
                               Device device = Device::cpu(),
                               MemoryCategory category = MemoryCategory::other);
  /// A 1-D tensor on @p device holding @p values converted to @p dtype
  /// (filled on the host, then copied over once: meant for small vectors,
  /// such as a batch's routing decisions).
  static Tensor from_values(const std::vector<double>& values, DType dtype = DType::f64,
                            Device device = Device::cpu());

  /// False for a default-constructed tensor; data access and views on one throw.
  bool defined() const { return storage_ != nullptr; }
  /// Dimensions of this view (not of the whole storage).
  const Shape& shape() const { return shape_; }
  /// Number of dimensions, 0 to Shape::kMaxDims.
  int ndim() const { return shape_.ndim(); }
  /// Size of dimension @p dim; throws dtp::Error if out of range.
  std::int64_t size(int dim) const { return shape_[dim]; }
  /// Elements in this view.
  std::int64_t numel() const { return shape_.numel(); }
  /// Element type; data<T>() needs the matching T.
  DType dtype() const { return dtype_; }
  /// Where the storage lives; cpu for an undefined tensor.
  Device device() const;
  /// Category the storage is charged under; other for an undefined tensor.
  MemoryCategory category() const;
  /// Bytes per element of dtype().
  std::size_t element_size() const { return dtype_size(dtype_); }
  /// Bytes in this view: numel() * element_size().
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * element_size(); }
  /// "f32[2, 3] on cpu".
  std::string describe() const;

  /// Typed pointer to the first element; throws if T does not match dtype().
  template <typename T>
  T* data() {
    check_dtype(dtype_of<T>());
    return static_cast<T*>(raw());
  }
  /// Const typed pointer to the first element; throws if T does not match dtype().
  template <typename T>
  const T* data() const {
    check_dtype(dtype_of<T>());
    return static_cast<const T*>(raw());
  }
  /// Untyped pointer to the first element (device memory on a GPU); throws if undefined.
  void* raw();
  /// Const form of raw().
  const void* raw() const;

  /// 1-D view of flattened elements [start, start + length).
  Tensor slice(std::int64_t start, std::int64_t length) const;
  /// Exactly @p parts 1-D views following chunk_range(); trailing ones may be empty.
  std::vector<Tensor> chunk(int parts) const;
  /// The same elements under another shape with the same numel.
  Tensor view(const Shape& shape) const;
  /// 1-D view of all elements.
  Tensor flatten() const;
  /// A copy on @p device (same dtype and category).
  Tensor to(Device device) const;
  /// A deep copy in new storage (same dtype, device and category).
  Tensor clone() const;
  /// True when both tensors view the same allocation.
  bool shares_storage_with(const Tensor& other) const;

  /// Copies @p source's elements, across devices too; dtypes and element
  /// counts must match. GPU work is ordered on the rank's stream.
  void copy_from(const Tensor& source);
  /// Sets every element to @p value (converted to dtype()).
  void fill(double value);
  /// Element @p index of the flattened tensor, converted to double (a GPU
  /// tensor is copied to the host for it: fine for checks, slow in loops).
  double item(std::int64_t index) const;
  /// Sets element @p index of the flattened tensor.
  void set_item(std::int64_t index, double value);
  /// All elements as doubles (copied to the host).
  std::vector<double> to_vector() const;

 private:
  void check_dtype(DType expected) const;
  std::shared_ptr<Storage> storage_;
  std::int64_t offset_ = 0;  // in elements
  Shape shape_;
  DType dtype_ = DType::f32;
};

}  // namespace dtp
