#include "cabm/nn/causal_lm.h"

namespace cabm {

CausalLM make_causal_lm(const CausalLMConfig& config) {
  if (config.vocab_size <= 0 || config.max_seq_len <= 0 || config.num_layers <= 0)
    throw Error(fmt::format("causal LM: vocab_size ({}), max_seq_len ({}) and num_layers ({}) must be positive",
                            config.vocab_size, config.max_seq_len, config.num_layers));
  if (!config.bias) throw Error("causal LM: the layers always have biases (bias must be true)");
  CausalLM model;
  model.config = config;
  // The config is its layers' config (an EncoderLayerConfig); make_encoder validates the rest.
  model.encoder = make_encoder(config, config.num_layers, /*final_norm=*/true);
  model.embed = make_embedding(config.vocab_size, config.d_model);
  if ((config.positional == PositionalKind::kRotary) != (config.rope.style != RopeStyle::kNone))
    throw Error(fmt::format("{}: rotary positions (positional rotary) and the layers' rope options go together",
                            "causal LM"));
  if (config.positional == PositionalKind::kLearned) model.pos_embed = make_embedding(config.max_seq_len, config.d_model);
  if (!config.tie_head) model.head = make_linear(config.d_model, config.vocab_size, /*bias=*/false);
  return model;
}

namespace {

TokenInput token_input(const CausalLM& model) {
  return TokenInput{&model.embed, model.pos_embed.weight.defined() ? &model.pos_embed : nullptr,
                    model.config.positional == PositionalKind::kSinusoidal};
}

// The output projection: tied to the token embedding, or the separate head; in mixed
// precision with the output matrix's bf16 copy (kept in head.weight_bf16 either way).
Linear output_head(const CausalLM& model) {
  return Linear{model.config.tie_head ? model.embed.weight : model.head.weight, Tensor(), model.head.weight_bf16};
}

void check_tokens(const CausalLM& model, const Tensor& tokens, int64_t start) {
  if (!tokens.defined() || tokens.dtype() != DType::I64 || tokens.dim() != 2 || tokens.size(0) == 0 ||
      tokens.size(1) == 0)
    throw Error(fmt::format("causal LM: tokens must be a non-empty I64 [B, T] tensor, got {}",
                            tokens.defined() ? shape_str(tokens.shape()) : "undefined"));
  if (start + tokens.size(1) > model.config.max_seq_len)
    throw Error(fmt::format("causal LM: positions up to {} exceed max_seq_len {}", start + tokens.size(1),
                            model.config.max_seq_len));
}

}  // namespace

const Tensor& causal_lm_forward(const CausalLM& model, const Tensor& tokens, CausalLMCache& cache,
                                const ForwardMode& mode) {
  check_tokens(model, tokens, 0);
  const int64_t B = tokens.size(0), T = tokens.size(1), E = model.config.d_model, V = model.config.vocab_size;
  ensure_shape(cache.tokens, {B, T}, DType::I64);
  cache.tokens.copy_from(tokens);
  ensure_shape(cache.embedded, {B, T, E});
  ForwardMode model_mode = mode;
  model_mode.layer = kModelLayer;
  cache.embed_dropout = dropout_args(model_mode, DropoutSite::kEmbedding, model.config.dropout);
  token_input_forward(token_input(model), cache.tokens, 0, cache.embed_dropout, cache.embedded);
  const Tensor& h = encoder_forward(model.encoder, cache.embedded, Mask::causal(), cache.encoder, mode);
  ensure_shape(cache.logits, {B, T, V});
  linear_forward(output_head(model), as_rows(h), as_rows(cache.logits));
  return cache.logits;
}

CrossEntropyResult causal_lm_loss(const Tensor& targets, const LossOptions& options, CausalLMCache& cache) {
  CABM_CHECK(cache.logits.defined(), "causal_lm_loss before causal_lm_forward");
  if (!targets.defined() || targets.shape() != cache.tokens.shape())
    throw Error(fmt::format("causal LM: targets {} must have the shape of the tokens {}",
                            targets.defined() ? shape_str(targets.shape()) : "undefined",
                            shape_str(cache.tokens.shape())));
  return cross_entropy_loss(as_rows(cache.logits), targets.contiguous(), options, cache.lse, cache.dlogits);
}

void causal_lm_backward(const CausalLM& model, CausalLMCache& cache, CausalLM& grads) {
  CABM_CHECK(cache.logits.defined() && cache.dlogits.defined() && cache.dlogits.numel() == cache.logits.numel(),
             "causal_lm_backward needs cache.dlogits of the logits' shape (call causal_lm_loss first)");
  CABM_CHECK(grads.config.tie_head == model.config.tie_head && grads.embed.weight.shape() == model.embed.weight.shape(),
             "causal LM gradients must come from a model of the same config");
  const Tensor& h = cache.encoder.output;  // the final norm's output
  ensure_shape(cache.d_hidden, h.shape());
  // logits = h Wᵀ:  dh = dlogits W;  dW += dlogitsᵀ h (tied: into the embedding's gradient).
  Linear head_grad{model.config.tie_head ? grads.embed.weight : grads.head.weight, Tensor(), Tensor()};
  linear_backward(output_head(model), as_rows(h), cache.dlogits.view({-1, model.config.vocab_size}),
                  as_rows(cache.d_hidden), head_grad);
  encoder_backward(model.encoder, cache.embedded, cache.d_hidden, cache.d_hidden, cache.encoder, grads.encoder);
  token_input_backward(cache.tokens, 0, cache.embed_dropout, cache.d_hidden, grads.embed,
                       grads.pos_embed.weight.defined() ? &grads.pos_embed : nullptr);
}

void decode_reset(const CausalLM& model, int64_t B, int64_t capacity, DecodeState& state) {
  if (capacity <= 0 || capacity > model.config.max_seq_len)
    throw Error(fmt::format("decode capacity {} must be in [1, max_seq_len = {}]", capacity, model.config.max_seq_len));
  state.kv.resize(model.encoder.layers.size());
  // A bf16 model keeps its keys and values in bf16 (half the memory; attention in bf16).
  const DType dtype = model.head.weight_bf16.defined() ? DType::BF16 : DType::F32;
  for (size_t l = 0; l < state.kv.size(); ++l)
    kv_cache_reset(state.kv[l], B, capacity, model.encoder.layers[l].self_attn.kv_dim(), dtype);
}

const Tensor& causal_lm_decode(const CausalLM& model, const Tensor& tokens, DecodeState& state) {
  CABM_CHECK(!state.kv.empty(), "causal_lm_decode before decode_reset");
  const int64_t start = state.length();
  check_tokens(model, tokens, start);
  const int64_t B = tokens.size(0), n = tokens.size(1), E = model.config.d_model, V = model.config.vocab_size;
  if (B != state.kv.front().k.size(0))
    throw Error(fmt::format("causal_lm_decode: batch {} differs from the state's {}", B, state.kv.front().k.size(0)));
  if (start + n > state.kv.front().capacity())
    throw Error(fmt::format("causal_lm_decode: {} positions + {} new exceed the capacity {}", start, n,
                            state.kv.front().capacity()));
  ensure_shape(state.embedded, {B, n, E});
  token_input_forward(token_input(model), tokens.contiguous(), start, DropoutArgs{}, state.embedded);
  const Tensor& h = encoder_decode(model.encoder, state.embedded, state.kv, state.encoder);
  ensure_shape(state.logits, {B, n, V});
  linear_forward(output_head(model), as_rows(h), as_rows(state.logits));
  return state.logits;
}

}  // namespace cabm
