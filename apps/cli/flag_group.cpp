#include "flag_group.h"

#include <cstdio>
#include <exception>
#include <map>
#include <set>

#include "number_text.h"

namespace dtp::cli {
namespace {

std::string number_text(double value) {
  char text[64];
  std::snprintf(text, sizeof text, "%.15g", value);
  return text;
}

// "a, b or c".
std::string listed(const std::vector<std::string>& items) {
  std::string text;
  for (std::size_t i = 0; i < items.size(); ++i)
    text += (i == 0 ? "" : i + 1 == items.size() ? " or " : ", ") + items[i];
  return text;
}

}  // namespace

FlagGroup& FlagGroup::add_integer(const std::string& name, std::int64_t low, std::int64_t high,
                                  const std::string& value_name, const std::string& help,
                                  const std::string& default_text,
                                  std::function<void(std::int64_t)> store) {
  const std::string range = "[" + std::to_string(low) + ", " + std::to_string(high) + "]";
  flags_.push_back({name, value_name,
                    help + ", " + std::to_string(low) + " to " + std::to_string(high) +
                        " (default " + default_text + ")",
                    [name, low, high, range, store](const std::string& text) {
                      // The whole text, in decimal: no "12x", " 12", "1e3" or "0x10".
                      const std::optional<long double> value = parse_integer_text(text);
                      if (!value || *value < low || *value > high)
                        throw UsageError(name + " expects an integer in " + range + ", got '" +
                                         text + "'");
                      store(static_cast<std::int64_t>(*value));
                    }});
  return *this;
}

FlagGroup& FlagGroup::real(const std::string& name, double* target, double low, double high,
                           const std::string& value_name, const std::string& help, Ends ends,
                           const std::string& default_text) {
  return real(
      name, [target](double v) { *target = v; }, low, high, value_name, help,
      default_text.empty() ? number_text(*target) : default_text, ends);
}

FlagGroup& FlagGroup::real(const std::string& name, std::function<void(double)> store, double low,
                           double high, const std::string& value_name, const std::string& help,
                           const std::string& default_text, Ends ends) {
  const std::string range = std::string(ends == Ends::open_low ? "(" : "[") + number_text(low) +
                            ", " + number_text(high) + (ends == Ends::open_high ? ")" : "]");
  const std::string from = ends == Ends::open_low ? "above " + number_text(low) : number_text(low);
  const std::string to = ends == Ends::open_high ? "below " + number_text(high) : number_text(high);
  flags_.push_back(
      {name, value_name, help + ", " + from + " to " + to + " (default " + default_text + ")",
       [name, low, high, ends, range, store](const std::string& text) {
         // Decimal and finite: strtod would also take " 1", "0x10" and "nan".
         const std::optional<double> value = parse_real_text(text);
         const bool fits = value && (ends == Ends::open_low ? *value > low : *value >= low) &&
                           (ends == Ends::open_high ? *value < high : *value <= high);
         if (!fits)
           throw UsageError(name + " expects a number in " + range + ", got '" + text + "'");
         store(*value);
       }});
  return *this;
}

FlagGroup& FlagGroup::choice(const std::string& name, std::string* target,
                             const std::vector<std::string>& accepted, const std::string& help) {
  std::string values;
  for (const std::string& a : accepted) values += (values.empty() ? "" : "|") + a;
  flags_.push_back({name, values, help + " (default " + *target + ")",
                    [name, accepted, target](const std::string& text) {
                      for (const std::string& a : accepted)
                        if (text == a) {
                          *target = text;
                          return;
                        }
                      throw UsageError(name + " accepts " + listed(accepted) + ", got '" + text +
                                       "'");
                    }});
  return *this;
}

FlagGroup& FlagGroup::path(const std::string& name, std::string* target,
                           const std::string& value_name, const std::string& help) {
  flags_.push_back({name, value_name, help, [name, target](const std::string& text) {
                      if (text.empty()) throw UsageError(name + " expects a file path, got ''");
                      *target = text;
                    }});
  return *this;
}

FlagGroup& FlagGroup::toggle(const std::string& name, bool* target, const std::string& help) {
  flags_.push_back({name, "", help, [target](const std::string&) { *target = true; }});
  return *this;
}

FlagGroup& FlagGroup::custom(const std::string& name, const std::string& value_name,
                             const std::string& help,
                             std::function<void(const std::string&)> parse) {
  flags_.push_back({name, value_name, help, [name, parse](const std::string& text) {
                      try {
                        parse(text);
                      } catch (const UsageError&) {
                        throw;
                      } catch (const std::exception& e) {
                        throw UsageError(name + ": " + e.what());
                      }
                    }});
  return *this;
}

FlagGroup& FlagGroup::paragraph(const std::string& text) {
  paragraphs_.push_back(text);
  return *this;
}

const Flag* FlagGroup::find(const std::string& name) const {
  for (const Flag& flag : flags_)
    if (flag.name == name) return &flag;
  return nullptr;
}

int apply_flags(const FlagGroup& group, const std::vector<GivenFlag>& given) {
  int set = 0;
  for (const GivenFlag& g : given)
    if (const Flag* flag = group.find(g.name)) {
      flag->set(g.text);
      ++set;
    }
  return set;
}

bool was_given(const std::vector<GivenFlag>& given, const std::string& name, std::string* text) {
  for (const GivenFlag& g : given)
    if (g.name == name) {
      if (text) *text = g.text;
      return true;
    }
  return false;
}

namespace {

// @p text in lines of at most @p width characters, broken at spaces.
std::vector<std::string> wrap(const std::string& text, std::size_t width) {
  std::vector<std::string> lines;
  std::string line;
  std::size_t at = 0;
  while (at < text.size()) {
    std::size_t end = text.find(' ', at);
    if (end == std::string::npos) end = text.size();
    const std::string word = text.substr(at, end - at);
    if (!line.empty() && line.size() + 1 + word.size() > width) {
      lines.push_back(line);
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
    at = end + 1;
  }
  if (!line.empty()) lines.push_back(line);
  return lines;
}

}  // namespace

std::string format_groups(const std::vector<const FlagGroup*>& groups) {
  constexpr std::size_t kIndent = 2, kColumn = 26, kWidth = 80;
  std::string out;
  for (const FlagGroup* group : groups) {
    out += "\n" + group->title() + ":\n";
    for (const Flag& flag : group->flags()) {
      std::string name = std::string(kIndent, ' ') + flag.name +
                         (flag.value_name.empty() ? "" : " " + flag.value_name);
      const std::vector<std::string> lines = wrap(flag.help, kWidth - kColumn);
      if (name.size() + 2 > kColumn) {
        out += name + "\n";
        name.clear();
      }
      for (std::size_t i = 0; i < lines.size(); ++i) {
        out += (i == 0 ? name : std::string()) +
               std::string(kColumn - (i == 0 ? name.size() : 0), ' ') + lines[i] + "\n";
      }
    }
    for (const std::string& paragraph : group->paragraphs())
      for (const std::string& line : wrap(paragraph, kWidth - kIndent))
        out += std::string(kIndent, ' ') + line + "\n";
  }
  return out;
}

}  // namespace dtp::cli
