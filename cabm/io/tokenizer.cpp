#include "cabm/io/tokenizer.h"

#include "cabm/core/error.h"

namespace cabm {

namespace {

constexpr const char* kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Length of the sequence a lead byte starts (0: not a lead byte).
int utf8_length(uint8_t b) {
  if (b < 0x80) return 1;
  if (b >= 0xC2 && b <= 0xDF) return 2;
  if (b >= 0xE0 && b <= 0xEF) return 3;
  if (b >= 0xF0 && b <= 0xF4) return 4;
  return 0;
}

// Whether `b` may follow `lead` as the second byte (the RFC 3629 table's special cases rule
// out overlongs, surrogates and code points above U+10FFFF).
bool valid_second(uint8_t lead, uint8_t b) {
  if (lead == 0xE0) return b >= 0xA0 && b <= 0xBF;
  if (lead == 0xED) return b >= 0x80 && b <= 0x9F;
  if (lead == 0xF0) return b >= 0x90 && b <= 0xBF;
  if (lead == 0xF4) return b >= 0x80 && b <= 0x8F;
  return b >= 0x80 && b <= 0xBF;
}

}  // namespace

std::vector<int64_t> encode_bytes(std::string_view text) {
  std::vector<int64_t> tokens(text.size());
  for (size_t i = 0; i < text.size(); ++i) tokens[i] = static_cast<uint8_t>(text[i]);
  return tokens;
}

std::string decode_bytes(const std::vector<int64_t>& tokens) {
  std::string text(tokens.size(), '\0');
  for (size_t i = 0; i < tokens.size(); ++i) {
    CABM_CHECK(tokens[i] >= 0 && tokens[i] < kByteVocabSize, "token {} is not a byte: {}", i, tokens[i]);
    text[i] = static_cast<char>(tokens[i]);
  }
  return text;
}

std::optional<size_t> find_invalid_utf8(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    const uint8_t lead = static_cast<uint8_t>(text[i]);
    const int len = utf8_length(lead);
    if (len == 0) return i;
    if (i + static_cast<size_t>(len) > text.size()) return i;
    if (len >= 2 && !valid_second(lead, static_cast<uint8_t>(text[i + 1]))) return i;
    for (int k = 2; k < len; ++k)
      if ((static_cast<uint8_t>(text[i + static_cast<size_t>(k)]) & 0xC0) != 0x80) return i;
    i += static_cast<size_t>(len);
  }
  return std::nullopt;
}

std::string Utf8Stream::push(uint8_t byte) {
  std::string out;
  if (!pending_.empty()) {
    const uint8_t lead = static_cast<uint8_t>(pending_[0]);
    const bool continues = pending_.size() == 1 ? valid_second(lead, byte) : (byte & 0xC0) == 0x80;
    if (continues) {
      pending_.push_back(static_cast<char>(byte));
      if (static_cast<int>(pending_.size()) == expected_) {
        out.swap(pending_);
        expected_ = 0;
      }
      return out;
    }
    // The pending sequence is broken: replace it, then treat `byte` afresh.
    out = kReplacement;
    pending_.clear();
    expected_ = 0;
  }
  const int len = utf8_length(byte);
  if (len == 1) {
    out.push_back(static_cast<char>(byte));
  } else if (len == 0) {
    out += kReplacement;
  } else {
    pending_.push_back(static_cast<char>(byte));
    expected_ = len;
  }
  return out;
}

std::string Utf8Stream::finish() {
  if (pending_.empty()) return {};
  pending_.clear();
  expected_ = 0;
  return kReplacement;
}

}  // namespace cabm
