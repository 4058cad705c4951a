// Moving module parameters in and out of safetensors files by PyTorch state_dict name.
#pragma once

#include "cabm/io/safetensors.h"
#include "cabm/nn/parameters.h"

#include <map>
#include <string>

namespace cabm {

// Copies every parameter from `file` (F32, or BF16 converted), name `prefix + name`, checking
// shapes. Strict like PyTorch's load_state_dict: a missing key, a wrong shape, or (when
// `allow_unexpected` is false) a tensor in the file under `prefix` that no parameter takes is
// a cabm::Error naming the file and the key.
void load_parameters(const SafetensorsFile& file, const NamedTensors& params, const std::string& prefix = "",
                     bool allow_unexpected = false);

// The parameters as a name → tensor map, ready for write_safetensors.
std::map<std::string, Tensor> to_tensor_map(const NamedTensors& params, const std::string& prefix = "");

}  // namespace cabm
