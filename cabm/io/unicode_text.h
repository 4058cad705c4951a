// Unicode text as Hugging Face's tokenizers see it: code points, general categories,
// normalisation forms and lower-casing, all from utf8proc (no hand-written tables).
//
// The predicates are named after the Rust functions that `tokenizers` calls, and follow them:
// `is_whitespace` is Rust's char::is_whitespace (the White_Space property: Zs, Zl, Zp, U+0009–
// U+000D and U+0085), `is_other` is unicode_categories' is_other (Cc, Cf, Co: not Cn or Cs),
// `append_lowercase` is char::to_lowercase (the full mapping: U+0130 becomes two code points).
// utf8proc carries a newer Unicode version than the tables compiled into `tokenizers`; the two
// agree on every character assigned by Unicode 9 (2016).
#pragma once

#include <string>
#include <string_view>

namespace cabm::unicode {

// Valid UTF-8 → code points; throws cabm::Error("SOURCE: not valid UTF-8 (byte offset K)").
std::u32string decode_utf8(std::string_view text, std::string_view source);
std::string encode_utf8(std::u32string_view text);
void append_utf8(std::string& out, char32_t c);

bool is_whitespace(char32_t c);
bool is_other(char32_t c);            // Cc, Cf, Co
bool is_punctuation(char32_t c);      // Pc, Pd, Ps, Pe, Pi, Pf, Po
bool is_mark_nonspacing(char32_t c);  // Mn
bool is_letter(char32_t c);           // Lu, Ll, Lt, Lm, Lo
bool is_number(char32_t c);           // Nd, Nl, No
bool is_alphanumeric(char32_t c);     // letter or number

enum class NormalForm { NFC, NFD, NFKC, NFKD };
std::u32string normalize(std::u32string_view text, NormalForm form);

// Appends char::to_lowercase(c): utf8proc's simple mapping, and U+0130 → "i\u0307" (the one
// unconditional multi-character lower-case mapping of SpecialCasing.txt).
void append_lowercase(std::u32string& out, char32_t c);

}  // namespace cabm::unicode
