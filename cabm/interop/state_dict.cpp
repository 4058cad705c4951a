#include "cabm/interop/state_dict.h"

#include <algorithm>
#include <bit>
#include <limits>
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
// An IEEE value is NaN or ±inf exactly when its exponent bits are all ones, that is when its
// bits without the sign are at least those of +inf. Their maximum over a block is a reduction
// the compiler vectorises (no branch per element); only a block whose maximum reaches +inf is
// searched element by element, for the index.
template <typename Bits, typename Element, typename BitsOf>
int64_t first_non_finite(const Element* data, int64_t n, BitsOf bits_of, Bits inf_bits) {
  constexpr Bits kMagnitude = std::numeric_limits<Bits>::max() >> 1;  // all but the sign bit
  constexpr int64_t kBlock = 4096;
  for (int64_t start = 0; start < n; start += kBlock) {
    const int64_t end = std::min(n, start + kBlock);
    Bits largest = 0;
    for (int64_t j = start; j < end; ++j) largest = std::max(largest, static_cast<Bits>(bits_of(data[j]) & kMagnitude));
    if (largest < inf_bits) continue;
    for (int64_t j = start; j < end; ++j)
      if (static_cast<Bits>(bits_of(data[j]) & kMagnitude) >= inf_bits) return j;
  }
  return -1;
}

}  // namespace

int64_t find_non_finite(const Tensor& t) {
  if (t.dtype() != DType::F32 && t.dtype() != DType::BF16) return -1;
  const Tensor c = t.contiguous();  // itself when contiguous (every tensor read from a file)
  if (c.dtype() == DType::F32)
    return first_non_finite(
        c.data<float>(), c.numel(), [](float v) { return std::bit_cast<uint32_t>(v); }, uint32_t{0x7f800000});
  return first_non_finite(
      c.data<bf16>(), c.numel(), [](bf16 v) { return v.bits; }, uint16_t{0x7f80});
}

void check_finite_weights(const SafetensorsFile& file, const std::string& key, const Tensor& t) {
  const int64_t j = find_non_finite(t);
  if (j < 0) return;
  // The one element, not the tensor converted whole (an embedding table can be gigabytes).
  const Tensor c = t.contiguous();
  const float value = c.dtype() == DType::F32 ? c.data<float>()[j] : bf16_to_float(c.data<bf16>()[j]);
  throw Error(fmt::format("{}: tensor '{}' holds {} at element {} (a model's weights must be finite)", file.path, key,
                          value, j));
}

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
    check_finite_weights(file, key, src);
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
