#include "cabm/train/adamw.h"

#include "cabm/core/error.h"

#include <cmath>
#include <cstring>

namespace cabm {

bool default_weight_decay(const std::string& name, const Tensor& param) {
  if (param.dim() < 2) return false;
  for (const char* embedding : {"embed", "wte", "wpe"})
    if (name.find(embedding) != std::string::npos) return false;
  return true;
}

AdamW make_adamw(const NamedTensors& params, const AdamWConfig& config) {
  CABM_CHECK(config.beta1 >= 0 && config.beta1 < 1 && config.beta2 >= 0 && config.beta2 < 1,
             "AdamW betas must lie in [0, 1), got ({}, {})", config.beta1, config.beta2);
  CABM_CHECK(config.eps >= 0 && config.weight_decay >= 0, "AdamW eps and weight decay must be >= 0");
  AdamW opt;
  opt.config = config;
  for (const auto& [name, p] : params) {
    CABM_CHECK(p.dtype() == DType::F32 && p.is_contiguous(), "parameter '{}' must be contiguous F32", name);
    opt.names.push_back(name);
    opt.exp_avg.push_back(Tensor::zeros(p.shape()));
    opt.exp_avg_sq.push_back(Tensor::zeros(p.shape()));
    opt.weight_decay.push_back(default_weight_decay(name, p) ? config.weight_decay : 0.0);
  }
  return opt;
}

void adamw_step(AdamW& opt, const NamedTensors& params, const NamedTensors& grads, double lr) {
  CABM_CHECK(params.size() == opt.names.size() && grads.size() == params.size(),
             "AdamW: {} parameters and {} gradients for an optimizer of {}", params.size(), grads.size(),
             opt.names.size());
  opt.step += 1;
  const double t = static_cast<double>(opt.step);
  const AdamWConfig& c = opt.config;
  // As torch computes them: Python floats (double), rounded to float where they meet a tensor.
  const double bias_correction1 = 1.0 - std::pow(c.beta1, t);
  const double bias_correction2 = 1.0 - std::pow(c.beta2, t);
  const float step_size = static_cast<float>(lr / bias_correction1);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  const float beta1 = static_cast<float>(c.beta1), one_minus_beta1 = static_cast<float>(1.0 - c.beta1);
  const float beta2 = static_cast<float>(c.beta2), one_minus_beta2 = static_cast<float>(1.0 - c.beta2);
  const float eps = static_cast<float>(c.eps);
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i].tensor;
    const Tensor& g = grads[i].tensor;
    CABM_CHECK(params[i].name == opt.names[i] && grads[i].name == opt.names[i],
               "AdamW: parameter {} is '{}' (gradient '{}'), expected '{}'", i, params[i].name, grads[i].name,
               opt.names[i]);
    CABM_CHECK(p.shape() == opt.exp_avg[i].shape() && g.shape() == p.shape() && p.is_contiguous() && g.is_contiguous(),
               "AdamW: '{}' has shape {} and gradient {}, expected contiguous {}", opt.names[i], shape_str(p.shape()),
               shape_str(g.shape()), shape_str(opt.exp_avg[i].shape()));
    const float decay = static_cast<float>(1.0 - lr * opt.weight_decay[i]);
    float* pp = p.data<float>();
    const float* gp = g.data<float>();
    float* m = opt.exp_avg[i].data<float>();
    float* v = opt.exp_avg_sq[i].data<float>();
    const int64_t n = p.numel();
#pragma omp parallel for schedule(static) if (n > 16384)
    for (int64_t j = 0; j < n; ++j) {
      const float gj = gp[j];
      const float pj = pp[j] * decay;
      // exp_avg.mul_(β1).add_(g, alpha=1−β1): torch's vectorised add is a fused multiply-add.
      const float mj = std::fma(gj, one_minus_beta1, m[j] * beta1);
      // exp_avg_sq.mul_(β2).addcmul_(g, g, value=1−β2): v + ((1−β2)·g)·g.
      const float vj = v[j] * beta2 + (one_minus_beta2 * gj) * gj;
      const float denom = std::sqrt(vj) / bc2_sqrt + eps;
      m[j] = mj;
      v[j] = vj;
      // param.addcdiv_(m, denom, value=−step_size): p + (−step_size)·(m / denom).
      pp[j] = pj + (-step_size) * (mj / denom);
    }
  }
}

void zero_tensors(const NamedTensors& tensors) {
  for (const auto& [name, t] : tensors) {
    CABM_CHECK(t.dtype() == DType::F32 && t.is_contiguous(), "'{}' must be contiguous F32", name);
    std::memset(t.raw_data(), 0, t.nbytes());
  }
}

}  // namespace cabm
