/// @file device.h
/// @brief Where a tensor lives: the host ("cpu") or one GPU ("cuda:k").
#pragma once

#include <string>

namespace dtp {

/// A device: the host CPU or CUDA device number `index`.
struct Device {
  /// Host memory or CUDA device memory.
  enum class Kind { cpu, cuda };
  Kind kind = Kind::cpu;  ///< host or GPU
  int index = 0;          ///< CUDA device ordinal; 0 for cpu (a checker may use
                          ///< {cpu, 1} as host memory that is not "the host")

  /// The host.
  static Device cpu() { return {Kind::cpu, 0}; }
  /// GPU @p index; not checked against the GPUs present (launch() checks).
  static Device cuda(int index = 0) { return {Kind::cuda, index}; }
  /// True for the host.
  bool is_cpu() const { return kind == Kind::cpu; }
  /// True for any GPU, whatever its index.
  bool is_cuda() const { return kind == Kind::cuda; }
  /// "cpu" or "cuda:k".
  std::string str() const;
  /// Equal when both kind and index match.
  bool operator==(const Device&) const = default;
};

/// Host or GPU, without the GPU's index: what the memory tracker splits by.
/// The same enum as Device::kind (DeviceKind::cpu, DeviceKind::cuda).
using DeviceKind = Device::Kind;
/// Number of DeviceKind values (for per-kind arrays).
inline constexpr int kDeviceKindCount = 2;
/// "cpu" or "cuda".
const char* device_kind_name(DeviceKind kind);

/// Parses "cpu", "cuda" or "cuda:k"; throws dtp::Error naming the accepted forms.
Device parse_device(const std::string& text);

/// Number of usable CUDA devices: 0 when DTP was built without CUDA or when
/// cudaGetDeviceCount fails (no driver, no GPU).
int cuda_device_count();

}  // namespace dtp
