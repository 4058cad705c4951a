#include "cabm/nn/classifier.h"

#include <algorithm>

namespace cabm {

Classifier make_classifier(const ClassifierConfig& config) {
  if (config.vocab_size <= 0 || config.max_seq_len <= 0 || config.num_layers <= 0 || config.num_classes <= 0)
    throw Error(fmt::format(
        "classifier: vocab_size ({}), max_seq_len ({}), num_layers ({}) and num_classes ({}) must be positive",
        config.vocab_size, config.max_seq_len, config.num_layers, config.num_classes));
  if (!config.bias) throw Error("classifier: the layers always have biases (bias must be true)");
  Classifier model;
  model.config = config;
  model.encoder = make_encoder(config, config.num_layers, config.final_norm);  // the config is its layers' config
  model.embed = make_embedding(config.vocab_size, config.d_model);
  if ((config.positional == PositionalKind::kRotary) != (config.rope.style != RopeStyle::kNone))
    throw Error(fmt::format("{}: rotary positions (positional rotary) and the layers' rope options go together",
                            "classifier"));
  if (config.positional == PositionalKind::kLearned) model.pos_embed = make_embedding(config.max_seq_len, config.d_model);
  model.classifier = make_linear(config.d_model, config.num_classes, /*bias=*/true);
  return model;
}

const Tensor& classifier_forward(const Classifier& model, const Tensor& tokens, const std::vector<int64_t>& lengths,
                                 ClassifierCache& cache, const ForwardMode& mode) {
  if (!tokens.defined() || tokens.dtype() != DType::I64 || tokens.dim() != 2 || tokens.size(0) == 0 ||
      tokens.size(1) == 0)
    throw Error(fmt::format("classifier: tokens must be a non-empty I64 [B, T] tensor, got {}",
                            tokens.defined() ? shape_str(tokens.shape()) : "undefined"));
  const int64_t B = tokens.size(0), T = tokens.size(1), E = model.config.d_model, C = model.config.num_classes;
  if (T > model.config.max_seq_len)
    throw Error(fmt::format("classifier: length {} exceeds max_seq_len {}", T, model.config.max_seq_len));
  if (static_cast<int64_t>(lengths.size()) != B)
    throw Error(fmt::format("classifier: {} lengths for a batch of {}", lengths.size(), B));
  for (int64_t b = 0; b < B; ++b)
    if (lengths[b] < 1 || lengths[b] > T)
      throw Error(fmt::format("classifier: length {} of row {} outside [1, {}]", lengths[b], b, T));
  ensure_shape(cache.tokens, {B, T}, DType::I64);
  cache.tokens.copy_from(tokens);
  cache.lengths = lengths;

  ensure_shape(cache.embedded, {B, T, E});
  ForwardMode model_mode = mode;
  model_mode.layer = kModelLayer;
  cache.embed_dropout = dropout_args(model_mode, DropoutSite::kEmbedding, model.config.dropout);
  const TokenInput input{&model.embed, model.pos_embed.weight.defined() ? &model.pos_embed : nullptr,
                         model.config.positional == PositionalKind::kSinusoidal};
  token_input_forward(input, cache.tokens, 0, cache.embed_dropout, cache.embedded);
  const Tensor& h = encoder_forward(model.encoder, cache.embedded, Mask::key_padding(lengths), cache.encoder, mode);

  // pooled[b] = (1 / len_b) Σ_{t < len_b} h[b, t]
  ensure_shape(cache.pooled, {B, E});
  const float* hp = h.data<float>();
  float* pooled = cache.pooled.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < B; ++b) {
    float* out = pooled + b * E;
    std::fill_n(out, E, 0.0f);
    for (int64_t t = 0; t < lengths[b]; ++t)
      for (int64_t c = 0; c < E; ++c) out[c] += hp[(b * T + t) * E + c];
    const float inv = 1.0f / static_cast<float>(lengths[b]);
    for (int64_t c = 0; c < E; ++c) out[c] *= inv;
  }
  ensure_shape(cache.logits, {B, C});
  linear_forward(model.classifier, cache.pooled, cache.logits);
  return cache.logits;
}

CrossEntropyResult classifier_loss(const Tensor& labels, const LossOptions& options, ClassifierCache& cache) {
  CABM_CHECK(cache.logits.defined(), "classifier_loss before classifier_forward");
  return cross_entropy_loss(cache.logits, labels.defined() ? labels.contiguous() : labels, options, cache.lse,
                            cache.dlogits);
}

void classifier_backward(const Classifier& model, ClassifierCache& cache, Classifier& grads) {
  CABM_CHECK(cache.dlogits.defined() && cache.dlogits.shape() == cache.logits.shape(),
             "classifier_backward needs cache.dlogits of the logits' shape (call classifier_loss first)");
  CABM_CHECK(grads.encoder.layers.size() == model.encoder.layers.size() &&
                 grads.classifier.weight.shape() == model.classifier.weight.shape(),
             "classifier gradients must come from a model of the same config");
  const int64_t B = cache.tokens.size(0), T = cache.tokens.size(1), E = model.config.d_model;
  // logits = pooled Wᵀ + b
  ensure_shape(cache.d_pooled, {B, E});
  linear_backward(model.classifier, cache.pooled, cache.dlogits, cache.d_pooled, grads.classifier);
  // pooled[b] = mean_{t < len_b} h[b, t]:  dh[b, t] = d_pooled[b] / len_b for t < len_b, else 0
  ensure_shape(cache.d_hidden, {B, T, E});
  const float* dp = cache.d_pooled.data<float>();
  float* dh = cache.d_hidden.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < B; ++b) {
    const float inv = 1.0f / static_cast<float>(cache.lengths[b]);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < E; ++c) dh[(b * T + t) * E + c] = t < cache.lengths[b] ? dp[b * E + c] * inv : 0.0f;
  }
  encoder_backward(model.encoder, cache.embedded, cache.d_hidden, cache.d_hidden, cache.encoder, grads.encoder);
  token_input_backward(cache.tokens, 0, cache.embed_dropout, cache.d_hidden, grads.embed,
                       grads.pos_embed.weight.defined() ? &grads.pos_embed : nullptr);
}

}  // namespace cabm
