// Numbers on a command line, read strictly: the whole text, in decimal,
// finite. What every flag of every DTP program takes (dtp_cli.h's Range,
// FlagGroup's integer and real flags).
#pragma once

#include <optional>
#include <string>

namespace dtp::cli {

/// The whole text as a decimal integer ("-12"; not "12x", " 12", "0x10",
/// "1e3" or "4.0"), or std::nullopt.
std::optional<long double> parse_integer_text(const std::string& text);

/// The whole text as a finite decimal number ("0.5", "1e-3"; not "nan",
/// "inf", "0x1p3" or " 1"), or std::nullopt.
std::optional<double> parse_real_text(const std::string& text);

}  // namespace dtp::cli
