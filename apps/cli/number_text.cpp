#include "number_text.h"

#include <charconv>
#include <cmath>

namespace dtp::cli {

std::optional<long double> parse_integer_text(const std::string& text) {
  const bool negative = !text.empty() && text[0] == '-';
  const char* first = text.data() + (negative ? 1 : 0);
  const char* last = text.data() + text.size();
  if (first == last || *first < '0' || *first > '9')
    return std::nullopt;  // from_chars would take a second '-'
  unsigned long long magnitude = 0;
  const auto [end, error] = std::from_chars(first, last, magnitude, 10);
  if (error != std::errc{} || end != last) return std::nullopt;
  const long double value = static_cast<long double>(magnitude);  // exact: 64 mantissa bits
  return negative ? -value : value;
}

std::optional<double> parse_real_text(const std::string& text) {
  double value = 0;
  const char* last = text.data() + text.size();
  // chars_format::general: decimal with an optional exponent; no hex, no
  // leading space or '+'. It does take "inf" and "nan", refused below.
  const auto [end, error] = std::from_chars(text.data(), last, value, std::chars_format::general);
  if (text.empty() || error != std::errc{} || end != last || !std::isfinite(value))
    return std::nullopt;
  return value;
}

}  // namespace dtp::cli
