// Model configurations as safetensors `__metadata__` strings, so that a checkpoint's
// model.safetensors alone says how to rebuild its model (and a PyTorch user can read it):
//   model            "CausalLM" | "Classifier"
//   vocab_size, max_seq_len, d_model, nhead, num_layers, dim_feedforward   integers
//   dropout, layer_norm_eps                                                 floats
//   activation ("relu" | "gelu"), norm_first ("true" | "false"), positional ("learned" |
//   "sinusoidal"); CausalLM: tie_head; Classifier: num_classes, final_norm, labels
//   (comma-separated class names).
#pragma once

#include "cabm/io/safetensors.h"
#include "cabm/nn/causal_lm.h"
#include "cabm/nn/classifier.h"

#include <map>
#include <string>
#include <vector>

namespace cabm {

using Metadata = std::map<std::string, std::string>;

Metadata causal_lm_metadata(const CausalLMConfig& config);
Metadata classifier_metadata(const ClassifierConfig& config, const std::vector<std::string>& labels);

// The file's model kind ("" when it has no `model` metadata).
std::string model_kind(const SafetensorsFile& file);

// Parse the metadata back; every missing or malformed value is a cabm::Error naming the file
// and the key. Sizes are then checked against the file's tensors (vocab_size and d_model
// against embed.weight, max_seq_len against pos_embed.weight, num_layers against the
// encoder.layers.N present, dim_feedforward against linear1.weight, ...): a config whose
// model the file does not hold is refused before anything is allocated.
CausalLMConfig causal_lm_config_from(const SafetensorsFile& file);
ClassifierConfig classifier_config_from(const SafetensorsFile& file, std::vector<std::string>& labels);

// A model rebuilt from a file's metadata, with the file's parameters loaded (strictly: every
// parameter present with its shape, nothing unexpected). Out of memory is a cabm::OutOfMemory
// naming the file.
CausalLM load_causal_lm(const SafetensorsFile& file);
Classifier load_classifier(const SafetensorsFile& file, std::vector<std::string>& labels);

// Parameters of a model of this config (in double: an estimate for memory checks, computed
// without overflow for any sizes).
double parameter_count(const CausalLMConfig& config);
double parameter_count(const ClassifierConfig& config);
double layer_parameter_count(const EncoderLayerConfig& config);

std::string activation_name(Activation activation);
Activation parse_activation(const std::string& name);  // "relu" | "gelu"

}  // namespace cabm
