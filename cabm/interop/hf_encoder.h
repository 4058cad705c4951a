// BERT-family encoders from Hugging Face model directories (config.json + model.safetensors with
// transformers' own parameter names), run on cabm's modules in eval mode:
//
//   embeddings   x = LayerNorm(word[ids] + position[pos] + token_type[types])   (DistilBERT: no types)
//   L layers     post-norm EncoderLayer: x = LN1(x + attn(x)); x = LN2(x + W2·act(W1·x))
//   pooler       tanh(dense(x[:, 0]))                          (BERT / RoBERTa checkpoints that have one)
//   heads        Bert:       classifier(pooler(x))
//                RoBERTa:    classifier.out_proj(tanh(classifier.dense(x[:, 0])))
//                DistilBERT: classifier(relu(pre_classifier(x[:, 0])))
//
// Names, as transformers writes them (base prefix "bert." / "roberta." / "distilbert." in a
// *ForSequenceClassification checkpoint; none in a bare model, e.g. sentence-transformers'):
//   embeddings.{word,position,token_type}_embeddings.weight, embeddings.LayerNorm.{weight,bias}
//   BERT/RoBERTa: encoder.layer.N.attention.self.{query,key,value}.{weight,bias},
//     encoder.layer.N.attention.output.dense / .LayerNorm, encoder.layer.N.intermediate.dense,
//     encoder.layer.N.output.dense / .LayerNorm, pooler.dense
//   DistilBERT: transformer.layer.N.attention.{q,k,v,out}_lin, .sa_layer_norm, .ffn.lin1, .ffn.lin2,
//     .output_layer_norm
// The query/key/value matrices are packed into MultiHeadAttention's in_proj_weight [3E, E].
// Buffers transformers may have saved (embeddings.position_ids, embeddings.token_type_ids) are
// skipped; any other tensor that no parameter takes, a missing tensor or a wrong shape is an error
// naming the tensor and the file.
//
// Positions: BERT/DistilBERT 0..T−1; RoBERTa/XLM-R pad + 1 + (number of non-pad ids up to and
// including t) for non-pad ids and pad itself for pad ids, from input_ids exactly as transformers'
// create_position_ids_from_input_ids.
//
// Attention masks: attention_mask 1 = token, 0 = padding (transformers' polarity), turned into
// Mask::key_padding when the zeros form a suffix of each row (the fast path), else an allow mask.
// Padded query positions are computed as transformers computes them (they attend to the tokens).
#pragma once

#include "cabm/interop/hf_config.h"
#include "cabm/nn/embedding.h"
#include "cabm/nn/encoder_inference.h"
#include "cabm/nn/encoder_layer.h"
#include "cabm/nn/mixed_precision.h"

#include <filesystem>
#include <optional>
#include <vector>

namespace cabm {

struct HfEncoder {
  HfEncoderConfig config;
  Embedding word, position, token_type;  // token_type undefined for DistilBERT
  LayerNorm embed_norm;
  std::vector<EncoderLayer> layers;  // activation per config (the tanh GELU: InferenceActivation)
  std::optional<Linear> pooler;      // pooler.dense [E, E]
  // Sequence-classification head: Bert: head_out = classifier; RoBERTa: head_dense =
  // classifier.dense, head_out = classifier.out_proj; DistilBERT: head_dense = pre_classifier,
  // head_out = classifier. Undefined weights when absent.
  Linear head_dense, head_out;
  Precision precision = Precision::kFp32;

  int64_t hidden_size() const { return config.hidden_size; }
  int64_t num_labels() const { return static_cast<int64_t>(config.id2label.size()); }
  bool has_classifier() const { return config.head == HfHead::kSequenceClassification; }
};

// Loads DIR/config.json and DIR/model.safetensors. A directory with only pytorch_model.bin is
// refused: pickle files execute code when they are loaded.
HfEncoder load_hf_encoder(const std::filesystem::path& model_dir);

// bf16: the encoder layers' products run on bf16 weight copies with fp32 accumulation
// (cabm/nn/mixed_precision.h); embeddings, LayerNorms, pooler and head stay fp32.
void set_precision(HfEncoder& model, Precision precision);

struct HfInputs {
  Tensor input_ids;       // I64 [B, T]
  Tensor token_type_ids;  // I64 [B, T], or undefined (zeros)
  Tensor attention_mask;  // I64 [B, T] 1 = token, 0 = padding; or undefined (all tokens)
};

struct HfOutputs {
  Tensor last_hidden_state;  // F32 [B, T, E]
  Tensor pooler_output;      // F32 [B, E] when the model has a pooler
  Tensor logits;             // F32 [B, num_labels] for *ForSequenceClassification
};

// Buffers reused across calls, sized by the largest batch so far (later, smaller batches touch no
// fresh memory), and shared by all layers.
struct HfEncoderCache {
  Tensor x;  // [B, T, E]: the sum of the embeddings, their LayerNorm, then each layer's output, in place
  LayerNormCache norm;
  EncoderInferenceWorkspace work;
};

// The forward pass (eval). Ids outside the tables, positions beyond max_position_embeddings and
// malformed inputs are a cabm::Error naming what is wrong.
HfOutputs hf_encoder_forward(const HfEncoder& model, const HfInputs& inputs, HfEncoderCache& cache);

// The encoder alone, without a copy: returns cache.x [B, T, E], the last hidden state, valid until
// the next call with this cache.
const Tensor& hf_encoder_hidden(const HfEncoder& model, const HfInputs& inputs, HfEncoderCache& cache);

// The outputs of a last hidden state [B, T, E]: last_hidden_state = hidden itself (not a copy),
// the pooler's output and logits when the model has them.
HfOutputs hf_outputs(const HfEncoder& model, const Tensor& hidden);

// The pieces, for callers that run the encoder on their own batches (cabm/interop/hf_pipeline.h):
// hidden [B, T, E] → pooler output / logits of token 0.
Tensor hf_pooler_forward(const HfEncoder& model, const Tensor& hidden);      // [B, E]; model must have a pooler
Tensor hf_classifier_forward(const HfEncoder& model, const Tensor& hidden);  // [B, num_labels]

}  // namespace cabm
