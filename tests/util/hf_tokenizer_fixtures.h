// The Hugging Face tokenizer fixtures that the tokenizer tests share (written by
// tests/fixtures/hf_make_tokenizers.py): their folder and expected.json, parsed once.
// Needs CABM_HF_FIXTURES_DIR (tests/CMakeLists.txt defines it for the targets that read them).
#pragma once

#include "util/test_util.h"

#include <nlohmann/json.hpp>

#include <string>

namespace cabm::test {

inline std::string hf_tokenizers_dir() {
  return std::string(CABM_HF_FIXTURES_DIR) + "/tokenizers";
}

inline const nlohmann::json& hf_tokenizers_expected() {
  static const nlohmann::json doc = nlohmann::json::parse(read_file(hf_tokenizers_dir() + "/expected.json"));
  return doc;
}

}  // namespace cabm::test
