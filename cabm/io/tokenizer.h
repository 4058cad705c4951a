// Character-level tokenisation over UTF-8 bytes: token = byte value, V = 256.
//
// Bytes rather than code points: every file is representable without an unknown token or a
// vocabulary to store, the vocabulary is fixed (checkpoints need no tokenizer file), and for the
// mostly-ASCII English corpora we train on a byte is a character. A non-ASCII character costs
// 2-4 tokens, and a model may emit a byte sequence that is not valid UTF-8; Utf8Stream repairs
// that when text is printed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace cabm {

inline constexpr int64_t kByteVocabSize = 256;

std::vector<int64_t> encode_bytes(std::string_view text);
std::string decode_bytes(const std::vector<int64_t>& tokens);  // each token must be in [0, 256)

// Offset of the first byte that does not start or continue a well-formed UTF-8 sequence
// (RFC 3629: no overlongs, no surrogates, nothing above U+10FFFF), or nullopt if the text is
// valid UTF-8.
std::optional<size_t> find_invalid_utf8(std::string_view text);

// Turns a stream of bytes into valid UTF-8 text for printing: complete characters come out as
// soon as their last byte arrives, and every ill-formed sequence becomes U+FFFD.
class Utf8Stream {
 public:
  std::string push(uint8_t byte);  // what can be printed now (possibly empty)
  std::string finish();            // flushes an incomplete trailing sequence as U+FFFD

 private:
  std::string pending_;
  int expected_ = 0;  // total length of the pending sequence
};

}  // namespace cabm
