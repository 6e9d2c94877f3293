// read_flags: a command line's flags, tokenized by CLI11. Apart from
// flag_group.cpp so that the code that only declares flags (the drivers)
// never compiles CLI11's header, which costs about 5 s per file.
#include <CLI/CLI.hpp>
#include <map>

#include "dtp_cli.h"
#include "flag_group.h"

namespace dtp::cli {

std::vector<GivenFlag> read_flags(int argc, char** argv,
                                  const std::vector<const FlagGroup*>& groups, bool& help) {
  help = false;
  // One CLI11 option per flag name, whichever groups declare it.
  std::map<std::string, bool> takes_value;
  for (const FlagGroup* group : groups)
    for (const Flag& flag : group->flags())
      takes_value.emplace(flag.name, !flag.value_name.empty());
  std::vector<GivenFlag> given;
  CLI::App app{"", argc > 0 ? argv[0] : "dtp"};
  app.allow_extras();  // reported below in DTP's words
  for (const auto& [name, value] : takes_value) {
    const std::string flag = name;
    if (value) {
      app.add_option_function<std::string>(flag, [flag, &given](const std::string& text) {
        given.push_back({flag, text});
      });
    } else {
      app.add_flag_callback(flag, [flag, &given] { given.push_back({flag, ""}); });
      // CLI11 would read "--prefetch=yes" as a switch turned on by a value.
      for (int i = 1; i < argc; ++i)
        if (std::string arg = argv[i]; arg.rfind(flag + "=", 0) == 0)
          throw UsageError(flag + " takes no value, got '" + arg + "'");
    }
  }
  // CLI11 reads "--steps=" as a missing value: it is an empty one, which the
  // flag's own check refuses, saying what it accepts.
  for (int i = 1; i < argc; ++i)
    if (std::string arg = argv[i]; arg.size() > 3 && arg.back() == '=')
      for (const FlagGroup* group : groups)
        if (const Flag* flag = group->find(arg.substr(0, arg.size() - 1));
            flag && !flag->value_name.empty())
          flag->set("");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    help = true;
    return {};
  } catch (const CLI::ParseError& e) {
    throw UsageError(error_text(e) + " (see --help)");
  }
  if (!app.remaining().empty())
    throw UsageError("unknown option '" + app.remaining().front() + "' (see --help)");
  return given;
}

}  // namespace dtp::cli
