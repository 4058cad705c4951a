// Bytes → what `cabm forward` does: a model file and an input file, parsed, then
// run_pytorch_module (encoder / layer / MultiheadAttention from the state dict, masks from the
// input, the forward pass). Input format, also what make_corpus.py writes:
//   [u32 little-endian n][n bytes: the model's safetensors file][the rest: the input's file]
// Sizes are bounded by the bytes (every tensor's data is in its file), and on top of that an
// input whose tensors hold more than kMaxElements elements in all, or whose model has more
// than kMaxLayers layers, is skipped before running, so that one input runs in milliseconds.
#include "cabm/interop/pytorch_forward.h"
#include "tests/fuzz/fuzz_util.h"

#include <cstring>

namespace {

constexpr int64_t kMaxElements = 1 << 14;
constexpr int64_t kMaxLayers = 8;

bool small_enough(const cabm::SafetensorsFile& model, const cabm::SafetensorsFile& input) {
  int64_t elements = 0;
  for (const cabm::SafetensorsFile* f : {&model, &input})
    for (const auto& [name, t] : f->tensors) {
      for (const int64_t s : t.shape())
        if (s > kMaxElements) return false;  // a zero-element tensor may still declare huge sizes
      elements += t.numel();
    }
  return elements <= kMaxElements && !model.find("layers." + std::to_string(kMaxLayers) + ".self_attn.in_proj_weight");
}

void forward(std::string_view bytes) {
  if (bytes.size() < 4) return;
  uint32_t n = 0;
  std::memcpy(&n, bytes.data(), 4);
  bytes.remove_prefix(4);
  if (n > bytes.size()) return;
  const cabm::SafetensorsFile model = cabm::parse_safetensors(bytes.substr(0, n), "fuzz-model.safetensors");
  const cabm::SafetensorsFile input = cabm::parse_safetensors(bytes.substr(n), "fuzz-input.safetensors");
  if (!small_enough(model, input)) return;
  for (const cabm::Precision precision : {cabm::Precision::kFp32, cabm::Precision::kBf16}) {
    const std::map<std::string, cabm::Tensor> out = cabm::run_pytorch_module(model, input, precision);
    if (!out.count("output")) cabm::fuzz::invariant_failed("run_pytorch_module returned no 'output'");
    for (const auto& [name, t] : out)
      if (!t.defined() || t.dtype() != cabm::DType::F32) cabm::fuzz::invariant_failed("an output is not F32");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return cabm::fuzz::run([&] { forward(cabm::fuzz::as_text(data, size)); });
}
