// What every fuzz target shares: a cabm::Error is a correct answer to a malformed input, so it
// is caught; anything else (a crash, a sanitizer report, std::bad_alloc, any other exception)
// escapes LLVMFuzzerTestOneInput and libFuzzer reports it as a finding.
#pragma once

#include "cabm/core/error.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

namespace cabm::fuzz {

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// Runs `body`; a cabm::Error ends the input normally. CABM_FUZZ_VERBOSE=1 prints its message
// (to see how far a seed gets: fuzz_<target> -runs=0 DIR).
template <typename Body>
int run(Body&& body) {
  try {
    body();
  } catch (const Error& e) {
    static const bool verbose = std::getenv("CABM_FUZZ_VERBOSE") != nullptr;
    if (verbose) std::fprintf(stderr, "cabm::Error: %s\n", e.what());
  }
  return 0;
}

// An invariant of the code under test that the input broke: report and abort (a finding).
[[noreturn]] inline void invariant_failed(const char* what) {
  std::fprintf(stderr, "fuzz invariant failed: %s\n", what);
  std::abort();
}

}  // namespace cabm::fuzz
