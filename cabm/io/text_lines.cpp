#include "cabm/io/text_lines.h"

#include "cabm/core/error.h"
#include "cabm/io/text_data.h"
#include "cabm/io/tokenizer.h"

#include <cerrno>
#include <cstring>

#include <unistd.h>

namespace cabm {

std::vector<std::string> split_text_lines(const std::string& text, const std::string& source) {
  std::vector<std::string> lines;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(at, end - at);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (const auto bad = find_invalid_utf8(line))
      throw Error(fmt::format("{}: line {}: not valid UTF-8 (byte offset {})", source, lines.size() + 1, *bad));
    lines.push_back(std::move(line));
    at = end + 1;
  }
  if (lines.empty()) throw Error(fmt::format("{}: no input lines", source));
  return lines;
}

namespace {

// Standard input to its end, whatever it is (file, pipe, terminal, /dev/null).
std::string read_stdin() {
  std::string out;
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = ::read(STDIN_FILENO, buffer, sizeof buffer);
    if (n == 0) return out;
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error(fmt::format("standard input: cannot read: {}", std::strerror(errno)));
    }
    out.append(buffer, static_cast<size_t>(n));
  }
}

}  // namespace

std::vector<std::string> read_text_lines(const std::string& path_or_dash) {
  if (path_or_dash == "-") return split_text_lines(read_stdin(), "standard input");
  return split_text_lines(read_file_bytes(path_or_dash), path_or_dash);
}

}  // namespace cabm
