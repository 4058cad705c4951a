// `cabm forward` against PyTorch 1.13: every case written by tests/fixtures/make_forward.py
// (random MultiheadAttention / TransformerEncoderLayer / TransformerEncoder modules, every
// mask kind) must reproduce PyTorch's outputs. Where PyTorch returns NaN (fully masked rows)
// cabm must return 0.
//
// Tolerance: torch.testing's float32 defaults (rtol 1.3e-6, atol 1e-5) assume a handful of
// rounding steps. Here an output element is the end of a chain of reductions of length
// K = max(E, F, M) per layer, each contributing up to ~√K·u relative error (u = 2^-24, random
// rounding), amplified by LayerNorm's 1/σ; we allow atol = 1e-5 · √(K / 64) · L and the
// default rtol, which for K = 64 and one layer is exactly torch's default.
#include "cabm/io/safetensors.h"
#include "util/test_util.h"

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <regex>

namespace cabm {
namespace {

std::vector<std::string> case_names() {
  std::ifstream in(test::fixtures_dir() + "/forward/cases.txt");
  std::vector<std::string> names;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) names.push_back(line);
  return names;
}

int64_t reduction_length(const SafetensorsFile& model, const SafetensorsFile& input) {
  int64_t K = 1;
  for (const auto& [name, t] : model.tensors)
    for (int64_t s : t.shape()) K = std::max(K, s);
  for (const auto& [name, t] : input.tensors)
    if (t.dim() >= 2) K = std::max(K, t.size(1));
  return K;
}

TEST(ParityForward, EveryFixtureCaseMatchesPyTorch) {
  const std::vector<std::string> names = case_names();
  ASSERT_GE(names.size(), 50u) << "fixtures missing: run the fixtures_forward test first";
  int failures = 0;
  for (size_t c = 0; c < names.size(); ++c) {
    const std::string dir = test::fixtures_dir() + "/forward/" + names[c];
    const std::string out = test::temp_dir() + "/out_" + std::to_string(c) + ".safetensors";
    const int threads = 1 + static_cast<int>(c % 2);
    const std::string cmd = test::cabm_binary() + " forward --model " + dir + "/model.safetensors --input " + dir +
                            "/input.safetensors --output " + out + " --threads " + std::to_string(threads);
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    const SafetensorsFile actual = read_safetensors(out);
    const SafetensorsFile expected = read_safetensors(dir + "/expected.safetensors");
    const SafetensorsFile model = read_safetensors(dir + "/model.safetensors");
    const SafetensorsFile input = read_safetensors(dir + "/input.safetensors");
    int64_t layers = 1;
    while (model.find("layers." + std::to_string(layers) + ".self_attn.in_proj_weight")) ++layers;
    const double atol = 1e-5 * std::sqrt(std::max<double>(1.0, reduction_length(model, input) / 64.0)) * layers;
    ASSERT_EQ(actual.tensors.size(), expected.tensors.size()) << names[c];
    for (const auto& [name, want] : expected.tensors) {
      const Tensor& got = actual.get(name);
      // PyTorch's NaN (fully masked rows) must be 0 in cabm.
      Tensor target = want.clone();
      float* t = target.data<float>();
      for (int64_t i = 0; i < target.numel(); ++i)
        if (std::isnan(t[i])) t[i] = 0.0f;
      const auto cmp = test::compare(got, target, 1.3e-6, atol);
      if (!cmp.ok) ++failures;
      EXPECT_TRUE(cmp.ok) << names[c] << " " << name << ": max |diff| " << cmp.max_abs_diff << " (atol " << atol
                          << "), first mismatch " << cmp.first_bad;
    }
  }
  EXPECT_EQ(failures, 0);
}

}  // namespace
}  // namespace cabm
