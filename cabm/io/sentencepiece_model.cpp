#include "cabm/io/sentencepiece_model.h"

#include "cabm/core/error.h"
#include "cabm/io/text_data.h"

#include <sentencepiece_processor.h>

namespace cabm {

namespace {

struct Specs {
  int model_type = 1;  // UNIGRAM
  bool add_dummy_prefix = true;
  std::string precompiled_charsmap;
  std::vector<int64_t> added_ids;  // pieces of type CONTROL (3) or USER_DEFINED (4)
};

// The protobuf wire format, enough to walk a message's fields: (field number, wire type,
// varint value or length-delimited bytes). False at the end or on malformed input.
struct WireReader {
  std::string_view data;
  size_t at = 0;

  bool varint(uint64_t& value) {
    value = 0;
    for (int shift = 0; shift < 64 && at < data.size(); shift += 7) {
      const auto byte = static_cast<uint8_t>(data[at++]);
      value |= static_cast<uint64_t>(byte & 0x7F) << shift;
      if (byte < 0x80) return true;
    }
    return false;
  }
  bool next(uint32_t& field, uint64_t& value, std::string_view& bytes) {
    uint64_t key = 0;
    if (at >= data.size() || !varint(key)) return false;
    field = static_cast<uint32_t>(key >> 3);
    switch (key & 7) {
      case 0:
        return varint(value);
      case 1:
        at += 8;
        return at <= data.size();
      case 5:
        at += 4;
        return at <= data.size();
      case 2:
        if (!varint(value) || value > data.size() - at) return false;
        bytes = data.substr(at, value);
        at += value;
        return true;
      default:
        return false;
    }
  }
};

// ModelProto: 1 pieces (3 type), 2 trainer_spec (3 model_type), 3 normalizer_spec
// (2 precompiled_charsmap, 3 add_dummy_prefix).
Specs read_specs(std::string_view proto) {
  Specs impl;
  WireReader top{proto};
  uint32_t field = 0;
  uint64_t value = 0;
  std::string_view bytes;
  int64_t piece = 0;
  while (top.next(field, value, bytes)) {
    if (field == 1) {
      WireReader entry{bytes};
      uint32_t f = 0;
      uint64_t v = 0;
      std::string_view b;
      while (entry.next(f, v, b))
        if (f == 3 && (v == 3 || v == 4)) impl.added_ids.push_back(piece);
      ++piece;
      continue;
    }
    if (field != 2 && field != 3) continue;
    WireReader spec{bytes};
    uint32_t f = 0;
    uint64_t v = 0;
    std::string_view b;
    while (spec.next(f, v, b)) {
      if (field == 2 && f == 3) impl.model_type = static_cast<int>(v);
      if (field == 3 && f == 2) impl.precompiled_charsmap = std::string(b);
      if (field == 3 && f == 3) impl.add_dummy_prefix = v != 0;
    }
  }
  return impl;
}

}  // namespace

struct SentencePieceModel::Impl {
  sentencepiece::SentencePieceProcessor processor;
  Specs specs;
};

SentencePieceModel SentencePieceModel::load(const std::string& path) {
  const std::string bytes = read_file_bytes(path);
  auto impl = std::make_shared<Impl>();
  const auto status = impl->processor.LoadFromSerializedProto(bytes);
  if (!status.ok()) throw Error(fmt::format("{}: not a SentencePiece model ({})", path, status.ToString()));
  impl->specs = read_specs(bytes);
  SentencePieceModel model;
  model.impl_ = std::move(impl);
  model.path_ = path;
  return model;
}

void SentencePieceModel::encode(std::string_view text, std::vector<int64_t>& ids) const {
  std::vector<int> pieces;
  const auto status = impl_->processor.Encode(text, &pieces);
  if (!status.ok()) throw Error(fmt::format("{}: SentencePiece failed on an input ({})", path_, status.ToString()));
  for (const int id : pieces) ids.push_back(impl_->processor.IsUnknown(id) ? kUnk : id + kFairseqOffset);
}

int64_t SentencePieceModel::piece_count() const {
  return impl_->processor.GetPieceSize();
}

int64_t SentencePieceModel::piece_id(std::string_view piece) const {
  const int id = impl_->processor.PieceToId(piece);
  if (impl_->processor.IsUnknown(id) && piece != impl_->processor.IdToPiece(id)) return -1;
  return id + kFairseqOffset;
}

}  // namespace cabm

namespace cabm {

bool SentencePieceModel::is_unigram() const {
  return impl_->specs.model_type == 1;
}
bool SentencePieceModel::add_dummy_prefix() const {
  return impl_->specs.add_dummy_prefix;
}
const std::string& SentencePieceModel::precompiled_charsmap() const {
  return impl_->specs.precompiled_charsmap;
}
std::string SentencePieceModel::piece(int64_t spm_id) const {
  return impl_->processor.IdToPiece(static_cast<int>(spm_id));
}
const std::vector<int64_t>& SentencePieceModel::control_and_user_defined() const {
  return impl_->specs.added_ids;
}
double SentencePieceModel::score(int64_t spm_id) const {
  return impl_->processor.GetScore(static_cast<int>(spm_id));
}

}  // namespace cabm
