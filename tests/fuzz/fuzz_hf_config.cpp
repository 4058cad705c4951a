// Bytes → a Hugging Face config.json, read as `cabm embed` / `cabm classify` read one
// (parse_hf_config, after the same JSON parse as read_hf_config). Every refusal must be a
// cabm::Error; an accepted config must describe a model cabm can build: positive sizes, heads
// dividing the width, labels for a classifier, and the input length bounded by the position
// table.
#include "cabm/interop/hf_config.h"
#include "tests/fuzz/fuzz_util.h"

#include <nlohmann/json.hpp>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text = cabm::fuzz::as_text(data, size);
  const nlohmann::json doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return 0;  // read_hf_config reports malformed JSON itself
  return cabm::fuzz::run([&] {
    const cabm::HfEncoderConfig c = cabm::parse_hf_config(doc, "fuzz/config.json");
    if (c.vocab_size <= 0 || c.hidden_size <= 0 || c.num_layers <= 0 || c.num_heads <= 0 ||
        c.intermediate_size <= 0 || c.max_position_embeddings <= 0)
      cabm::fuzz::invariant_failed("an accepted config with a size <= 0");
    if (c.hidden_size % c.num_heads != 0) cabm::fuzz::invariant_failed("heads that do not divide hidden_size");
    if (c.head == cabm::HfHead::kSequenceClassification && c.id2label.empty())
      cabm::fuzz::invariant_failed("a classifier without labels");
    if (c.max_tokens() <= 0 || c.max_tokens() > c.max_position_embeddings)
      cabm::fuzz::invariant_failed("an input length outside the position table");
  });
}
