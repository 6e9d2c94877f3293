// Flags declared as data. A FlagGroup is a titled list of flags, each with
// its value's name, its accepted range or choices, its help text and where
// its value goes. dtp-train's own flags and every strategy's flags
// (drivers/strategy.h) are FlagGroups: one parser reads them all
// (read_flags, apply_flags) and one formatter prints them (format_groups),
// so `dtp train --help` is generated from the groups.
//
//   FlagGroup group("Data parallel (--strategy ddp, chapter 02)");
//   group.integer("--accumulate", &options.accumulate, 1, 1 << 20, "K", "micro-batches per
//   optimizer step"); group.toggle("--prefetch", &options.prefetch, "gather the next unit while
//   this one computes");
#pragma once

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace dtp::cli {

/// A bad command line (exit status 2): the message names the flag and what
/// it accepts.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// One flag: how it reads its value and what --help says of it.
struct Flag {
  std::string name;        ///< "--bucket-mb"
  std::string value_name;  ///< "X" in "--bucket-mb X"; empty: a switch, present means on
  std::string help;        ///< what it does, what it accepts, its default
  /// Reads the flag's text (a switch's is "") into its target; throws
  /// UsageError naming the flag and what it accepts.
  std::function<void(const std::string& text)> set;
};

/// Which ends of a range of real numbers belong to it: [low, high],
/// (low, high] or [low, high).
enum class Ends { closed, open_low, open_high };

/// A titled list of flags (a section of --help).
class FlagGroup {
 public:
  explicit FlagGroup(std::string title) : title_(std::move(title)) {}

  /// An integer in [low, high] into @p target. The help gets ", LOW to
  /// HIGH (default VALUE)" appended, VALUE the target's value now, or
  /// @p default_text when given.
  template <typename Int>
  FlagGroup& integer(const std::string& name, Int* target, std::int64_t low, std::int64_t high,
                     const std::string& value_name, const std::string& help,
                     const std::string& default_text = {}) {
    return add_integer(name, low, high, value_name, help,
                       default_text.empty() ? std::to_string(*target) : default_text,
                       [target](std::int64_t v) { *target = static_cast<Int>(v); });
  }
  /// A finite number in the range from @p low to @p high (its ends as
  /// @p ends says) into @p target; the help as for integer().
  FlagGroup& real(const std::string& name, double* target, double low, double high,
                  const std::string& value_name, const std::string& help, Ends ends = Ends::closed,
                  const std::string& default_text = {});
  /// The same, handing the number to @p store (which converts it: MiB to
  /// bytes); the help's default is @p default_text.
  FlagGroup& real(const std::string& name, std::function<void(double)> store, double low,
                  double high, const std::string& value_name, const std::string& help,
                  const std::string& default_text, Ends ends = Ends::closed);
  /// One of @p accepted into @p target ("--optimizer accepts adamw or sgd,
  /// got 'lion'"); the help gets "(default VALUE)" appended.
  FlagGroup& choice(const std::string& name, std::string* target,
                    const std::vector<std::string>& accepted, const std::string& help);
  /// A file path into @p target (an empty one is refused).
  FlagGroup& path(const std::string& name, std::string* target, const std::string& value_name,
                  const std::string& help);
  /// A switch: present sets @p target to true ("--prefetch=yes" is refused).
  FlagGroup& toggle(const std::string& name, bool* target, const std::string& help);
  /// A flag whose text @p parse reads; an exception it throws becomes the
  /// UsageError "NAME: its message" (a UsageError passes as it is).
  FlagGroup& custom(const std::string& name, const std::string& value_name, const std::string& help,
                    std::function<void(const std::string&)> parse);
  /// Text printed under the group's flags in --help.
  FlagGroup& paragraph(const std::string& text);

  const std::string& title() const { return title_; }
  const std::vector<Flag>& flags() const { return flags_; }
  const std::vector<std::string>& paragraphs() const { return paragraphs_; }
  /// The flag named @p name, or null.
  const Flag* find(const std::string& name) const;

 private:
  FlagGroup& add_integer(const std::string& name, std::int64_t low, std::int64_t high,
                         const std::string& value_name, const std::string& help,
                         const std::string& default_text, std::function<void(std::int64_t)> store);
  std::string title_;
  std::vector<Flag> flags_;
  std::vector<std::string> paragraphs_;
};

/// A flag as the command line gave it: its name and its text ("" for a
/// switch), in command-line order.
struct GivenFlag {
  std::string name;
  std::string text;
};

/// The flags of a command line, read with CLI11 (in dtp_cli, read_flags.cpp) ("--flag VALUE",
/// "--flag=VALUE", switches, -h/--help). Every flag of @p groups may be
/// given once; a flag declared by several groups (a strategy's --world) is
/// one flag. Throws UsageError for an unknown flag, a stray argument, a
/// flag given twice, a missing value and a switch given a value. Sets
/// @p help when -h or --help was given (nothing else is checked then).
std::vector<GivenFlag> read_flags(int argc, char** argv,
                                  const std::vector<const FlagGroup*>& groups, bool& help);

/// Sets every flag of @p given that @p group declares, in command-line
/// order; returns how many it set.
int apply_flags(const FlagGroup& group, const std::vector<GivenFlag>& given);

/// Whether @p name is among @p given; its text in @p text when it is.
bool was_given(const std::vector<GivenFlag>& given, const std::string& name,
               std::string* text = nullptr);

/// The groups as --help prints them: "Title:" and one entry per flag, the
/// help wrapped at 80 columns in a column of its own, then the paragraphs.
std::string format_groups(const std::vector<const FlagGroup*>& groups);

}  // namespace dtp::cli
