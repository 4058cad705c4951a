// Safetensors files (https://github.com/huggingface/safetensors): how weights and inputs move
// between cabm and PyTorch. Layout: an 8-byte little-endian u64 header length N, N bytes of
// UTF-8 JSON, then one byte buffer that the header indexes entirely, without holes:
//   {"__metadata__": {"key": "value", ...},
//    "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...}
// Offsets are relative to the start of the buffer; data is row-major, little-endian.
#pragma once

#include "cabm/core/tensor.h"

#include <map>
#include <string>
#include <string_view>

namespace cabm {

// A file's tensors by name and its `__metadata__` strings. `path` is kept for error messages.
// Every tensor owns its memory (contiguous, 64-byte aligned) and has dtype F32, BF16, BOOL or
// I64: read_safetensors converts F16 and F64 to F32 and I32 to I64.
struct SafetensorsFile {
  std::string path;
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;

  const Tensor* find(const std::string& name) const;  // nullptr if absent
  const Tensor& get(const std::string& name) const;   // throws "PATH: missing tensor 'name'"
  // get, and check the dtype and shape; a -1 in `shape` matches any size on that axis.
  // Throws e.g. "PATH: tensor 'norm.weight' has shape [4], expected [8]".
  const Tensor& get(const std::string& name, DType dtype, const Shape& shape) const;

  const std::string* find_metadata(const std::string& key) const;  // nullptr if absent
  const std::string& get_metadata(const std::string& key) const;   // throws if absent
};

// Reads and validates a whole file. Anything malformed (truncated file, bad JSON, bad entry,
// byte ranges that overlap, leave holes or do not match shape × dtype, BOOL bytes other than
// 0/1, an unsupported dtype) throws cabm::Error naming the file and the tensor.
// Conversions: F16 → F32 exactly; F64 → F32 rounded to nearest (beyond float range: ±inf, as
// torch's .float() does); I32 → I64 exactly. Other dtypes (U8, I8, F8_*, ...) are errors.
// JSON objects with a repeated key are errors. Unknown fields in a tensor entry are ignored.
SafetensorsFile read_safetensors(const std::string& path);
// The same checks and result for a file's bytes already in memory; `name` stands for the path
// in errors and in SafetensorsFile::path.
SafetensorsFile parse_safetensors(std::string_view bytes, const std::string& name);

// Writes tensors (any strides; F32, BF16, BOOL or I64) sorted by name, the header padded with
// spaces so the buffer starts 8-byte aligned; empty metadata is omitted. The file appears
// whole or not at all: it is written under a temporary name in the same directory, flushed
// to disk and renamed over `path`. Errors name the path.
void write_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace cabm
