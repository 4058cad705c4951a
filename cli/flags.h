// The checks every `cabm` flag carries. A numeric flag's text must be a decimal integer (or a
// finite real) inside the flag's documented range, checked by the library's one set of checked
// conversions (cabm/core/checked.h) before CLI11 converts it; a word flag's value must be one
// the library parses. A failure is a CLI11 ValidationError, "--steps: '1.5' is not an integer
// in [1, 1099511627776]", and so exit status 2 like every other usage error (cli/main.cpp).
#pragma once

#include "cabm/core/checked.h"

#include <CLI/CLI.hpp>

#include <cstdint>
#include <functional>
#include <string>

namespace cabm::cli {

CLI::Validator integer_in(int64_t min, int64_t max);
CLI::Validator any_unsigned();  // 0 .. 2^64 − 1; "-1" refused (CLI11 would wrap it)
CLI::Validator real_in(const RealRange& range);
// Accepted when parse(text) throws no cabm::Error (parse_schedule, parse_precision, ...).
CLI::Validator accepted_by(const std::function<void(const std::string&)>& parse, const std::string& values);

// The option every subcommand has: --threads N in [1, kMaxThreads].
CLI::Option* add_threads_option(CLI::App* cmd, int& threads);
// Applies --threads when it was given.
void apply_threads(const CLI::Option* option, int threads);

}  // namespace cabm::cli
