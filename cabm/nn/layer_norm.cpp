#include "cabm/nn/layer_norm.h"

#include "cabm/kernels/layernorm.h"

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

namespace {
LayerNormArgs args_of(const LayerNorm& norm, int64_t rows) {
  return LayerNormArgs{rows, norm.dim(), norm.eps, norm.weight.data<float>(),
                       norm.bias.defined() ? norm.bias.data<float>() : nullptr};
}
}  // namespace

void layer_norm_forward(const LayerNorm& norm, const Tensor& x, const Tensor& y, LayerNormCache& cache) {
  const int64_t rows = x.size(0), E = norm.dim();
  CABM_CHECK(x.dim() == 2 && x.size(1) == E && x.stride(1) == 1, "LayerNorm input {} must be [rows, {}]",
             shape_str(x.shape()), E);
  CABM_CHECK(y.shape() == x.shape() && y.stride(1) == 1, "LayerNorm output {} must match input {}",
             shape_str(y.shape()), shape_str(x.shape()));
  ensure_shape(cache.mean, {rows});
  ensure_shape(cache.rstd, {rows});
  layernorm_forward(args_of(norm, rows), x.data<float>(), x.stride(0), y.data<float>(), y.stride(0),
                    cache.mean.data<float>(), cache.rstd.data<float>());
}

void layer_norm_backward(const LayerNorm& norm, const Tensor& x, const Tensor& dy, const Tensor& dx,
                         const LayerNormCache& cache, LayerNorm& grads) {
  const int64_t rows = x.size(0), E = norm.dim();
  CABM_CHECK(x.dim() == 2 && x.size(1) == E && x.stride(1) == 1, "LayerNorm input {} must be [rows, {}]",
             shape_str(x.shape()), E);
  CABM_CHECK(dy.shape() == x.shape() && dy.stride(1) == 1, "LayerNorm output gradient {} must match input {}",
             shape_str(dy.shape()), shape_str(x.shape()));
  CABM_CHECK(!dx.defined() || (dx.shape() == x.shape() && dx.stride(1) == 1),
             "LayerNorm input gradient {} must match input {}", shape_str(dx.shape()), shape_str(x.shape()));
  CABM_CHECK(cache.mean.defined() && cache.mean.size(0) == rows, "LayerNorm backward without a matching forward");
  CABM_CHECK(grads.weight.shape() == norm.weight.shape() && grads.weight.is_contiguous(),
             "LayerNorm weight gradient {} must be [{}]", shape_str(grads.weight.shape()), E);
  const LayerNormGrads g{dx.defined() ? dx.data<float>() : nullptr, dx.defined() ? dx.stride(0) : 0,
                         grads.weight.data<float>(), grads.bias.defined() ? grads.bias.data<float>() : nullptr};
  layernorm_backward(args_of(norm, rows), x.data<float>(), x.stride(0), cache.mean.data<float>(),
                     cache.rstd.data<float>(), dy.data<float>(), dy.stride(0), g);
}

}  // namespace cabm
