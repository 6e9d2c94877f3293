#include "dtp_cli.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <iomanip>
#include <sstream>

#include "dtp/error.h"

namespace dtp::cli {

namespace {

// A bound as it was written: an integer whole, a real to 15 significant
// digits (a double's 0.01 is 0.01000000000000000021 as a long double).
std::string number_text(long double value, bool integer) {
  std::ostringstream out;
  if (integer)
    out << static_cast<long long>(value);
  else
    out << std::setprecision(15) << value;
  return out.str();
}

// The strict syntax alone, for INT, UINT and FLOAT options without a Range.
CLI::Validator syntax_check(bool integer) {
  return CLI::Validator(
      [integer](std::string& text) -> std::string {
        const bool ok =
            integer ? parse_integer_text(text).has_value() : parse_real_text(text).has_value();
        if (ok) return {};
        return std::string("expects ") +
               (integer ? "a decimal integer" : "a finite decimal number") + ", got '" + text + "'";
      },
      "");
}

bool starts_with(const std::string& text, const char* prefix) { return text.rfind(prefix, 0) == 0; }

// CLI11 appends a list flag given twice ("--ranks 2 --ranks 4" is 2,4) and
// drops an empty item ("2,,4" is 2,4). Both are mistakes to name, not to
// absorb: each list flag is given once, and every item has a value.
void check_list_options(CLI::App& app, int argc, char** argv) {
  for (const CLI::Option* option : app.get_options()) {
    if (option->get_items_expected_max() <= 1) continue;
    for (const std::string& long_name : option->get_lnames()) {
      const std::string flag = "--" + long_name;
      int given = 0;
      for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        std::string value;
        if (arg == flag && i + 1 < argc)
          value = argv[i + 1];
        else if (arg.rfind(flag + "=", 0) == 0)
          value = arg.substr(flag.size() + 1);
        else if (arg != flag)
          continue;
        ++given;
        if (value.empty() || value.front() == ',' || value.back() == ',' ||
            value.find(",,") != std::string::npos)
          throw CLI::ValidationError(
              flag, "expects a comma list without empty items, got '" + value + "'");
      }
      if (given > 1)
        throw CLI::ValidationError(flag + " was given more than once: give one comma list");
    }
  }
}

}  // namespace

Range::Range(long double low, long double high, bool integer) {
  const std::string range =
      "[" + number_text(low, integer) + ", " + number_text(high, integer) + "]";
  description(std::string(integer ? "INT" : "FLOAT") + " in " + range);
  func_ = [low, high, integer, range](std::string& text) -> std::string {
    const std::optional<long double> value =
        integer ? parse_integer_text(text) : std::optional<long double>(parse_real_text(text));
    if (value && *value >= low && *value <= high) return {};
    return std::string("expects ") + (integer ? "an integer" : "a number") + " in " + range +
           ", got '" + text + "'";
  };
}

std::optional<int> parse(CLI::App& app, int argc, char** argv) {
  for (CLI::Option* option : app.get_options()) {
    const std::string type = option->get_type_name();
    if (starts_with(type, "INT") || starts_with(type, "UINT")) option->check(syntax_check(true));
    if (starts_with(type, "FLOAT")) option->check(syntax_check(false));
  }
  try {
    check_list_options(app, argc, argv);
    app.parse(argc, argv);
    return std::nullopt;
  } catch (const CLI::CallForHelp&) {
    std::fputs(app.help().c_str(), stdout);
    return 0;
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "%s: error: %s (see --help)\n", app.get_name().c_str(),
                 error_text(e).c_str());
    return 2;
  }
}

void require_heads_divide_width(CLI::App& app, const int& d_model, const int& heads) {
  app.callback([&d_model, &heads] {
    if (heads > 0 && d_model % heads != 0)
      throw CLI::ValidationError("--d-model " + std::to_string(d_model) +
                                 " must divide by --heads " + std::to_string(heads) +
                                 " (each head is d_model / heads wide)");
  });
}

std::string error_text(const CLI::ParseError& error) {
  std::string message = error.what();
  // CLI11 says "--batch: At Most 1 required but received 2" for a flag given twice.
  const std::string::size_type at = message.find(": At Most 1 required but received");
  if (at != std::string::npos)
    message = message.substr(0, at) + " was given more than once: give it once";
  return message;
}

CLI::Option* add_device_option(CLI::App& app, Device& device, const std::string& help) {
  return app
      .add_option_function<std::string>(
          "--device",
          [&device](const std::string& text) {
            try {
              device = parse_device(text);
            } catch (const Error& e) {
              throw CLI::ValidationError("--device", e.what());
            }
          },
          help)
      ->type_name("DEVICE");
}

}  // namespace dtp::cli
