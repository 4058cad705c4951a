// Bytes → a Hugging Face tokenizer.json, read as `cabm tokenize` reads one
// (HfTokenizer::from_tokenizer_json: the same parser as HfTokenizer::load), then a few texts
// encoded with it, among them the input's own bytes, alone and in a pair. Every failure must be
// a cabm::Error; an encoding must keep its three vectors the same length and within the maximum
// asked for.
#include "cabm/io/hf_tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text = cabm::fuzz::as_text(data, size);
  return cabm::fuzz::run([&] {
    const cabm::HfTokenizer tok = cabm::HfTokenizer::from_tokenizer_json(text, "fuzz/tokenizer.json");
    for (const std::string_view input :
         {std::string_view("Hello, world! [MASK] <mask> caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC  x"), std::string_view(""),
          text.substr(0, 256)}) {
      for (const int64_t max_length : {int64_t{0}, int64_t{8}}) {
        cabm::fuzz::run([&] {
          const cabm::TokenizedText t = tok.encode(input, max_length);
          if (t.token_type_ids.size() != t.input_ids.size() || t.attention_mask.size() != t.input_ids.size())
            cabm::fuzz::invariant_failed("input_ids, token_type_ids and attention_mask differ in length");
          if (max_length > 0 && static_cast<int64_t>(t.input_ids.size()) > max_length)
            cabm::fuzz::invariant_failed("an encoding longer than max_length");
        });
        cabm::fuzz::run([&] {  // the input as the first and as the second text of a pair
          for (const cabm::TokenizedText& t :
               {tok.encode_pair(input, "second text", max_length), tok.encode_pair("first", input, max_length)}) {
            if (t.token_type_ids.size() != t.input_ids.size() || t.attention_mask.size() != t.input_ids.size())
              cabm::fuzz::invariant_failed("a pair's input_ids, token_type_ids and attention_mask differ in length");
            if (max_length > 0 && static_cast<int64_t>(t.input_ids.size()) > max_length)
              cabm::fuzz::invariant_failed("a pair's encoding longer than max_length");
          }
        });
      }
    }
  });
}
