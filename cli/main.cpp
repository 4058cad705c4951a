// The `cabm` command line. Each subcommand lives in its own file (cli/cmd_*.cpp) and
// registers itself here.
#include "cli/commands.h"
#include "cabm/core/error.h"
#include "cabm/core/threads.h"

#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>
#include <exception>

#include <unistd.h>

namespace {

// OpenMP threads that reach the end of a parallel region spin (libgomp: 300,000 polls) before
// they sleep. When the cores are shared with other work, the spinning thread holds the core that
// the thread it waits for needs, and a fork-join can cost a scheduler time slice. `cabm train`
// (default model, 2 threads) on this 2-core VM, tokens/s (docs/training.md):
//   spin polls          300,000 (default)   20,000   1,000    0 (OMP_WAIT_POLICY=passive)
//   machine quiet       16,100–16,900        -       15,400–15,900    12,900–14,000
//   load ~7 (builds)    626–980            1,570     3,038    3,539–4,208
// 1,000 polls keeps 95% of the quiet speed and most of the gain under load. libgomp reads the
// setting once, when it is loaded, so when the user has chosen none (neither GOMP_SPINCOUNT nor
// OMP_WAIT_POLICY is set) cabm sets it and executes itself again, once.
void limit_openmp_spinning(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr) return;
  if (setenv("GOMP_SPINCOUNT", "1000", 1) != 0) return;
  execv("/proc/self/exe", argv);  // returns only if it failed: run on with the default policy
}

}  // namespace

int main(int argc, char** argv) {
  limit_openmp_spinning(argv);
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
