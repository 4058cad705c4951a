// Hugging Face tokenizers, loaded from a model directory and run as transformers' fast
// tokenizer runs them (`tok(texts, padding=True, truncation=True)`), ids for ids:
//   - tokenizer.json with a WordPiece model (BERT: BertNormalizer, BertPreTokenizer), a BPE
//     model behind the ByteLevel pre-tokenizer (RoBERTa, GPT-2 style) or a Unigram model behind
//     Metaspace (XLM-R: Precompiled, Strip, Replace normalizers);
//   - the older files when tokenizer.json is absent: vocab.txt (+ tokenizer_config.json's
//     do_lower_case, strip_accents, tokenize_chinese_chars), vocab.json + merges.txt (RoBERTa),
//     sentencepiece.bpe.model (XLM-R: read with libsentencepiece and converted as transformers'
//     XLMRobertaConverter converts it, fairseq's ids).
// Special tokens in the text ([CLS], <mask>, ...) are matched first, as the tokenizers' added
// vocabulary does; the post-processor's template (TemplateProcessing, RobertaProcessing,
// BertProcessing) adds [CLS] … [SEP] or <s> … </s>. Anything else (another normalizer,
// pre-tokenizer or model) is refused with an error naming the file and the type.
// docs/tokenizers.md has the details and what differs.
#pragma once

#include "cabm/core/tensor.h"

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace cabm {

// One input, unpadded, special tokens added, truncated. token_type_ids and attention_mask have
// the length of input_ids (attention_mask all 1; token_type_ids as the post-processor's template
// gives them: all 0 for a single input, 0…0 1…1 for a BERT pair).
struct TokenizedText {
  std::vector<int64_t> input_ids, token_type_ids, attention_mask;
};

// How many content tokens of a pair's two sequences (lengths a and b) the tokenizers library
// keeps with TruncationStrategy::LongestFirst for `budget` = max_length less the pair's special
// tokens (tokenizers' truncate_encodings; docs/tokenizers.md says it in words):
//   a + b <= budget: both whole. Else, with s = min(a, b) and l = max(a, b): if s <= budget − s,
//   the shorter stays whole and the longer keeps budget − s; otherwise the shorter keeps
//   ⌊budget/2⌋ and the longer ⌈budget/2⌉ (a tie: the first sequence is "the shorter").
// Each sequence is cut from its end (the default direction, right).
struct PairLengths {
  int64_t first = 0, second = 0;
};
PairLengths longest_first_lengths(int64_t a, int64_t b, int64_t budget);

class HfTokenizer {
 public:
  // Throws cabm::Error naming the directory or file on anything missing, malformed or not
  // supported.
  static HfTokenizer load(const std::filesystem::path& model_dir);
  // A tokenizer.json's text alone (no tokenizer_config.json: no transformers overrides, no
  // maximum length); `source` names it in errors.
  static HfTokenizer from_tokenizer_json(std::string_view text, const std::string& source);

  // `text` must be valid UTF-8 (else cabm::Error). max_length <= 0: the tokenizer's own
  // maximum (max_length()). Content tokens are cut from the end so that the result, special
  // tokens included, holds at most max_length ids; a max_length below special_token_count() is
  // a cabm::UsageError.
  TokenizedText encode(std::string_view text, int64_t max_length) const;
  // A pair of texts (a query and a passage, two sentences), as transformers' fast tokenizer
  // encodes `tok(texts, text_pairs, truncation=True)`: each text tokenised on its own, the two
  // truncated together to max_length less special_token_count(true) with longest_first
  // (longest_first_lengths), then the post-processor's pair template ([CLS] A [SEP] B [SEP] with
  // token types 0 then 1 for BERT; <s> A </s></s> B </s> for RoBERTa and XLM-R). An empty text
  // is an empty sequence, still a pair. max_length as for encode(); below
  // special_token_count(true) it is a cabm::UsageError. A tokenizer.json whose post-processor has
  // no usable 'pair' template is a cabm::Error naming it.
  TokenizedText encode_pair(std::string_view first, std::string_view second, int64_t max_length) const;

  int64_t pad_id() const;
  // Whether the model takes token_type_ids (transformers' model_input_names: BERT yes;
  // DistilBERT, RoBERTa, XLM-R no).
  bool has_token_types() const;
  // tokenizer_config.json's model_max_length; without one, config.json's
  // max_position_embeddings (less the position offset of RoBERTa-style models); without
  // either, no limit (INT64_MAX).
  int64_t max_length() const;
  // Ids the post-processor adds to one input, or to a pair.
  int64_t special_token_count(bool pair = false) const;
  const std::string& description() const;  // e.g. "WordPiece (tokenizer.json)", for messages

  struct Impl;

 private:
  static HfTokenizer finish(std::shared_ptr<Impl> impl);
  std::shared_ptr<const Impl> impl_;
};

// The batch as transformers returns it with padding=True: I64 [n, T], T the longest input,
// right padding with pad_id (attention_mask 0, token_type_ids 0 there). The map holds
// input_ids, attention_mask and, when with_token_types, token_type_ids.
std::map<std::string, Tensor> pad_batch(const std::vector<TokenizedText>& inputs, int64_t pad_id,
                                        bool with_token_types);

}  // namespace cabm
