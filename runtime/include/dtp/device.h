/// @file device.h
/// @brief Where a tensor lives: the host ("cpu") or one GPU ("cuda:k").
#pragma once

#include <string>

namespace dtp {

/// A device: the host CPU or CUDA device number `index`.
struct Device {
  enum class Kind { cpu, cuda };
  Kind kind = Kind::cpu;
  int index = 0;

  static Device cpu() { return {Kind::cpu, 0}; }
  static Device cuda(int index = 0) { return {Kind::cuda, index}; }
  bool is_cpu() const { return kind == Kind::cpu; }
  bool is_cuda() const { return kind == Kind::cuda; }
  /// "cpu" or "cuda:k".
  std::string str() const;
  bool operator==(const Device&) const = default;
};

/// Parses "cpu", "cuda" or "cuda:k"; throws dtp::Error naming the accepted forms.
Device parse_device(const std::string& text);

/// Number of usable CUDA devices: 0 when DTP was built without CUDA or when
/// cudaGetDeviceCount fails (no driver, no GPU).
int cuda_device_count();

}  // namespace dtp
