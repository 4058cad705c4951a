#include "cli/commands.h"

#include "core/error.h"

namespace cabm::cli {

void register_forward(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("forward", "Run a PyTorch encoder or attention state_dict on inputs");
  cmd->callback([] { throw Error("cabm forward: not built yet"); });
}

}  // namespace cabm::cli
