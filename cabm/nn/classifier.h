// A sequence classifier on the encoder (BERT-like without the [CLS] token):
//   h0 = dropout(embed[tokens] + pos_embed[positions])                 [B, T, E]
//   h  = encoder(h0, Mask::key_padding(lengths))   (+ encoder.norm when final_norm)
//   pooled[b] = mean_{t < lengths[b]} h[b, t]       (masked mean over valid positions) [B, E]
//   logits = classifier(pooled)                     (Linear E → C, with bias)        [B, C]
// Parameter names: embed.weight, pos_embed.weight, encoder.layers.{i}...., encoder.norm.*
// (when final_norm), classifier.weight [C, E], classifier.bias [C].
#pragma once

#include "cabm/nn/embedding.h"
#include "cabm/nn/encoder.h"
#include "cabm/nn/forward_mode.h"
#include "cabm/nn/loss.h"
#include "cabm/nn/positional.h"

#include <vector>

namespace cabm {

// The layers' hyper-parameters are the EncoderLayerConfig this config extends (its defaults:
// the seed's post-norm ReLU layer); dropout also applies to the embeddings. The layers always
// have biases (bias must stay true: checkpoints do not record it).
struct ClassifierConfig : EncoderLayerConfig {
  int64_t vocab_size = 0;   // V
  int64_t max_seq_len = 0;  // T_max
  int64_t num_layers = 0;   // L
  int64_t num_classes = 0;  // C
  bool final_norm = true;   // encoder.norm
  PositionalKind positional = PositionalKind::kLearned;
};

struct Classifier {
  ClassifierConfig config;
  Embedding embed;      // [V, E]
  Embedding pos_embed;  // [T_max, E]; undefined weight when sinusoidal
  Encoder encoder;
  Linear classifier;    // [C, E] + [C]
};

Classifier make_classifier(const ClassifierConfig& config);  // zero parameters

struct ClassifierCache {
  Tensor tokens;                 // I64 [B, T] (copied)
  std::vector<int64_t> lengths;  // [B]
  Tensor embedded;               // [B, T, E]
  DropoutArgs embed_dropout;
  EncoderCache encoder;
  Tensor pooled;                 // [B, E]
  Tensor logits;                 // [B, C]
  Tensor lse;                    // [B]
  Tensor dlogits;                // [B, C]: where backward starts
  Tensor d_pooled;               // [B, E] scratch
  Tensor d_hidden;               // [B, T, E] scratch
};

// tokens: I64 [B, T]; lengths[b] in [1, T] valid positions of row b (the rest is padding,
// never attended to and not pooled). Returns cache.logits [B, C].
const Tensor& classifier_forward(const Classifier& model, const Tensor& tokens, const std::vector<int64_t>& lengths,
                                 ClassifierCache& cache, const ForwardMode& mode = {});

// Mean cross-entropy of cache.logits against labels (I64 [B]). Writes cache.dlogits.
CrossEntropyResult classifier_loss(const Tensor& labels, const LossOptions& options, ClassifierCache& cache);

// Backpropagates cache.dlogits; ACCUMULATES parameter gradients into grads.
void classifier_backward(const Classifier& model, ClassifierCache& cache, Classifier& grads);

}  // namespace cabm
