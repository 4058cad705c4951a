// The parts of a loaded HfTokenizer (cabm/io/hf_tokenizer.h), shared by its loader
// (hf_tokenizer_load.cpp) and its encoder (hf_tokenizer.cpp). Not part of the interface.
#pragma once

#include "cabm/io/byte_bpe.h"
#include "cabm/io/hf_tokenizer.h"
#include "cabm/io/sentencepiece_model.h"
#include "cabm/io/unicode_text.h"
#include "cabm/io/unigram.h"
#include "cabm/io/wordpiece.h"

#include <memory>
#include <optional>

namespace cabm {

// An entry of the tokenizers' added vocabulary: matched in the text before anything else.
struct AddedToken {
  std::u32string content;
  int64_t id = 0;
  bool single_word = false;  // only where it is not inside a word
  bool lstrip = false;       // takes the whitespace before it
  bool rstrip = false;       // takes the whitespace after it
  bool normalized = false;   // matched in the normalised text rather than the raw text
};

// One normalizer of tokenizer.json (a Sequence is a list of them).
struct NormalizerStep {
  enum class Kind { Bert, Lowercase, Form, StripAccents, Precompiled, Strip, Replace } kind = Kind::Bert;
  BertNormalizerOptions bert;
  unicode::NormalForm form = unicode::NormalForm::NFD;
  std::shared_ptr<const PrecompiledCharsMap> charsmap;
  bool strip_left = false, strip_right = false;
  std::u32string replace_from, replace_to;  // Replace: a string, or
  bool replace_space_runs = false;          // the regex " {2,}" (runs of two spaces or more)
};

// One element of the post-processor's template: a special token's ids, or a sequence ($A, or $B
// in a pair's template), with the type id its tokens get.
struct TemplatePiece {
  bool sequence = false;
  bool second = false;  // the sequence is $B
  std::vector<int64_t> ids;
  int64_t type_id = 0;
};

struct HfTokenizer::Impl {
  enum class Model { WordPiece, BytePair, Unigram, SentencePiece } model = Model::WordPiece;
  enum class PreTokenizer { None, Bert, ByteLevel, Metaspace } pre_tokenizer = PreTokenizer::None;
  std::vector<NormalizerStep> normalizers;
  bool add_prefix_space = false;  // ByteLevel
  bool use_regex = true;          // ByteLevel
  char32_t metaspace_replacement = 0x2581;
  enum class Prepend { Always, First, Never } metaspace_prepend = Prepend::Always;
  bool metaspace_split = true;
  WordPiece wordpiece;
  BytePairEncoding bpe;
  UnigramModel unigram;
  std::optional<SentencePieceModel> sentencepiece;
  std::vector<AddedToken> added_tokens;  // longest first
  // Without a post-processor the tokenizers library adds nothing and keeps each sequence's own
  // type id (0 for the first, 1 for the second): these defaults.
  std::vector<TemplatePiece> single_template{{true, false, {}, 0}};
  std::vector<TemplatePiece> pair_template{{true, false, {}, 0}, {true, true, {}, 1}};
  std::string pair_template_error;  // non-empty: why pairs cannot be encoded (a bad 'pair' template)
  int64_t pad_id = 0;
  bool token_types = true;
  int64_t max_length = 0;  // INT64_MAX: no limit
  std::string description;
  std::string source;  // the directory, for messages

  std::u32string normalize(std::u32string_view text) const;
  // The model's ids of one text (added tokens, normaliser, pre-tokeniser, model), before the
  // post-processor; `text` must be valid UTF-8.
  std::vector<int64_t> content_ids(std::string_view text) const;
  // Pre-tokenizes and runs the model on a normalised piece; `first`: the piece starts the input.
  void encode_normalized(std::u32string_view text, bool first, std::vector<int64_t>& ids) const;  // appends
};

}  // namespace cabm
