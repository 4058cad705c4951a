// `cabm attention` (the file contract of docs/attention_file.md) against PyTorch 1.13: every case
// of tests/fixtures/make_attention.py (random shapes; GQA/MQA; bool and float masks of several
// broadcast shapes; causal both ways; windows; ALiBi, paper and given slopes; positions;
// soft-capping; sinks; rotary neox/gptj with theta and partial rope_dim; forward and backward)
// must reproduce the float64 formulas; and every malformed input must be one line and a
// non-zero exit.
//
// Tolerance, per tensor and norm-wise (against the largest |element|, at least 1): float
// attention carries a relative error of a few γ_K (K = max(d, dv, M) ≤ 64 here: about 4e-6) plus
// the absolute error of each float score, about smax·2^-24 (smax = the case's largest |score|,
// thousands with ALiBi at distant positions), which exp turns into a relative one. We allow
// 2e-5 + 8·smax·2^-24. bf16 rounds q, k, v (relative 2^-9) and P before P·V: 4e-2 + the same.
#include "cabm/io/safetensors.h"
#include "util/test_util.h"

#include <cmath>
#include <fstream>
#include <sstream>

namespace cabm {
namespace {

struct Case {
  std::string name, precision;
  double smax;
};

std::vector<Case> cases() {
  std::ifstream in(test::fixtures_dir() + "/attention/cases.txt");
  std::vector<Case> result;
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    Case c;
    if (fields >> c.name >> c.precision >> c.smax) result.push_back(c);
  }
  return result;
}

double max_abs_finite(const Tensor& t) {
  double m = 0.0;
  for (float x : t.to_vector())
    if (std::isfinite(x)) m = std::max(m, static_cast<double>(std::fabs(x)));
  return m;
}

// Returns "" or the first mismatch.
std::string compare(const std::string& name, const Tensor& got, const Tensor& want, double tolerance) {
  if (got.shape() != want.shape())
    return name + ": shape " + shape_str(got.shape()) + ", expected " + shape_str(want.shape());
  const std::vector<float> g = got.to_vector(), w = want.to_vector();
  const double bound = tolerance * std::max(1.0, max_abs_finite(want));
  for (size_t n = 0; n < w.size(); ++n) {
    if (!std::isfinite(w[n]) || !std::isfinite(g[n])) {
      if (g[n] != w[n]) return fmt::format("{}[{}] = {}, expected {}", name, n, g[n], w[n]);
      continue;
    }
    if (std::fabs(g[n] - w[n]) > bound)
      return fmt::format("{}[{}] = {}, expected {} (|error| {:.3g} > bound {:.3g})", name, n, g[n], w[n],
                         std::fabs(g[n] - w[n]), bound);
  }
  return "";
}

TEST(ParityAttentionFile, EveryFixtureCaseMatchesPyTorch) {
  const std::vector<Case> all = cases();
  ASSERT_GE(all.size(), 100u) << "fixtures missing: run the fixtures_attention test first";
  int failures = 0, backward = 0, bf16 = 0;
  for (size_t c = 0; c < all.size(); ++c) {
    const std::string dir = test::fixtures_dir() + "/attention/" + all[c].name;
    const std::string out = test::temp_dir() + "/out_" + std::to_string(c) + ".safetensors";
    const int threads = 1 + static_cast<int>(c % 2);
    const test::CmdResult r = test::run_cabm("attention --input " + dir + "/in.safetensors --output " + out +
                                             " --precision " + all[c].precision + " --threads " +
                                             std::to_string(threads));
    ASSERT_EQ(r.status, 0) << all[c].name << ": " << r.err;
    const SafetensorsFile actual = read_safetensors(out);
    const SafetensorsFile expected = read_safetensors(dir + "/expected.safetensors");
    const double tolerance = (all[c].precision == "bf16" ? 4e-2 : 2e-5) + 8.0 * all[c].smax * 0x1p-24;
    EXPECT_EQ(actual.tensors.size(), expected.tensors.size()) << all[c].name;
    for (const auto& [name, want] : expected.tensors) {
      const Tensor* got = actual.find(name);
      if (!got) {
        ADD_FAILURE() << all[c].name << ": no tensor " << name;
        ++failures;
        continue;
      }
      const std::string problem = compare(name, *got, want, tolerance);
      if (!problem.empty()) {
        ADD_FAILURE() << all[c].name << " (" << all[c].precision << "): " << problem;
        ++failures;
      }
    }
    backward += expected.find("dq") != nullptr;
    bf16 += all[c].precision == "bf16";
  }
  EXPECT_EQ(failures, 0);
  EXPECT_GT(backward, 50);
  EXPECT_GT(bf16, 10);
}

// --- bad input: one line naming what is wrong, non-zero exit ---------------------------------

class AttentionFileErrors : public ::testing::Test {
 protected:
  std::map<std::string, Tensor> tensors() const {
    return {{"q", Tensor::zeros({1, 3, 4, 8})}, {"k", Tensor::zeros({1, 5, 2, 8})}, {"v", Tensor::zeros({1, 5, 2, 6})}};
  }
  test::CmdResult run(const std::map<std::string, Tensor>& t, const std::map<std::string, std::string>& meta = {},
                      const std::string& flags = "") {
    const std::string in = test::temp_dir() + "/bad.safetensors";
    write_safetensors(in, t, meta);
    return test::run_cabm("attention --input " + in + " --output " + test::temp_dir() + "/bad_out.safetensors " +
                          flags);
  }
};

TEST_F(AttentionFileErrors, ValidInputRuns) {
  const test::CmdResult r = run(tensors());
  EXPECT_EQ(r.status, 0) << r.err;
}

TEST_F(AttentionFileErrors, MissingTensor) {
  auto t = tensors();
  t.erase("v");
  test::expect_one_line_error(run(t), "'v'");
}

TEST_F(AttentionFileErrors, QueryHeadsNotAMultipleOfKeyHeads) {
  auto t = tensors();
  t["k"] = Tensor::zeros({1, 5, 3, 8});
  t["v"] = Tensor::zeros({1, 5, 3, 6});
  test::expect_one_line_error(run(t), "multiple");
}

TEST_F(AttentionFileErrors, ShapeMismatches) {
  auto t = tensors();
  t["k"] = Tensor::zeros({1, 5, 2, 7});
  test::expect_one_line_error(run(t), "'k'");
  t = tensors();
  t["v"] = Tensor::zeros({1, 4, 2, 6});
  test::expect_one_line_error(run(t), "'v'");
  t = tensors();
  t["dout"] = Tensor::zeros({1, 3, 4, 5});
  test::expect_one_line_error(run(t), "'dout'");
  t = tensors();
  t["mask"] = Tensor::zeros({3, 4});
  test::expect_one_line_error(run(t), "'mask'");
  t = tensors();
  t["sinks"] = Tensor::zeros({2});
  test::expect_one_line_error(run(t), "'sinks'");
  t = tensors();
  t["alibi_slopes"] = Tensor::zeros({3});
  test::expect_one_line_error(run(t), "'alibi_slopes'");
  t = tensors();
  t["q_positions"] = Tensor::zeros({3});  // F32, not I64
  test::expect_one_line_error(run(t), "'q_positions'");
}

TEST_F(AttentionFileErrors, UnknownTensorOrMetadata) {
  auto t = tensors();
  t["attn_mask"] = Tensor::zeros({3, 5});
  test::expect_one_line_error(run(t), "'attn_mask'");
  test::expect_one_line_error(run(tensors(), {{"casual", "top_left"}}), "'casual'");
}

TEST_F(AttentionFileErrors, BadMetadataValues) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"causal", "yes"},      {"causal", "true"},   {"window_left", "-2"}, {"window_right", "x"},
      {"alibi", "1"},         {"softcap", "0"},     {"softcap", "-1"},     {"softcap", "nan"},
      {"rope", "llama"},      {"rope_theta", "0"},  {"rope_dim", "3"},     {"rope_dim", "10"},
      {"scale", "inf"},       {"scale", "0.1.2"},   {"scale", "1e39"},     {"softcap", "1e-50"}};
  for (const auto& [key, value] : bad) {
    SCOPED_TRACE(key + "=" + value);
    test::expect_one_line_error(run(tensors(), {{key, value}}), "'" + key + "'");
  }
}

// A θ so small that the rotary angles overflow float: an error, not NaN rows read as masked.
TEST_F(AttentionFileErrors, RopeThetaThatOverflows) {
  auto t = tensors();
  t["q"] = Tensor::zeros({1, 3, 4, 64});  // d 64: θ^(−62/64) overflows for θ = 1e-42
  t["k"] = Tensor::zeros({1, 5, 2, 64});
  test::expect_one_line_error(run(t, {{"rope", "neox"}, {"rope_theta", "1e-42"}}), "theta");
}

TEST_F(AttentionFileErrors, AlibiGivenTwice) {
  auto t = tensors();
  t["alibi_slopes"] = Tensor::zeros({4});
  test::expect_one_line_error(run(t, {{"alibi", "true"}}), "alibi");
}

TEST_F(AttentionFileErrors, BadPrecisionFlag) {
  test::expect_one_line_error(run(tensors(), {}, "--precision fp16"), "--precision");
}

}  // namespace
}  // namespace cabm
