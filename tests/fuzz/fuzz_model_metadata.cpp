// Bytes → a model file (parse_safetensors) → what every command that loads a model does with
// its metadata: model_kind, causal_lm_config_from / classifier_config_from and
// load_causal_lm / load_classifier (metadata checked against the file's tensors before the
// model is allocated). A config that is accepted must describe the tensors the file holds, so a
// model is built only when its parameters are in the file. A loaded model then runs as cabm eval
// and cabm generate run it, on a few tokens: forward, and generation with the KV cache (with
// whatever weights the file holds: NaN, inf, huge).
#include "cabm/nn/parameters.h"
#include "cabm/train/generate.h"
#include "cabm/train/model_config.h"
#include "tests/fuzz/fuzz_util.h"

#include <algorithm>
#include <vector>

namespace {

// Loading is strict (every parameter from the file), so a loaded model holds no more
// parameters than the file: the file is at most the fuzzer's input, and a larger model would be
// a config that the metadata checks let through without the tensors bounding it.
template <typename Model>
void check_loaded(const cabm::SafetensorsFile& file, const Model& model) {
  double in_file = 0, in_model = 0;
  for (const auto& [name, t] : file.tensors) in_file += static_cast<double>(t.numel());
  for (const cabm::NamedTensor& p : cabm::named_parameters(model)) in_model += static_cast<double>(p.tensor.numel());
  if (in_model > in_file) cabm::fuzz::invariant_failed("a loaded model has more parameters than its file holds");
}

// A few token ids inside the vocabulary, from the model's sizes.
cabm::Tensor some_tokens(int64_t count, int64_t vocab) {
  cabm::Tensor tokens = cabm::Tensor::empty({1, count}, cabm::DType::I64);
  for (int64_t i = 0; i < count; ++i) tokens.data<int64_t>()[i] = (i * 7 + 1) % vocab;
  return tokens;
}

void run_causal_lm(const cabm::CausalLM& model) {
  const int64_t T = std::min<int64_t>(model.config.max_seq_len, 4), V = model.config.vocab_size;
  cabm::CausalLMCache cache;
  const cabm::Tensor tokens = some_tokens(T, V);
  const cabm::Tensor& logits = cabm::causal_lm_forward(model, tokens, cache);
  if (logits.dim() != 3 || logits.size(1) != T || logits.size(2) != V) cabm::fuzz::invariant_failed("logits shape");
  cabm::Rng rng(1);
  std::vector<int64_t> prompt(tokens.data<int64_t>(), tokens.data<int64_t>() + T);
  for (const float temperature : {0.0f, 0.8f}) {
    cabm::SamplingOptions options;
    options.temperature = temperature;
    options.top_k = temperature > 0 ? 3 : 0;
    for (const int64_t token : cabm::generate(model, prompt, 3, options, rng, {}))
      if (token < 0 || token >= V) cabm::fuzz::invariant_failed("generate produced a token outside the vocabulary");
  }
}

void run_classifier(const cabm::Classifier& model) {
  const int64_t T = std::min<int64_t>(model.config.max_seq_len, 4);
  cabm::ClassifierCache cache;
  const cabm::Tensor& logits = cabm::classifier_forward(model, some_tokens(T, model.config.vocab_size), {T}, cache);
  if (logits.dim() != 2 || logits.size(1) != model.config.num_classes) cabm::fuzz::invariant_failed("logits shape");
}

void load(std::string_view bytes) {
  const cabm::SafetensorsFile file = cabm::parse_safetensors(bytes, "fuzz-model.safetensors");
  const std::string kind = cabm::model_kind(file);
  if (kind == "CausalLM" || kind.empty()) {
    cabm::fuzz::run([&] {
      const cabm::CausalLMConfig config = cabm::causal_lm_config_from(file);
      (void)cabm::causal_lm_metadata(config);
      const cabm::CausalLM model = cabm::load_causal_lm(file);
      check_loaded(file, model);
      run_causal_lm(model);
    });
  }
  if (kind == "Classifier" || kind.empty()) {
    cabm::fuzz::run([&] {
      std::vector<std::string> labels;
      const cabm::ClassifierConfig config = cabm::classifier_config_from(file, labels);
      (void)cabm::classifier_metadata(config, labels);
      labels.clear();
      const cabm::Classifier model = cabm::load_classifier(file, labels);
      check_loaded(file, model);
      run_classifier(model);
    });
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return cabm::fuzz::run([&] { load(cabm::fuzz::as_text(data, size)); });
}
