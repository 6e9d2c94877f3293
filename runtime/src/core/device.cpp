#include "dtp/device.h"

#include <cstdlib>

#include "dtp/error.h"

namespace dtp {

std::string Device::str() const {
  return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index);
}

const char* device_kind_name(DeviceKind kind) { return kind == DeviceKind::cpu ? "cpu" : "cuda"; }

Device parse_device(const std::string& text) {
  if (text == "cpu") return Device::cpu();
  if (text == "cuda") return Device::cuda(0);
  if (text.rfind("cuda:", 0) == 0 && text.size() > 5) {
    char* end = nullptr;
    long index = std::strtol(text.c_str() + 5, &end, 10);
    if (*end == '\0' && index >= 0) return Device::cuda(static_cast<int>(index));
  }
  DTP_CHECK(false, "unknown device '", text, "': expected cpu, cuda or cuda:k (k >= 0)");
  return Device::cpu();
}

#ifndef DTP_HAVE_CUDA
int cuda_device_count() { return 0; }
#endif

}  // namespace dtp
