// The `cabm` command line. Each subcommand lives in its own file (cli/cmd_*.cpp) and
// registers itself here.
#include "cabm/core/error.h"
#include "cabm/core/threads.h"
#include "cabm/kernels/cpu_isa.h"
#include "cabm/kernels/openblas_core.h"
#include "cabm/train/distributed.h"
#include "cli/commands.h"

#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <new>
#include <string>

#include <strings.h>
#include <unistd.h>

namespace {

constexpr int kFailure = 1;  // the command was fine; running it failed
constexpr int kUsage = 2;    // the command line was wrong

// Whether the user asks OpenMP to bind threads to places. libgomp then binds this thread to its
// first place as it loads, and an image executed from here would inherit that one CPU and put every
// thread on it (half the speed of `cabm bench attention` on two cores, Intel Xeon, session 29).
bool openmp_binding_requested() {
  const char* bind = std::getenv("OMP_PROC_BIND");
  if (bind != nullptr && *bind != '\0' && strcasecmp(bind, "false") != 0) return true;
  for (const char* name : {"OMP_PLACES", "GOMP_CPU_AFFINITY"}) {
    const char* value = std::getenv(name);
    if (value != nullptr && *value != '\0') return true;
  }
  return false;
}

// OpenMP threads that reach the end of a parallel region spin (libgomp: 300,000 polls) before
// they sleep. When the cores are shared with other work, the spinning thread holds the core that
// the thread it waits for needs, and a fork-join can cost a scheduler time slice. `cabm train`
// (default model, 2 threads) on this 2-core VM, tokens/s (docs/training.md):
//   spin polls          300,000 (default)   20,000   1,000    0 (OMP_WAIT_POLICY=passive)
//   machine quiet       16,100–16,900        -       15,400–15,900    12,900–14,000
//   load ~7 (builds)    626–980            1,570     3,038    3,539–4,208
// 1,000 polls keeps 95% of the quiet speed and most of the gain under load. Whether cabm sets it:
// when the user has chosen none (neither GOMP_SPINCOUNT nor OMP_WAIT_POLICY is set).
bool limit_openmp_spinning() {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr) return false;
  return setenv("GOMP_SPINCOUNT", "1000", 1) == 0;
}

// OpenBLAS's generic kernels on a CPU that its release does not know (kernels/openblas_core.h):
// the kernels of the CPU's SIMD set instead, when the user has not named a core. Whether cabm
// sets OPENBLAS_CORETYPE.
bool request_openblas_core() {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return false;
  cabm::SimdIsa isa;
  try {
    isa = cabm::widest_simd_isa();
  } catch (const cabm::UsageError&) {  // a bad CABM_MAX_CPU_ISA: reported by main, in its place
    return false;
  }
  const char* core = cabm::openblas_core_to_request(cabm::openblas_core(), isa);
  return core != nullptr && setenv("OPENBLAS_CORETYPE", core, 1) == 0;
}

// Whether this process was started by naming the dynamic loader (ld-linux-x86-64.so.2 --library-path
// DIR cabm ..., scripts/cpu_check_run.sh): /proc/self/exe is then the loader, which executed again
// would not find cabm in argv.
bool started_through_loader() {
  std::error_code error;
  const std::string exe = std::filesystem::read_symlink("/proc/self/exe", error).filename().string();
  return error || exe.rfind("ld-", 0) == 0;
}

// libgomp and OpenBLAS read their settings once, when they are loaded: to change one, cabm sets
// it and executes itself again, once (the variables are set then). Not where threads are to be
// bound (openmp_binding_requested).
void choose_load_time_settings(char** argv) {
  if (openmp_binding_requested() || started_through_loader()) return;
  const bool spin = limit_openmp_spinning();
  const bool blas = request_openblas_core();
  if (spin || blas) execv("/proc/self/exe", argv);  // returns only if it failed: run on as loaded
}

// In a data-parallel run (mpirun -np K), which process failed; "" otherwise.
std::string rank_label() {
  if (!cabm::mpi_started()) return "";
  const cabm::World& w = cabm::world();
  return " (rank " + std::to_string(w.rank) + " of " + std::to_string(w.size) + ")";
}

// An error on one rank of a data-parallel run ends the whole job (the other ranks would wait
// for this one in their next collective); otherwise returns the status.
int end_job(int status) {
  std::fflush(stderr);
  if (cabm::mpi_started()) cabm::abort_job(status);
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  choose_load_time_settings(argv);
  CLI::App app{"cabm: self-attention and Transformer encoders in C++"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "cabm 0.1.0");
  cabm::cli::register_forward(app);
  cabm::cli::register_attention(app);
  cabm::cli::register_train(app);
  cabm::cli::register_generate(app);
  cabm::cli::register_eval(app);
  cabm::cli::register_bench(app);
  cabm::cli::register_bench_model(app);
  cabm::cli::register_bench_decode(app);
  cabm::cli::register_memory(app);
  cabm::cli::register_tokenize(app);
  cabm::cli::register_embed(app);
  cabm::cli::register_classify(app);
  app.footer(
      "Exit status: 0 success; 1 failure (a missing or malformed file, a model or checkpoint that does not fit, out "
      "of memory, divergence); 2 usage error (unknown flag, a flag value that is malformed or out of range, flags "
      "that contradict each other). Errors are one line on stderr naming the file, tensor or flag.");
  // A bad flag is one line on stderr (CLI11's default adds a second "Run with --help" line).
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return std::string("cabm: error: ") + e.what() + " (see --help)\n";
  });
  try {
    try {
      cabm::init_threads_from_env();
    } catch (const cabm::Error& e) {
      throw cabm::UsageError(e.what());
    }
    // The variables that choose the kernels, read now so that a bad value is a usage error for
    // every command, not only for the ones that reach a kernel.
    cabm::cpu_isa_cap();
    cabm::simd_isa();
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version are "errors" with status 0; every other parse error is a usage error
    // (CLI11's own codes, 100-120, would tell a script nothing more).
    const int status = app.exit(e);
    return status == 0 ? 0 : kUsage;
  } catch (const cabm::UsageError& e) {
    std::fprintf(stderr, "cabm: error%s: %s (see --help)\n", rank_label().c_str(), e.what());
    return end_job(kUsage);
  } catch (const std::bad_alloc&) {  // outside a tensor (which says what it was): a vector, a string
    std::fprintf(stderr, "cabm: error%s: out of memory\n", rank_label().c_str());
    return end_job(kFailure);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cabm: error%s: %s\n", rank_label().c_str(), e.what());
    return end_job(kFailure);
  }
  return 0;
}
