// Runs a PyTorch nn.TransformerEncoder saved as a safetensors state_dict (PyTorch's own key
// names, `nhead` etc. in the file's metadata: docs/forward.md) on the input `src` [B, N, E] of
// another safetensors file, with its optional `src_key_padding_mask` [B, N] (bool, True =
// padding, PyTorch's convention) and metadata `is_causal`. Prints the output's shape; with a
// third file holding PyTorch's `output` for the same input, it reports the largest difference.
//
//   run_pytorch_encoder model.safetensors input.safetensors [expected.safetensors]
#include <cabm/cabm.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

int main(int argc, char** argv) {
  if (argc < 3 || argc > 4) {
    std::fprintf(stderr, "usage: %s MODEL.safetensors INPUT.safetensors [EXPECTED.safetensors]\n", argv[0]);
    return 2;
  }
  try {
    const cabm::SafetensorsFile model_file = cabm::read_safetensors(argv[1]);
    const cabm::Encoder encoder = cabm::encoder_from_state_dict(model_file);
    const int64_t E = encoder.layers.at(0).config.d_model;

    const cabm::SafetensorsFile input = cabm::read_safetensors(argv[2]);
    const cabm::Tensor& src = input.get("src", cabm::DType::F32, {-1, -1, E});
    const int64_t B = src.size(0), N = src.size(1);
    cabm::Mask mask;  // attends everywhere
    if (const cabm::Tensor* padding = input.find("src_key_padding_mask"))
      mask = cabm::mask_from_pytorch_key_padding(*padding, B, N, "src_key_padding_mask");
    if (const std::string* causal = input.find_metadata("is_causal"); causal && *causal == "true")
      mask = mask & cabm::Mask::causal();

    cabm::EncoderCache cache;  // activations and workspaces, reusable across calls of one shape
    const cabm::Tensor& output = cabm::encoder_forward(encoder, src.contiguous(), mask, cache);
    std::printf("encoder: %zu layers, E %lld; output [%lld, %lld, %lld]\n", encoder.layers.size(),
                static_cast<long long>(E), static_cast<long long>(B), static_cast<long long>(N),
                static_cast<long long>(E));

    if (argc == 4) {
      const cabm::SafetensorsFile expected_file = cabm::read_safetensors(argv[3]);
      const std::vector<float> expected = expected_file.get("output", cabm::DType::F32, {B, N, E}).to_vector();
      const std::vector<float> got = output.to_vector();
      double max_error = 0, scale = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        // Where every key of a row is padding PyTorch gives NaN and cabm gives 0.
        const double want = std::isnan(expected[i]) ? 0.0 : expected[i];
        max_error = std::max(max_error, std::abs(got[i] - want));
        scale = std::max(scale, std::abs(want));
      }
      std::printf("max |cabm - PyTorch| = %.3g (largest |output| %.3g)\n", max_error, scale);
      if (!(max_error <= 1e-4 * std::max(1.0, scale))) {
        std::printf("MISMATCH\n");
        return 1;
      }
      std::printf("ok\n");
    }
  } catch (const cabm::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
