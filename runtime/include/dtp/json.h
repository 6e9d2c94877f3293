/// @file json.h
/// @brief The two pieces of JSON the trace, the trainer's log and the
/// benchmarks write by hand: quoted strings and numbers.
#pragma once

#include <string>

namespace dtp {

/// @p text as a JSON string literal, quotes included, with `"`, `\` and
/// control characters escaped.
std::string json_string(const std::string& text);

/// @p value as a JSON number with @p digits significant digits; NaN and
/// infinities (which JSON cannot hold) become `null`.
std::string json_number(double value, int digits = 9);

}  // namespace dtp
