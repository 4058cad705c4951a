#include "cli/flags.h"

#include "cabm/core/error.h"
#include "cabm/core/threads.h"

#include <fmt/format.h>

namespace cabm::cli {

// Validators may rewrite the text they accept: integers are handed on in canonical decimal, so
// that CLI11's own conversion (strtoll with base 0: "010" is octal 8 there) sees the number the
// check saw.
CLI::Validator integer_in(int64_t min, int64_t max) {
  return CLI::Validator(
      [min, max](std::string& text) {
        std::string problem;
        const auto v = try_parse_integer(text, min, max, problem);
        if (!v) return problem;
        text = std::to_string(*v);
        return std::string();
      },
      fmt::format("in [{}, {}]", min, max));
}

CLI::Validator any_unsigned() {
  return CLI::Validator(
      [](std::string& text) {
        std::string problem;
        const auto v = try_parse_unsigned(text, kUint64Max, problem);
        if (!v) return problem;
        text = std::to_string(*v);
        return std::string();
      },
      fmt::format("in [0, {}]", kUint64Max));
}

CLI::Validator real_in(const RealRange& range) {
  return CLI::Validator(
      [range](std::string& text) {
        std::string problem;
        return try_parse_real(text, range, problem) ? std::string() : problem;
      },
      fmt::format("in {}", range.str()));
}

CLI::Validator accepted_by(const std::function<void(const std::string&)>& parse, const std::string& values) {
  return CLI::Validator(
      [parse](std::string& text) {
        try {
          parse(text);
        } catch (const Error& e) {
          return std::string(e.what());
        }
        return std::string();
      },
      values);
}

CLI::Option* add_threads_option(CLI::App* cmd, int& threads) {
  return cmd->add_option("--threads", threads, "threads (default: CABM_NUM_THREADS or all cores)")
      ->check(integer_in(1, kMaxThreads));
}

void apply_threads(const CLI::Option* option, int threads) {
  if (option->count() > 0) set_num_threads(threads);
}

}  // namespace cabm::cli
