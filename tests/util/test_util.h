// Helpers shared by the tests: random tensors, comparisons with tolerances, a scoped thread count.
#pragma once

#include "cabm/core/rng.h"
#include "cabm/core/tensor.h"
#include "cabm/io/text_data.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

namespace cabm::test {

// AddressSanitizer reserves terabytes of shadow memory at start-up, so a process under an
// address-space limit (RLIMIT_AS) cannot even start there: the tests that prove a limit is
// honoured skip, saying why, in a sanitizer build (the release build runs them).
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kAddressSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kAddressSanitizer = true;
#else
inline constexpr bool kAddressSanitizer = false;
#endif
#else
inline constexpr bool kAddressSanitizer = false;
#endif
#define CABM_SKIP_WITHOUT_ADDRESS_LIMITS()                                                         \
  do {                                                                                             \
    if (::cabm::test::kAddressSanitizer)                                                           \
      GTEST_SKIP() << "needs an address-space limit (RLIMIT_AS), which AddressSanitizer's shadow " \
                      "memory rules out; the release build runs it";                               \
    if (!::cabm::test::address_limits_take_effect())                                               \
      GTEST_SKIP() << "needs an address-space limit (RLIMIT_AS), which this process cannot set "   \
                      "(an emulator such as qemu-x86_64 ignores it)";                              \
  } while (0)

// Whether a child process that sets RLIMIT_AS reads the limit back (qemu's user-mode emulator,
// scripts/emulated_cpu_check.sh, accepts the call and ignores it).
bool address_limits_take_effect();

// An integer environment variable (random tests' case counts and seeds), or fallback when unset.
int env_int(const char* name, int fallback);

// Random-test draws from the host stream of cabm's Philox generator: the same cases on every
// machine.
class Draw {
 public:
  explicit Draw(uint64_t seed) : rng_(seed) {}
  int64_t in(int64_t lo, int64_t hi) { return lo + static_cast<int64_t>(rng_.next_u32() % (hi - lo + 1)); }
  bool chance(double p) { return rng_.next_uniform() < p; }
  uint64_t seed() { return rng_.next_u32(); }

 private:
  Rng rng_;
};

// A training text the trainers accept (256 bytes each side), for tests that feed their own
// batches through train_step_on.
TextSplit placeholder_text();

// The rows of a batch (tensors [parts·rows, ...]) as `parts` micro-batches of equal rows (copies).
std::vector<Tensor> micro_batches(const Tensor& batch, int64_t parts);

// Uniform in [lo, hi), deterministic in seed.
Tensor random_tensor(const Shape& shape, uint64_t seed, float lo = -1.0f, float hi = 1.0f);

// max |a − b| and whether every element satisfies |a − b| <= atol + rtol·|b| (torch.allclose
// semantics, NaN equal only to NaN). Shapes must match.
struct Comparison {
  bool ok = true;
  double max_abs_diff = 0;
  std::string first_bad;  // "index 12: 0.5 vs 0.6"
};
Comparison compare(const Tensor& actual, const Tensor& expected, double rtol, double atol);

#define EXPECT_CLOSE(actual, expected, rtol, atol)                                                       \
  do {                                                                                                   \
    const auto cmp_ = ::cabm::test::compare((actual), (expected), (rtol), (atol));                       \
    EXPECT_TRUE(cmp_.ok) << "max |diff| " << cmp_.max_abs_diff << "; first mismatch " << cmp_.first_bad; \
  } while (0)

// ‖a − b‖₂ / ‖b‖₂ over all elements (F32 tensors of equal size), in double.
double rel_diff(const Tensor& a, const Tensor& b);

class ScopedThreads {
 public:
  explicit ScopedThreads(int threads);
  ~ScopedThreads();

 private:
  int previous_;
};

// Sets an environment variable (nullptr: unsets it) for a scope, for the child processes a test
// starts; what it was (or its absence) comes back after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value);
  ~ScopedEnv();
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_, previous_;
  bool was_set_;
};

std::string fixtures_dir();  // where make_fixtures.py wrote its files
std::string cabm_binary();   // path of the built `cabm` executable
std::string temp_dir();      // a fresh directory for this test process

std::string read_file(const std::string& path);  // whole file as bytes ("" if unreadable)

// The message of the cabm::Error that f throws, or "" when it throws none.
std::string error_of(const std::function<void()>& f);

// Runs `cabm ARGS` through the shell (CABM_NUM_THREADS=2, stdin from /dev/null) and captures
// its exit status (-1 if it did not exit normally), stdout and stderr.
struct CmdResult {
  int status = -1;
  int signal = 0;  // the signal that ended it (run_cabm_limited only; 0: it exited)
  std::string out, err;
};
CmdResult run_cabm(const std::string& args);

// Runs `cabm ARGS` without a shell (fork + exec; CABM_NUM_THREADS=2, stdin from /dev/null),
// with, set in the child before exec, an address-space limit (RLIMIT_AS, bytes; 0: none), a CPU
// time limit (0: none) and a umask (-1: inherited). In an AddressSanitizer build the address
// space is not limited (see kAddressSanitizer) and the child's allocator returns null instead
// of aborting when memory runs out (ASAN_OPTIONS=allocator_may_return_null=1), as malloc would. Under the limit a
// regression that allocates without bound fails fast in the child instead of swapping the machine.
struct RunLimits {
  size_t address_space = size_t{2} << 30;
  int cpu_seconds = 120;  // RLIMIT_CPU: a run that should have been refused cannot go on for long
  int umask = -1;
};
CmdResult run_cabm_limited(const std::vector<std::string>& args, const RunLimits& limits = {});

// The bad-input contract of the CLI: a non-zero status and exactly one line on stderr that
// contains `needle` (the file, tensor or flag it names).
void expect_one_line_error(const CmdResult& r, const std::string& needle);

}  // namespace cabm::test
