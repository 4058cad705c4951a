// TEXTS files of the Hugging Face commands (`cabm tokenize`, `cabm embed`, `cabm classify`):
// UTF-8, one input per line.
#pragma once

#include <string>
#include <vector>

namespace cabm {

// The inputs of `path_or_dash` ("-": standard input): lines split on '\n', a '\r' before it
// dropped, and a final newline adds no input (so "a\n" is one input, "a\n\n" two, the second
// empty). Errors (cabm::Error) name the file: missing or unreadable, no input at all, and
// invalid UTF-8, naming the line ("PATH: line 3: not valid UTF-8 (byte offset 5)", the offset
// within the line).
std::vector<std::string> read_text_lines(const std::string& path_or_dash);

// The same split and checks on text already in memory; `source` names it in errors.
std::vector<std::string> split_text_lines(const std::string& text, const std::string& source);

}  // namespace cabm
