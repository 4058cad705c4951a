// The checked conversions every reader of untrusted numbers uses (cabm/core/checked.h), the
// overflow-checked shape → bytes arithmetic of Tensor::empty, and allocation failures as
// errors that say what was allocated (issue 16: F1, F5, F6, F8).
#include "cabm/core/checked.h"
#include "cabm/core/error.h"
#include "cabm/core/memory.h"
#include "cabm/core/tensor.h"
#include "util/test_util.h"

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <functional>

namespace cabm {
namespace {

using test::error_of;

TEST(CheckedInteger, AcceptsDecimalIntegersInRange) {
  EXPECT_EQ(parse_integer("0", 0, 10, "x"), 0);
  EXPECT_EQ(parse_integer("007", 0, 10, "x"), 7);
  EXPECT_EQ(parse_integer("-5", -10, 10, "x"), -5);
  EXPECT_EQ(parse_integer("9223372036854775807", 0, kInt64Max, "x"), kInt64Max);
  EXPECT_EQ(parse_integer("-9223372036854775808", std::numeric_limits<int64_t>::min(), 0, "x"),
            std::numeric_limits<int64_t>::min());
  EXPECT_EQ(parse_unsigned("18446744073709551615", "x"), kUint64Max);
}

// F5/F6: what strtoll or CLI11 clamped, wrapped or truncated.
TEST(CheckedInteger, RefusesWhatIsNotAnIntegerInRange) {
  for (const char* text : {"", "-", "1.5", "1e3", "0x10", " 7", "7 ", "+7", "seven", "4.3e39", "nan",
                           "9223372036854775808", "18446744073709551616", "99999999999999999999999"}) {
    const std::string message = error_of([&] { parse_integer(text, 0, kInt64Max, "m.safetensors: metadata 'k'"); });
    EXPECT_NE(message.find("m.safetensors: metadata 'k': '"), std::string::npos) << text << ": " << message;
    EXPECT_NE(message.find("is not an integer in [0, 9223372036854775807]"), std::string::npos) << message;
  }
  EXPECT_NE(
      error_of([] { parse_integer("11", 1, 10, "--layers"); }).find("--layers: '11' is not an integer in [1, 10]"),
      std::string::npos);
  EXPECT_NE(error_of([] { parse_integer("-1", 0, 10, "n"); }), "");
  // A seed: "-1" is not 2^64 − 1.
  EXPECT_NE(error_of([] { parse_unsigned("-1", "--seed"); }).find("--seed: '-1' is not an integer in [0, "),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_unsigned("18446744073709551616", "--seed"); }), "");
  // Already-parsed values (JSON numbers).
  EXPECT_NE(error_of([] { checked_integer(uint64_t{1} << 63, 0, kInt64Max, "step"); }), "");
  EXPECT_NE(error_of([] { checked_integer(int64_t{-1}, 0, 5, "step"); }).find("'-1'"), std::string::npos);
  EXPECT_NE(error_of([] { throw_not_integer("4.3e+39", 0, 5, "state.json: 'step'"); }).find("'4.3e+39'"),
            std::string::npos);
}

TEST(CheckedReal, FiniteAndInRange) {
  const RealRange unit{0, 1, false, true};
  EXPECT_EQ(parse_real("0.25", unit, "--dropout"), 0.25);
  EXPECT_EQ(parse_real("0", unit, "--dropout"), 0.0);
  for (const char* text : {"1", "-0.1", "nan", "NaN", "inf", "-inf", "1e999", "0.5x", "", " 0.5", "abc"})
    EXPECT_NE(error_of([&] { parse_real(text, unit, "--dropout"); }).find("--dropout: '"), std::string::npos) << text;
  EXPECT_NE(error_of([] {
              parse_real("nan", {0, 1}, "--min-lr-ratio");
            }).find("is not a finite number in [0, 1]"),
            std::string::npos);
  EXPECT_NE(error_of([] { checked_real(NAN, {}, "lr"); }), "");
  EXPECT_EQ(RealRange({0, 1, true, false}).str(), "(0, 1]");
}

// F1: a shape whose element or byte count overflows is an error, never a wrapped allocation.
TEST(CheckedShapes, OverflowingShapesAreErrors) {
  EXPECT_EQ(shape_numel({2, 3, 4}), 24);
  EXPECT_EQ(shape_numel({0, 5}), 0);
  const int64_t big = int64_t{1} << 62;
  EXPECT_NE(error_of([&] { shape_numel({big, 4}); }).find("more than 2^63 elements"), std::string::npos);
  EXPECT_NE(error_of([&] { shape_numel({0, big, big}); }), "");  // its strides would overflow
  EXPECT_NE(error_of([&] { shape_numel({-1, 3}); }).find("negative"), std::string::npos);
  // 2^61 floats are 2^63 bytes: the byte count wraps in size_t arithmetic only unchecked.
  const std::string message = error_of([&] { Tensor::empty({int64_t{1} << 61}); });
  EXPECT_NE(message.find("larger than any machine's address space"), std::string::npos) << message;
  EXPECT_NE(message.find("[2305843009213693952]"), std::string::npos) << message;
  EXPECT_NE(error_of([&] { Tensor::zeros({int64_t{1} << 40, int64_t{1} << 40}); }), "");
  EXPECT_NE(error_of([&] { Tensor::empty({int64_t{9223372036854775807}}); }), "");
}

// Runs fn in a child process under an address-space limit; returns the child's exit status
// (fn's result), or -signal when it was killed.
int in_limited_child(size_t address_space, const std::function<int()>& fn) {
  const pid_t pid = fork();
  if (pid == 0) {
    const rlimit r{address_space, address_space};
    setrlimit(RLIMIT_AS, &r);
    int code = 99;
    try {
      code = fn();
    } catch (...) {
      code = 98;
    }
    _exit(code);
  }
  int raw = 0;
  waitpid(pid, &raw, 0);
  return WIFEXITED(raw) ? WEXITSTATUS(raw) : -WTERMSIG(raw);
}

// F8: an allocation the system refuses is a cabm::OutOfMemory naming the bytes and the shape
// (it was "tensor.cpp:38: out of memory allocating N bytes", with no shape), not a crash.
TEST(CheckedShapes, OutOfMemorySaysWhatWasAllocated) {
  CABM_SKIP_WITHOUT_ADDRESS_LIMITS();
  const int code = in_limited_child(size_t{1} << 30, [] {
    try {
      Tensor::zeros({int64_t{1} << 29, 4});  // 8 GiB
    } catch (const OutOfMemory& e) {
      const std::string m = e.what();
      const bool ok = m.find("out of memory allocating 8.0 GiB (8589934592 bytes)") != std::string::npos &&
                      m.find("for a [536870912, 4] F32 tensor") != std::string::npos;
      return ok ? 0 : 2;
    }
    return 3;
  });
  EXPECT_EQ(code, 0);
}

TEST(MemoryLimit, ReadsTheAddressSpaceLimit) {
  CABM_SKIP_WITHOUT_ADDRESS_LIMITS();
  EXPECT_GT(memory_limit_bytes(), 0);
  const int code = in_limited_child(size_t{1} << 30, [] {
    if (memory_limit_bytes() > (int64_t{1} << 30)) return 2;
    try {
      check_fits_in_memory(2.0 * (1 << 30), "the thing");
    } catch (const Error& e) {
      const std::string m = e.what();
      return m.find("the thing needs at least 2.0 GiB of memory; this process can use 1.0 GiB") != std::string::npos
                 ? 0
                 : 3;
    }
    return 4;
  });
  EXPECT_EQ(code, 0);
}

}  // namespace
}  // namespace cabm
