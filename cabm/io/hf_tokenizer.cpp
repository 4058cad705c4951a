#include "cabm/io/hf_tokenizer.h"

#include "cabm/core/error.h"
#include "cabm/io/hf_tokenizer_impl.h"

#include <algorithm>
#include <limits>

namespace cabm {

namespace {

// A piece of the input: text [begin, end) to tokenise, or an added token's id.
struct Segment {
  size_t begin = 0, end = 0;
  int64_t id = -1;  // -1: text
};

bool is_word_char(char32_t c) {
  return unicode::is_alphanumeric(c) || c == U'_';
}

// The added vocabulary's split (tokenizers' AddedVocabulary::split_with_indices): matches are
// found left to right, the longest at the leftmost position, without overlaps; a single_word
// token that touches a word is dropped (its text stays text), lstrip/rstrip widen a match over
// the whitespace beside it.
std::vector<Segment> split_added(std::u32string_view text, const std::vector<const AddedToken*>& tokens) {
  std::vector<Segment> out;
  size_t start_offset = 0;
  size_t at = 0;
  while (at < text.size()) {
    const AddedToken* match = nullptr;
    for (const AddedToken* token : tokens)  // longest first
      if (text.compare(at, token->content.size(), token->content) == 0) {
        match = token;
        break;
      }
    if (match == nullptr) {
      ++at;
      continue;
    }
    size_t start = at, stop = at + match->content.size();
    at = stop;
    if (match->single_word) {
      const bool space_before = start == 0 || !is_word_char(text[start - 1]);
      const bool space_after = stop == text.size() || !is_word_char(text[stop]);
      if (!space_before || !space_after) continue;
    }
    if (match->lstrip) {
      size_t s = start;
      while (s > 0 && unicode::is_whitespace(text[s - 1])) --s;
      start = std::max(s, start_offset);
    }
    if (match->rstrip) {
      while (stop < text.size() && unicode::is_whitespace(text[stop])) ++stop;
      at = stop;
    }
    if (start_offset < start) out.push_back({start_offset, start, -1});
    out.push_back({start, stop, match->id});
    start_offset = stop;
  }
  if (start_offset < text.size()) out.push_back({start_offset, text.size(), -1});
  return out;
}

// The Replace normalizer: every non-overlapping occurrence, left to right.
std::u32string replace_all(const std::u32string& s, const NormalizerStep& step) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t at = 0; at < s.size();) {
    size_t len = 0;
    if (step.replace_space_runs) {
      while (at + len < s.size() && s[at + len] == U' ') ++len;
      if (len < 2) len = 0;
    } else if (!step.replace_from.empty() && s.compare(at, step.replace_from.size(), step.replace_from) == 0) {
      len = step.replace_from.size();
    }
    if (len == 0) {
      out.push_back(s[at++]);
    } else {
      out += step.replace_to;
      at += len;
    }
  }
  return out;
}

}  // namespace

std::u32string HfTokenizer::Impl::normalize(std::u32string_view text) const {
  std::u32string s(text);
  for (const NormalizerStep& step : normalizers) {
    switch (step.kind) {
      case NormalizerStep::Kind::Bert:
        s = bert_normalize(s, step.bert);
        break;
      case NormalizerStep::Kind::Form:
        s = unicode::normalize(s, step.form);
        break;
      case NormalizerStep::Kind::Lowercase: {
        std::u32string lower;
        lower.reserve(s.size());
        for (const char32_t c : s) unicode::append_lowercase(lower, c);
        s = std::move(lower);
        break;
      }
      case NormalizerStep::Kind::StripAccents:
        std::erase_if(s, unicode::is_mark_nonspacing);
        break;
      case NormalizerStep::Kind::Precompiled:
        s = step.charsmap->normalize(s);
        break;
      case NormalizerStep::Kind::Strip: {
        size_t begin = 0, end = s.size();
        if (step.strip_left)
          while (begin < end && unicode::is_whitespace(s[begin])) ++begin;
        if (step.strip_right)
          while (end > begin && unicode::is_whitespace(s[end - 1])) --end;
        s = s.substr(begin, end - begin);
        break;
      }
      case NormalizerStep::Kind::Replace:
        s = replace_all(s, step);
        break;
    }
  }
  return s;
}

