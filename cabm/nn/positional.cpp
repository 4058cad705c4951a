#include "cabm/nn/positional.h"

#include <cmath>

namespace cabm {

namespace {
Tensor as_rows_2d(const Tensor& t) { return t.view({-1, t.size(-1)}); }

void check_btE(const Tensor& y, int64_t E, const char* what) {
  CABM_CHECK(y.dim() == 3 && y.size(2) == E && y.is_contiguous(), "{} {} must be contiguous [B, T, {}]", what,
             shape_str(y.shape()), E);
}
}  // namespace

void positional_embedding_forward(const Embedding& pos, int64_t start, const Tensor& y) {
  const int64_t E = pos.dim();
  check_btE(y, E, "positional embedding input");
  const int64_t B = y.size(0), T = y.size(1);
  if (start < 0 || start + T > pos.num_embeddings())
    throw Error(fmt::format("positions {}..{} exceed the {} learned positions (max_seq_len)", start, start + T - 1,
                            pos.num_embeddings()));
  const float* w = pos.weight.data<float>() + start * E;
  float* out = y.data<float>();
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < E; ++c) out[(b * T + t) * E + c] += w[t * E + c];
}

void positional_embedding_backward(int64_t start, const Tensor& dy, Embedding& grad) {
  const int64_t E = grad.dim();
  check_btE(dy, E, "positional embedding gradient");
  const int64_t B = dy.size(0), T = dy.size(1);
  CABM_CHECK(start >= 0 && start + T <= grad.num_embeddings(), "positions out of range");
  const float* g = dy.data<float>();
  float* w = grad.weight.data<float>() + start * E;
  // Each thread owns positions t; the batch is summed in order: deterministic.
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t c = 0; c < E; ++c) w[t * E + c] += g[(b * T + t) * E + c];
}

void sinusoidal_encoding(int64_t start, const Tensor& out) {
  CABM_CHECK(out.dim() == 2 && out.is_contiguous(), "sinusoidal encoding output must be contiguous [T, E]");
  const int64_t T = out.size(0), E = out.size(1);
  float* p = out.data<float>();
  for (int64_t t = 0; t < T; ++t) {
    const double position = static_cast<double>(start + t);
    for (int64_t c = 0; c < E; ++c) {
      const int64_t pair = c / 2;  // PE[t, 2i] = sin(t ω_i), PE[t, 2i+1] = cos(t ω_i), ω_i = 10000^(−2i/E)
      const double omega = std::pow(10000.0, -2.0 * static_cast<double>(pair) / static_cast<double>(E));
      p[t * E + c] = static_cast<float>(c % 2 == 0 ? std::sin(position * omega) : std::cos(position * omega));
    }
  }
}

void sinusoidal_encoding_forward(int64_t start, const Tensor& y) {
  CABM_CHECK(y.dim() == 3 && y.is_contiguous(), "sinusoidal encoding input must be contiguous [B, T, E]");
  const int64_t B = y.size(0), T = y.size(1), E = y.size(2);
  Tensor pe = Tensor::empty({T, E});
  sinusoidal_encoding(start, pe);
  const float* w = pe.data<float>();
  float* out = y.data<float>();
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < E; ++c) out[(b * T + t) * E + c] += w[t * E + c];
}

const char* positional_name(PositionalKind kind) {
  switch (kind) {
    case PositionalKind::kLearned: return "learned";
    case PositionalKind::kSinusoidal: return "sinusoidal";
    case PositionalKind::kRotary: return "rotary";
  }
  return "?";
}

PositionalKind parse_positional(const std::string& name) {
  if (name == "learned") return PositionalKind::kLearned;
  if (name == "sinusoidal") return PositionalKind::kSinusoidal;
  if (name == "rotary") return PositionalKind::kRotary;
  throw Error(fmt::format("unknown positional kind '{}' (expected learned, sinusoidal or rotary)", name));
}

void token_input_forward(const TokenInput& input, const Tensor& tokens, int64_t start, const DropoutArgs& dropout,
                         const Tensor& y) {
  CABM_CHECK(tokens.dim() == 2 && y.dim() == 3 && y.size(0) == tokens.size(0) && y.size(1) == tokens.size(1),
             "token input: tokens {} and output {} must be [B, T] and [B, T, E]", shape_str(tokens.shape()),
             shape_str(y.shape()));
  embedding_forward(*input.embed, tokens, as_rows_2d(y));
  if (input.pos) positional_embedding_forward(*input.pos, start, y);
  else if (input.sinusoidal) sinusoidal_encoding_forward(start, y);
  if (dropout.active()) dropout_forward(dropout, y.data<float>(), y.data<float>(), y.numel());
}

void token_input_backward(const Tensor& tokens, int64_t start, const DropoutArgs& dropout, const Tensor& dy,
                          Embedding& grad_embed, Embedding* grad_pos) {
  if (dropout.active()) dropout_backward(dropout, dy.data<float>(), dy.data<float>(), dy.numel());
  embedding_backward(tokens, as_rows_2d(dy), grad_embed);
  if (grad_pos) positional_embedding_backward(start, dy, *grad_pos);
}

}  // namespace cabm
