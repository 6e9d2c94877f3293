// An environment variable set for one scope: the comm tests' DTP_SEND and
// DTP_TIMEOUT, the GPU tests' DTP_FLASH_KERNEL.
#pragma once

#include <cstdlib>
#include <optional>
#include <string>

namespace dtp::testing {

/// Sets an environment variable for one scope and restores it afterwards.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_)
      setenv(name_, old_->c_str(), 1);
    else
      unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

}  // namespace dtp::testing
