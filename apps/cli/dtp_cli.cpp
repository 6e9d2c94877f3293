#include "dtp_cli.h"

#include <cstdio>

#include "dtp/error.h"

namespace dtp::cli {

std::optional<int> parse(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
    return std::nullopt;
  } catch (const CLI::CallForHelp&) {
    std::fputs(app.help().c_str(), stdout);
    return 0;
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "%s: error: %s (see --help)\n", app.get_name().c_str(), e.what());
    return 2;
  }
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
