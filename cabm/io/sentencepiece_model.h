// A SentencePiece model (Kudo & Richardson 2018) run by Debian's libsentencepiece, with the id
// layout of fairseq's XLM-R dictionary that transformers' XLMRobertaTokenizer uses: <s> 0,
// <pad> 1, </s> 2, <unk> 3, then SentencePiece's id + 1 for every other piece (its <unk>, id 0,
// becomes 3), and <mask> after the last piece.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace cabm {

class SentencePieceModel {
 public:
  // Reads and parses a serialized ModelProto (sentencepiece.bpe.model); errors name the path.
  static SentencePieceModel load(const std::string& path);

  // Appends the fairseq ids of `text` (SentencePiece normalises it itself).
  void encode(std::string_view text, std::vector<int64_t>& ids) const;
  int64_t piece_count() const;  // SentencePiece's pieces; the mask id is piece_count() + 1
  // The fairseq id of a piece, or -1 if the model does not know it.
  int64_t piece_id(std::string_view piece) const;

  // The ModelProto's own fields, for the conversion transformers makes (XLMRobertaConverter).
  bool is_unigram() const;                          // trainer_spec.model_type (default UNIGRAM)
  bool add_dummy_prefix() const;                    // normalizer_spec.add_dummy_prefix (default true)
  const std::string& precompiled_charsmap() const;  // normalizer_spec.precompiled_charsmap
  std::string piece(int64_t spm_id) const;          // SentencePiece's id, not fairseq's
  double score(int64_t spm_id) const;
  // SentencePiece ids of the CONTROL and USER_DEFINED pieces (transformers adds them as tokens).
  const std::vector<int64_t>& control_and_user_defined() const;

  static constexpr int64_t kFairseqOffset = 1;
  static constexpr int64_t kBos = 0, kPad = 1, kEos = 2, kUnk = 3;

 private:
  struct Impl;
  std::shared_ptr<const Impl> impl_;
  std::string path_;
};

}  // namespace cabm
