// Bytes → a checkpoint's optimizer.safetensors as `cabm train --resume` reads it:
// parse_safetensors, then load_adamw_state into the optimizer of two models: a fixed one (a
// weight [3, 4] and a bias [4], the names of tests/train/test_checkpoint.cpp) and one whose
// parameters have the names and shapes of the file's exp_avg.* tensors (so a well-formed file
// of any model reaches the value checks). A state that loads must be one AdamW can continue
// from: a step in range, finite moments, v >= 0, |m| within Adam's moment bound
// (|m| <= C·(sqrt(v) + eps), cabm/train/checkpoint.cpp: C from the looser of the run's betas and
// the file's, none where either pair has none), and one update leaves every weight finite (before
// the bound, exp_avg 1e38 with exp_avg_sq 0 loaded and made the weights inf).
#include "cabm/io/safetensors.h"
#include "cabm/train/adamw.h"
#include "cabm/train/checkpoint.h"
#include "cabm/train/train_config.h"
#include "tests/fuzz/fuzz_util.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

namespace {

using cabm::fuzz::invariant_failed;

// The constant C of the bound for betas (b1, b2): twice (1 − b1)/√((1 − b2)(1 − b1²/b2)), 14.6 for
// the defaults (0.9, 0.999); 0 where b1² >= b2 (no bound exists).
double moment_bound(double b1, double b2) {
  return b1 * b1 < b2 ? 2 * (1 - b1) / std::sqrt((1 - b2) * (1 - b1 * b1 / b2)) : 0.0;
}

// The bound a loaded state must obey: the looser of the run's and the file's (its metadata betas,
// which a state that loaded holds as numbers in [0, 1) if at all); 0 for none.
double loaded_bound(const cabm::SafetensorsFile& file, const cabm::AdamWConfig& run) {
  const double c = moment_bound(run.beta1, run.beta2);
  const std::string *b1 = file.find_metadata("beta1"), *b2 = file.find_metadata("beta2");
  if (b1 == nullptr || b2 == nullptr || c == 0.0) return c;
  const double c_file = moment_bound(std::strtod(b1->c_str(), nullptr), std::strtod(b2->c_str(), nullptr));
  return c_file == 0.0 ? 0.0 : std::max(c, c_file);
}

void load_and_step(const cabm::SafetensorsFile& file, const cabm::NamedTensors& params) {
  cabm::AdamW opt = cabm::make_adamw(params, cabm::AdamWConfig{});
  cabm::load_adamw_state(file, opt);
  const double bound = loaded_bound(file, opt.config);
  if (opt.step < 0 || opt.step > cabm::kMaxSteps) invariant_failed("a step out of range was accepted");
  for (size_t i = 0; i < opt.names.size(); ++i) {
    const float* m = opt.exp_avg[i].data<float>();
    const float* v = opt.exp_avg_sq[i].data<float>();
    for (int64_t j = 0; j < opt.exp_avg[i].numel(); ++j) {
      if (!std::isfinite(m[j])) invariant_failed("a non-finite exp_avg was accepted");
      if (!std::isfinite(v[j]) || v[j] < 0.0f) invariant_failed("a negative or non-finite exp_avg_sq was accepted");
      if (bound > 0.0 && std::abs(m[j]) > bound * (std::sqrt(static_cast<double>(v[j])) + opt.config.eps))
        invariant_failed("an exp_avg beyond Adam's moment bound was accepted");
    }
  }
  cabm::NamedTensors grads;
  for (const auto& [name, p] : params) {
    cabm::Tensor g = cabm::Tensor::zeros(p.shape());
    float* gv = g.data<float>();
    for (int64_t j = 0; j < g.numel(); ++j) gv[j] = 0.01f * static_cast<float>(j % 7 - 3);
    grads.push_back({name, g});
  }
  cabm::adamw_step(opt, params, grads, 1e-3);
  for (const auto& [name, p] : params)
    for (int64_t j = 0; j < p.numel(); ++j)
      if (!std::isfinite(p.data<float>()[j]))
        invariant_failed("one AdamW step from a loaded state made a weight NaN or infinite");
}

void adamw_state(std::string_view bytes) {
  const cabm::SafetensorsFile file = cabm::parse_safetensors(bytes, "fuzz-checkpoint/optimizer.safetensors");

  cabm::fuzz::run([&] {
    load_and_step(file, {{"l.weight", cabm::Tensor::zeros({3, 4})}, {"l.bias", cabm::Tensor::zeros({4})}});
  });

  cabm::NamedTensors params;
  for (const auto& [name, t] : file.tensors)
    if (name.rfind("exp_avg.", 0) == 0) params.push_back({name.substr(8), cabm::Tensor::zeros(t.shape())});
  load_and_step(file, params);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return cabm::fuzz::run([&] { adamw_state(cabm::fuzz::as_text(data, size)); });
}
