/// @file json.h
/// @brief The JSON the trace, the trainer's log and the benchmarks write by
/// hand: quoted strings, numbers, and one-line objects built from them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dtp {

/// @p text as a JSON string literal, quotes included, with `"`, `\` and
/// control characters escaped.
std::string json_string(const std::string& text);

/// @p value as a JSON number with @p digits significant digits; NaN and
/// infinities (which JSON cannot hold) become `null`.
std::string json_number(double value, int digits = 9);

/// One JSON object on one line, keys in the order added (a JSON-lines record).
class JsonLine {
 public:
  /// Numbers keep @p digits significant digits.
  explicit JsonLine(int digits = 9) : digits_(digits) {}
  JsonLine& add(const std::string& key, const std::string& value) { return raw(key, json_string(value)); }
  JsonLine& add(const std::string& key, const char* value) { return add(key, std::string(value)); }
  JsonLine& add(const std::string& key, double value) { return raw(key, json_number(value, digits_)); }
  JsonLine& add(const std::string& key, std::int64_t value) { return raw(key, std::to_string(value)); }
  JsonLine& add(const std::string& key, int value) { return raw(key, std::to_string(value)); }
  JsonLine& add(const std::string& key, std::uint64_t value) { return raw(key, std::to_string(value)); }
  JsonLine& add(const std::string& key, bool value) { return raw(key, value ? "true" : "false"); }
  JsonLine& add(const std::string& key, const std::vector<double>& values) {
    return list(key, values, [this](double v) { return json_number(v, digits_); });
  }
  JsonLine& add(const std::string& key, const std::vector<std::int64_t>& values) {
    return list(key, values, [](std::int64_t v) { return std::to_string(v); });
  }
  JsonLine& add(const std::string& key, const std::vector<std::string>& values) {
    return list(key, values, [](const std::string& v) { return json_string(v); });
  }
  /// @p value as it is: an object, a list or `null` written by the caller.
  JsonLine& raw(const std::string& key, const std::string& value) {
    // Appended piece by piece: GCC 12 warns (-Wrestrict) on "{" + std::string&&.
    text_ += text_.empty() ? '{' : ',';
    text_ += json_string(key);
    text_ += ':';
    text_ += value;
    return *this;
  }
  /// The object, closed.
  std::string str() const { return text_ + "}"; }

 private:
  template <typename T, typename Format>
  JsonLine& list(const std::string& key, const std::vector<T>& values, Format format) {
    std::string text = "[";
    for (const T& v : values) {
      if (text.size() > 1) text += ',';
      text += format(v);
    }
    return raw(key, text + "]");
  }

  int digits_;
  std::string text_;
};

}  // namespace dtp
