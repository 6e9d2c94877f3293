/// @file json.h
/// @brief The JSON the trace, the trainer's log and the benchmarks write by
/// hand: quoted strings, numbers, and one-line objects built from them; and
/// a small strict parser for what DTP reads back (a checkpoint's header).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
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
  // Each add() appends "key": value and returns the line, so calls chain:
  // JsonLine().add("step", 3).add("loss", 2.5).str().
  /// A string, escaped.
  JsonLine& add(const std::string& key, const std::string& value) {
    return raw(key, json_string(value));
  }
  /// A string, escaped.
  JsonLine& add(const std::string& key, const char* value) { return add(key, std::string(value)); }
  /// A number with the line's significant digits (NaN and infinities: null).
  JsonLine& add(const std::string& key, double value) {
    return raw(key, json_number(value, digits_));
  }
  /// An integer, every digit.
  JsonLine& add(const std::string& key, std::int64_t value) {
    return raw(key, std::to_string(value));
  }
  /// An integer, every digit.
  JsonLine& add(const std::string& key, int value) { return raw(key, std::to_string(value)); }
  /// An integer, every digit.
  JsonLine& add(const std::string& key, std::uint64_t value) {
    return raw(key, std::to_string(value));
  }
  /// true or false.
  JsonLine& add(const std::string& key, bool value) { return raw(key, value ? "true" : "false"); }
  /// A list of numbers with the line's significant digits.
  JsonLine& add(const std::string& key, const std::vector<double>& values) {
    return list(key, values, [this](double v) { return json_number(v, digits_); });
  }
  /// A list of integers.
  JsonLine& add(const std::string& key, const std::vector<std::int64_t>& values) {
    return list(key, values, [](std::int64_t v) { return std::to_string(v); });
  }
  /// A list of strings, escaped.
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

/// A parsed JSON value. Numbers keep their text too, so integers read back
/// exactly (as_int) beyond a double's 53 bits.
struct JsonValue {
  /// What the value is.
  enum class Kind { null, boolean, number, string, array, object };
  Kind kind = Kind::null;                                  ///< what this value is
  bool boolean = false;                                    ///< a boolean's value
  std::string text;                                        ///< a string's value, a number's digits
  std::vector<JsonValue> items;                            ///< an array's
  std::vector<std::pair<std::string, JsonValue>> members;  ///< an object's, in file order

  /// The member @p key of an object, or nullptr when it has none.
  const JsonValue* find(const std::string& key) const;
  /// The member @p key; throws dtp::Error naming it when missing or not an object.
  const JsonValue& at(const std::string& key) const;
  /// A number as a double; throws naming @p what otherwise.
  double as_number(const std::string& what) const;
  /// An integral number, exactly; throws naming @p what otherwise.
  std::int64_t as_int(const std::string& what) const;
  /// A string; throws naming @p what otherwise.
  const std::string& as_string(const std::string& what) const;
  /// This value written back as compact JSON (numbers as they were read).
  std::string dump() const;
};

/// Parses one JSON value (RFC 8259: objects, arrays, strings with escapes,
/// numbers, true, false, null) with nothing but whitespace after it. Throws
/// dtp::Error naming the byte offset and what was expected there.
JsonValue parse_json(const std::string& text);

}  // namespace dtp
