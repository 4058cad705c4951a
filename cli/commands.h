// Registration of the `cabm` subcommands; each is defined in cli/cmd_<name>.cpp.
#pragma once

#include <CLI/CLI.hpp>

namespace cabm::cli {

void register_forward(CLI::App& app);

}  // namespace cabm::cli