void HfTokenizer::Impl::encode_normalized(std::u32string_view text, bool first, std::vector<int64_t>& ids) const {
  switch (model) {
    case Model::WordPiece:
      for (const std::u32string& word : bert_pre_tokenize(text)) wordpiece.tokenize(word, ids);
      break;
    case Model::BytePair:
      if (use_regex) {
        for (const std::u32string& piece : byte_level_pre_tokenize(text, add_prefix_space)) bpe.tokenize(piece, ids);
      } else {  // ByteLevel without the split: the whole text is one piece
        std::u32string prefixed = add_prefix_space && (text.empty() || text.front() != U' ') ? U" " : U"";
        prefixed.append(text);
        std::u32string piece;
        for (const char b : unicode::encode_utf8(prefixed)) piece.push_back(byte_to_unicode(static_cast<uint8_t>(b)));
        bpe.tokenize(piece, ids);
      }
      break;
    case Model::Unigram: {
      if (pre_tokenizer == PreTokenizer::None) {  // the whole text is one piece
        if (!text.empty()) unigram.tokenize(unicode::encode_utf8(text), ids);
        break;
      }
      const bool prepend = metaspace_prepend == Prepend::Always || (metaspace_prepend == Prepend::First && first);
      for (const std::u32string& piece : metaspace_pre_tokenize(text, metaspace_replacement, prepend, metaspace_split))
        unigram.tokenize(unicode::encode_utf8(piece), ids);
      break;
    }
    case Model::SentencePiece:
      sentencepiece->encode(unicode::encode_utf8(text), ids);
      break;
  }
}

std::vector<int64_t> HfTokenizer::Impl::content_ids(std::string_view text) const {
  const std::u32string chars = unicode::decode_utf8(text, "input text");
  std::vector<const AddedToken*> raw_tokens, normalized_tokens;
  for (const AddedToken& token : added_tokens) (token.normalized ? normalized_tokens : raw_tokens).push_back(&token);

  std::vector<int64_t> ids;
  for (const Segment& segment : split_added(chars, raw_tokens)) {
    if (segment.id >= 0) {
      ids.push_back(segment.id);
      continue;
    }
    const std::u32string_view piece = std::u32string_view(chars).substr(segment.begin, segment.end - segment.begin);
    // SentencePiece normalises inside the model; the others normalise here, then match the
    // normalised added tokens in the result.
    const std::u32string normalized = model == Model::SentencePiece ? std::u32string(piece) : normalize(piece);
    for (const Segment& sub : split_added(normalized, normalized_tokens)) {
      if (sub.id >= 0)
        ids.push_back(sub.id);
      else
        encode_normalized(std::u32string_view(normalized).substr(sub.begin, sub.end - sub.begin),
                          segment.begin == 0 && sub.begin == 0, ids);
    }
  }
  return ids;
}

namespace {

// The post-processor's template over the (truncated) sequences.
TokenizedText apply_template(const std::vector<TemplatePiece>& pieces, const std::vector<int64_t>& first,
                             const std::vector<int64_t>& second) {
  TokenizedText out;
  for (const TemplatePiece& piece : pieces) {
    const std::vector<int64_t>& add = !piece.sequence ? piece.ids : piece.second ? second : first;
    out.input_ids.insert(out.input_ids.end(), add.begin(), add.end());
    out.token_type_ids.insert(out.token_type_ids.end(), add.size(), piece.type_id);
  }
  out.attention_mask.assign(out.input_ids.size(), 1);
  return out;
}

// The room max_length leaves for content tokens once the template's special tokens are in.
int64_t content_budget(const HfTokenizer& tok, int64_t max_length, bool pair, int64_t tokenizer_max,
                       const std::string& source) {
  const int64_t special = tok.special_token_count(pair);
  const int64_t limit = max_length > 0 ? max_length : tokenizer_max;
  if (limit < special)
    throw UsageError(fmt::format("max length {} is less than the {} special tokens {} adds to every {}", limit, special,
                                 source, pair ? "pair" : "input"));
  return limit - special;
}

}  // namespace

