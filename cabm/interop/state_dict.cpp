#include "cabm/interop/state_dict.h"

#include <set>

namespace cabm {

namespace {
// Element-wise copy with conversion to F32 (a parameter is always F32 in memory).
void copy_converting(const Tensor& src, Tensor& dst) {
  if (src.dtype() == DType::F32) {
    dst.copy_from(src);
    return;
  }
  const std::vector<float> values = src.to_vector();
  Tensor converted = Tensor::from_vector(values, src.shape());
  dst.copy_from(converted);
}
}  // namespace

void load_parameters(const SafetensorsFile& file, const NamedTensors& params, const std::string& prefix,
                     bool allow_unexpected) {
  std::set<std::string> taken;
  for (const NamedTensor& p : params) {
    const std::string key = prefix + p.name;
    const Tensor& src = file.get(key);
    if (src.dtype() != DType::F32 && src.dtype() != DType::BF16)
      throw Error(fmt::format("{}: tensor '{}' has dtype {}, expected F32", file.path, key, dtype_name(src.dtype())));
    if (src.shape() != p.tensor.shape())
      throw Error(fmt::format("{}: tensor '{}' has shape {}, expected {}", file.path, key, shape_str(src.shape()),
                              shape_str(p.tensor.shape())));
    Tensor dst = p.tensor;
    copy_converting(src, dst);
    taken.insert(key);
  }
  if (allow_unexpected) return;
  for (const auto& [name, tensor] : file.tensors) {
    if (name.compare(0, prefix.size(), prefix) == 0 && !taken.count(name))
      throw Error(fmt::format("{}: unexpected tensor '{}' (no parameter of this module has that name)", file.path,
                              name));
  }
}

std::map<std::string, Tensor> to_tensor_map(const NamedTensors& params, const std::string& prefix) {
  std::map<std::string, Tensor> out;
  for (const NamedTensor& p : params) out.emplace(prefix + p.name, p.tensor);
  return out;
}

}  // namespace cabm
