// The rows of one head of an fp32 [B, L, H, n] view, for the attention kernels (internal to
// cabm/kernels/attention/): row r at data + r · stride. Taken once per head, because Tensor's
// checked accessors cost more than a short row's work when called per row.
#pragma once

#include "cabm/core/tensor.h"

#include <cstdint>

namespace cabm::detail {

struct HeadRows {
  float* data;
  int64_t stride;
  float* row(int64_t r) const { return data + r * stride; }
};

inline HeadRows head_rows(const Tensor& t, int64_t b, int64_t h) {
  return {t.data<float>() + b * t.stride(0) + h * t.stride(2), t.stride(1)};
}

}  // namespace cabm::detail