TokenizedText HfTokenizer::encode(std::string_view text, int64_t max_length) const {
  const Impl& impl = *impl_;
  std::vector<int64_t> ids = impl.content_ids(text);
  const int64_t budget = content_budget(*this, max_length, false, impl.max_length, impl.source);
  if (static_cast<int64_t>(ids.size()) > budget) ids.resize(static_cast<size_t>(budget));
  return apply_template(impl.single_template, ids, {});
}

PairLengths longest_first_lengths(int64_t a, int64_t b, int64_t budget) {
  CABM_CHECK(a >= 0 && b >= 0 && budget >= 0, "lengths {} and {}, budget {}", a, b, budget);
  if (a + b <= budget) return {a, b};
  const int64_t shorter = std::min(a, b);
  int64_t keep_short = shorter, keep_long = budget - shorter;
  if (shorter > budget - shorter) {  // both must be cut: halves, the odd token to the longer
    keep_short = budget / 2;
    keep_long = budget - keep_short;
  }
  // Ties count the first sequence as the shorter one.
  return a > b ? PairLengths{keep_long, keep_short} : PairLengths{keep_short, keep_long};
}

TokenizedText HfTokenizer::encode_pair(std::string_view first, std::string_view second, int64_t max_length) const {
  const Impl& impl = *impl_;
  if (!impl.pair_template_error.empty()) throw Error(impl.pair_template_error);
  std::vector<int64_t> a = impl.content_ids(first), b = impl.content_ids(second);
  const int64_t budget = content_budget(*this, max_length, true, impl.max_length, impl.source);
  const PairLengths keep =
      longest_first_lengths(static_cast<int64_t>(a.size()), static_cast<int64_t>(b.size()), budget);
  a.resize(static_cast<size_t>(keep.first));
  b.resize(static_cast<size_t>(keep.second));
  return apply_template(impl.pair_template, a, b);
}

int64_t HfTokenizer::pad_id() const {
  return impl_->pad_id;
}
bool HfTokenizer::has_token_types() const {
  return impl_->token_types;
}
int64_t HfTokenizer::max_length() const {
  return impl_->max_length;
}
const std::string& HfTokenizer::description() const {
  return impl_->description;
}

int64_t HfTokenizer::special_token_count(bool pair) const {
  int64_t n = 0;
  for (const TemplatePiece& piece : pair ? impl_->pair_template : impl_->single_template)
    if (!piece.sequence) n += static_cast<int64_t>(piece.ids.size());
  return n;
}

std::map<std::string, Tensor> pad_batch(const std::vector<TokenizedText>& inputs, int64_t pad_id,
                                        bool with_token_types) {
  const int64_t n = static_cast<int64_t>(inputs.size());
  int64_t T = 0;
  for (const TokenizedText& t : inputs) T = std::max(T, static_cast<int64_t>(t.input_ids.size()));
  Tensor ids = Tensor::empty({n, T}, DType::I64);
  Tensor mask = Tensor::zeros({n, T}, DType::I64);
  Tensor types = Tensor::zeros({n, T}, DType::I64);
  for (int64_t i = 0; i < n; ++i) {
    const TokenizedText& t = inputs[static_cast<size_t>(i)];
    const size_t len = t.input_ids.size();
    CABM_CHECK(t.attention_mask.size() == len && t.token_type_ids.size() == len,
               "input {}: {} ids, {} mask values, {} token types", i, len, t.attention_mask.size(),
               t.token_type_ids.size());
    int64_t* row = ids.data<int64_t>() + i * T;
    std::copy(t.input_ids.begin(), t.input_ids.end(), row);
    std::fill(row + len, row + T, pad_id);
    std::copy(t.attention_mask.begin(), t.attention_mask.end(), mask.data<int64_t>() + i * T);
    std::copy(t.token_type_ids.begin(), t.token_type_ids.end(), types.data<int64_t>() + i * T);
  }
  std::map<std::string, Tensor> out{{"input_ids", ids}, {"attention_mask", mask}};
  if (with_token_types) out.emplace("token_type_ids", types);
  return out;
}

}  // namespace cabm
