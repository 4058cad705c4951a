// Errors. Library code checks its preconditions with CABM_CHECK, which reports the
// file:line of the check and what was expected; boundary code (files, flags, user data)
// throws cabm::Error with a message that names the file, tensor or flag.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace cabm {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// An error in how the library or the command was asked to run (a flag or option out of range,
// options that contradict each other), as opposed to a failure while doing it (a bad file, no
// memory). `cabm` exits with 2 for these and 1 for every other Error.
class UsageError : public Error {
 public:
  using Error::Error;
};

// An allocation the system refused. The message says how many bytes and, where the allocating
// code knows, for what (a tensor's shape; a caller that knows more rethrows naming the model
// or file).
class OutOfMemory : public Error {
 public:
  using Error::Error;
};

namespace detail {
[[noreturn]] void check_failed(const char* file, int line, const char* condition,
                               const std::string& message);
}  // namespace detail

}  // namespace cabm

// CABM_CHECK(cond, "fmt string", args...): throws cabm::Error("file:line: message (cond)").
#define CABM_CHECK(cond, ...)                                                         \
  do {                                                                                \
    if (!(cond)) [[unlikely]]                                                         \
      ::cabm::detail::check_failed(__FILE__, __LINE__, #cond, ::fmt::format(__VA_ARGS__)); \
  } while (0)
