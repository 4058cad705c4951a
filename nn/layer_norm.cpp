#include "nn/layer_norm.h"

#include "kernels/layernorm.h"

namespace cabm {

LayerNorm make_layer_norm(int64_t E, float eps) {
  CABM_CHECK(E > 0, "LayerNorm size must be positive, got {}", E);
  CABM_CHECK(eps > 0.0f, "LayerNorm eps must be positive, got {}", eps);
  LayerNorm norm;
  norm.weight = Tensor::full({E}, 1.0f);
  norm.bias = Tensor::zeros({E});
  norm.eps = eps;
  return norm;
}

void layer_norm_forward(const LayerNorm& norm, const Tensor& x, const Tensor& y, LayerNormCache& cache) {
  const int64_t rows = x.size(0), E = norm.dim();
  CABM_CHECK(x.dim() == 2 && x.size(1) == E && x.stride(1) == 1, "LayerNorm input {} must be [rows, {}]",
             shape_str(x.shape()), E);
  CABM_CHECK(y.shape() == x.shape() && y.stride(1) == 1, "LayerNorm output {} must match input {}",
             shape_str(y.shape()), shape_str(x.shape()));
  ensure_shape(cache.mean, {rows});
  ensure_shape(cache.rstd, {rows});
  const LayerNormArgs args{rows, E, norm.eps, norm.weight.data<float>(),
                           norm.bias.defined() ? norm.bias.data<float>() : nullptr};
  layernorm_forward(args, x.data<float>(), x.stride(0), y.data<float>(), y.stride(0), cache.mean.data<float>(),
                    cache.rstd.data<float>());
}

}  // namespace cabm
