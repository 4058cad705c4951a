// Checked conversions of untrusted numbers: every reader of metadata strings, state.json
// numbers, environment variables and command-line flags narrows through these, so that text
// such as "1.5", "4.3e39", "18446744073709551616" or "-1" (for a count) is one clear error
// instead of a clamped, wrapped or undefined value.
//
// `what` names the value for the message, which always has the form
//   {what}: '{text}' is not an integer in [{min}, {max}]
//   {what}: '{text}' is not a finite number in [{min}, {max}]      ("(0, 1]" for open bounds)
// e.g. "runs/lm/step-00000002/model.safetensors: metadata 'vocab_size': '9223372036854775807'
// is not an integer in [1, 2147483648]". The try_ forms return the part after "{what}: " instead
// of throwing (for the command line, whose parser adds the flag's name itself).
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

namespace cabm {

inline constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
inline constexpr uint64_t kUint64Max = std::numeric_limits<uint64_t>::max();

// Decimal text → an integer in [min, max]. Only an optional '-' followed by decimal digits is
// an integer ("007" is 7); "", " 7", "+7", "7 ", "1.5", "1e3" and "0x10" are not. A value
// beyond 64 bits is out of range, never clamped.
int64_t parse_integer(std::string_view text, int64_t min, int64_t max, std::string_view what);
std::optional<int64_t> try_parse_integer(std::string_view text, int64_t min, int64_t max, std::string& problem);
// The same for unsigned values up to `max` (a seed: any of the 2^64): "-1" is an error, not
// 2^64 − 1.
uint64_t parse_unsigned(std::string_view text, std::string_view what, uint64_t max = kUint64Max);
std::optional<uint64_t> try_parse_unsigned(std::string_view text, uint64_t max, std::string& problem);

// A value some parser already produced as an integer (a JSON number), range-checked with the
// same message.
int64_t checked_integer(int64_t value, int64_t min, int64_t max, std::string_view what);
int64_t checked_integer(uint64_t value, int64_t min, int64_t max, std::string_view what);
// For a value that is not an integer at all (a JSON float or string; `shown` is how the input
// wrote it): always throws the same message.
[[noreturn]] void throw_not_integer(std::string_view shown, int64_t min, int64_t max, std::string_view what);
[[noreturn]] void throw_not_unsigned(std::string_view shown, uint64_t max, std::string_view what);

// A closed or half-open interval of finite reals.
struct RealRange {
  double min = -std::numeric_limits<double>::max();
  double max = std::numeric_limits<double>::max();
  bool min_open = false;          // (min, ...
  bool max_open = false;          // ..., max)
  bool contains(double v) const;  // false for NaN and ±inf
  std::string str() const;        // "[0, 1)"
};
// Decimal (or hexadecimal floating) text, whole, to a finite double in `range`: "nan", "inf",
// "1e999", "0.5x", " 1" and "" are errors.
double parse_real(std::string_view text, const RealRange& range, std::string_view what);
std::optional<double> try_parse_real(std::string_view text, const RealRange& range, std::string& problem);
// A value already parsed (a JSON number): finite and in range, else the same error.
double checked_real(double value, const RealRange& range, std::string_view what);

}  // namespace cabm
