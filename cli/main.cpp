// The `cabm` command line. Each subcommand lives in its own file (cli/cmd_*.cpp) and
// registers itself here.
#include "cli/commands.h"
#include "core/error.h"
#include "core/threads.h"

#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>

int main(int argc, char** argv) {
  CLI::App app{"cabm: self-attention and Transformer encoders in C++"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "cabm 0.1.0");
  cabm::cli::register_forward(app);
  cabm::cli::register_train(app);
  cabm::cli::register_generate(app);
  cabm::cli::register_eval(app);
  cabm::cli::register_bench(app);
  cabm::cli::register_bench_model(app);
  cabm::cli::register_memory(app);
  // A bad flag is one line on stderr (CLI11's default adds a second "Run with --help" line).
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return std::string("cabm: error: ") + e.what() + " (see --help)\n";
  });
  try {
    cabm::init_threads_from_env();
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cabm: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
