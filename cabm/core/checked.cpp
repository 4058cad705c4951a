#include "cabm/core/checked.h"

#include "cabm/core/error.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>

namespace cabm {

namespace {

// Sign and magnitude of decimal text, or nullopt when it is not an integer; `overflow` when the
// magnitude needs more than 64 bits.
struct Whole {
  bool negative = false;
  uint64_t magnitude = 0;
  bool overflow = false;
};

std::optional<Whole> parse_whole(std::string_view text) {
  Whole w;
  size_t i = 0;
  if (!text.empty() && text[0] == '-') {
    w.negative = true;
    i = 1;
  }
  if (i == text.size()) return std::nullopt;
  for (; i < text.size(); ++i) {
    const char c = text[i];
    if (c < '0' || c > '9') return std::nullopt;
    if (__builtin_mul_overflow(w.magnitude, uint64_t{10}, &w.magnitude) ||
        __builtin_add_overflow(w.magnitude, static_cast<uint64_t>(c - '0'), &w.magnitude))
      w.overflow = true;
  }
  return w;
}

// Shown values are cut short and kept printable: a message is one line, not a copy of a
// hostile input.
std::string shorten(std::string_view text) {
  constexpr size_t kMax = 40;
  std::string out;
  for (const char c : text.substr(0, kMax)) out += (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) ? '?' : c;
  if (text.size() > kMax) out += "...";
  return out;
}

std::string not_integer(std::string_view shown, int64_t min, int64_t max) {
  return fmt::format("'{}' is not an integer in [{}, {}]", shorten(shown), min, max);
}
std::string not_unsigned(std::string_view shown, uint64_t max) {
  return fmt::format("'{}' is not an integer in [0, {}]", shorten(shown), max);
}
std::string not_real(std::string_view shown, const RealRange& range) {
  return fmt::format("'{}' is not a finite number in {}", shorten(shown), range.str());
}

[[noreturn]] void fail(std::string_view what, const std::string& problem) {
  throw Error(fmt::format("{}: {}", what, problem));
}

}  // namespace

std::optional<int64_t> try_parse_integer(std::string_view text, int64_t min, int64_t max, std::string& problem) {
  const std::optional<Whole> w = parse_whole(text);
  std::optional<int64_t> v;
  // Magnitudes up to 2^63 fit as negatives, up to 2^63 − 1 as positives.
  if (w && !w->overflow && w->negative && w->magnitude <= uint64_t{1} << 63)
    v = w->magnitude == uint64_t{1} << 63 ? std::numeric_limits<int64_t>::min() : -static_cast<int64_t>(w->magnitude);
  else if (w && !w->overflow && !w->negative && w->magnitude <= static_cast<uint64_t>(kInt64Max))
    v = static_cast<int64_t>(w->magnitude);
  if (!v || *v < min || *v > max) {
    problem = not_integer(text, min, max);
    return std::nullopt;
  }
  return v;
}

int64_t parse_integer(std::string_view text, int64_t min, int64_t max, std::string_view what) {
  std::string problem;
  const std::optional<int64_t> v = try_parse_integer(text, min, max, problem);
  if (!v) fail(what, problem);
  return *v;
}

std::optional<uint64_t> try_parse_unsigned(std::string_view text, uint64_t max, std::string& problem) {
  const std::optional<Whole> w = parse_whole(text);
  if (!w || w->overflow || w->negative || w->magnitude > max) {
    problem = not_unsigned(text, max);
    return std::nullopt;
  }
  return w->magnitude;
}

uint64_t parse_unsigned(std::string_view text, std::string_view what, uint64_t max) {
  std::string problem;
  const std::optional<uint64_t> v = try_parse_unsigned(text, max, problem);
  if (!v) fail(what, problem);
  return *v;
}

void throw_not_integer(std::string_view shown, int64_t min, int64_t max, std::string_view what) {
  fail(what, not_integer(shown, min, max));
}

void throw_not_unsigned(std::string_view shown, uint64_t max, std::string_view what) {
  fail(what, not_unsigned(shown, max));
}

int64_t checked_integer(int64_t value, int64_t min, int64_t max, std::string_view what) {
  if (value < min || value > max) throw_not_integer(std::to_string(value), min, max, what);
  return value;
}

int64_t checked_integer(uint64_t value, int64_t min, int64_t max, std::string_view what) {
  if (value > static_cast<uint64_t>(kInt64Max)) throw_not_integer(std::to_string(value), min, max, what);
  return checked_integer(static_cast<int64_t>(value), min, max, what);
}

bool RealRange::contains(double v) const {
  if (!std::isfinite(v)) return false;
  if (min_open ? !(v > min) : !(v >= min)) return false;
  if (max_open ? !(v < max) : !(v <= max)) return false;
  return true;
}

std::string RealRange::str() const {
  const auto bound = [](double b) {
    if (b >= std::numeric_limits<double>::max()) return std::string("inf");
    if (b <= -std::numeric_limits<double>::max()) return std::string("-inf");
    return fmt::format("{}", b);
  };
  return fmt::format("{}{}, {}{}", min_open ? '(' : '[', bound(min), bound(max), max_open ? ')' : ']');
}

std::optional<double> try_parse_real(std::string_view text, const RealRange& range, std::string& problem) {
  const std::string s(text);
  std::optional<double> v;
  if (!s.empty() && !std::isspace(static_cast<unsigned char>(s[0]))) {
    char* end = nullptr;
    errno = 0;
    const double x = std::strtod(s.c_str(), &end);
    if (*end == '\0' && errno != ERANGE) v = x;
  }
  if (!v || !range.contains(*v)) {
    problem = not_real(text, range);
    return std::nullopt;
  }
  return v;
}

double parse_real(std::string_view text, const RealRange& range, std::string_view what) {
  std::string problem;
  const std::optional<double> v = try_parse_real(text, range, problem);
  if (!v) fail(what, problem);
  return *v;
}

double checked_real(double value, const RealRange& range, std::string_view what) {
  if (!range.contains(value)) fail(what, not_real(fmt::format("{}", value), range));
  return value;
}

}  // namespace cabm
