#include "cabm/nn/bf16_util.h"

#include "cabm/kernels/bf16.h"
#include "cabm/kernels/gemm.h"

#include <algorithm>
#include <atomic>

namespace cabm {

namespace {

void check_pair(const Tensor& src, const Tensor& dst, DType from, DType to) {
  CABM_CHECK(src.dim() == 2 && dst.dim() == 2 && src.shape() == dst.shape() && src.stride(1) == 1 &&
                 dst.stride(1) == 1 && src.dtype() == from && dst.dtype() == to,
             "bf16 conversion: {} {} → {} {} must be [rows, cols] views with unit column stride",
             dtype_name(src.dtype()), shape_str(src.shape()), dtype_name(dst.dtype()), shape_str(dst.shape()));
}

// Rows per parallel task: about 16k elements, so small tensors stay on one thread.
int64_t rows_per_task(int64_t cols) {
  return std::max<int64_t>(1, (int64_t{1} << 14) / std::max<int64_t>(cols, 1));
}

// convert(from, to, n) over the [rows, cols] views src → dst, across threads: one contiguous run
// split evenly, else whole rows per task (each row converted by one call, so the bits do not
// depend on the thread count).
template <typename From, typename To, typename Convert>
void convert_rows(const Tensor& src, const Tensor& dst, Convert convert) {
  const int64_t rows = src.size(0), cols = src.size(1), ls = src.stride(0), ld = dst.stride(0);
  const From* s = src.data<From>();
  To* d = dst.data<To>();
  if (ls == cols && ld == cols) {
    const int64_t n = rows * cols, chunk = int64_t{1} << 14, tasks = (n + chunk - 1) / chunk;
#pragma omp parallel for schedule(static) if (tasks > 1)
    for (int64_t t = 0; t < tasks; ++t) convert(s + t * chunk, d + t * chunk, std::min(chunk, n - t * chunk));
    return;
  }
  const int64_t step = rows_per_task(cols), tasks = (rows + step - 1) / step;
#pragma omp parallel for schedule(static) if (tasks > 1)
  for (int64_t t = 0; t < tasks; ++t)
    for (int64_t r = t * step; r < std::min(rows, (t + 1) * step); ++r) convert(s + r * ls, d + r * ld, cols);
}

}  // namespace

void round_to_bf16(const Tensor& src, const Tensor& dst) {
  if (dst.defined() && dst.dtype() == DType::F32) {
    check_pair(src, dst, DType::F32, DType::F32);
    return convert_rows<float, float>(src, dst,
                                      [](const float* s, float* d, int64_t n) { round_to_bf16_values(s, d, n); });
  }
  check_pair(src, dst, DType::F32, DType::BF16);
  convert_rows<float, bf16>(src, dst, [](const float* s, bf16* d, int64_t n) { float_to_bf16(s, d, n); });
}

void widen_from_bf16(const Tensor& src, const Tensor& dst) {
  check_pair(src, dst, DType::BF16, DType::F32);
  convert_rows<bf16, float>(src, dst, [](const bf16* s, float* d, int64_t n) { bf16_to_float(s, d, n); });
}

namespace {
std::atomic<int> g_rounded_override{-1};  // a DType, or −1: none
}  // namespace

DType rounded_dtype() {
  const int pinned = g_rounded_override.load(std::memory_order_relaxed);
  if (pinned >= 0) return static_cast<DType>(pinned);
  return gemm_bf16_widens() ? DType::F32 : DType::BF16;
}

namespace detail {
void set_rounded_dtype_override(std::optional<DType> dtype) {
  CABM_CHECK(!dtype || *dtype == DType::BF16 || *dtype == DType::F32, "rounded operands are BF16 or F32, not {}",
             dtype_name(*dtype));
  g_rounded_override.store(dtype ? static_cast<int>(*dtype) : -1, std::memory_order_relaxed);
}
}  // namespace detail

Tensor bf16_scratch(int slot, int64_t rows, int64_t cols) {
  CABM_CHECK(slot >= 0 && slot < kBf16ScratchSlots && rows >= 0 && cols >= 0, "bf16_scratch({}, {}, {})", slot, rows,
             cols);
  thread_local Tensor buffers[kBf16ScratchSlots];
  Tensor& buffer = buffers[slot];
  const int64_t n = std::max<int64_t>(rows * cols, 1);
  if (!buffer.defined() || buffer.numel() < n) buffer = Tensor::empty({n}, DType::BF16);
  return buffer.narrow(0, 0, rows * cols).view({rows, cols});
}

Tensor rounded_scratch(int slot, int64_t rows, int64_t cols) {
  const DType dtype = rounded_dtype();
  if (dtype == DType::BF16) return bf16_scratch(slot, rows, cols);
  CABM_CHECK(slot >= 0 && slot < kBf16ScratchSlots && rows >= 0 && cols >= 0, "rounded_scratch({}, {}, {})", slot, rows,
             cols);
  thread_local Tensor buffers[kBf16ScratchSlots];
  Tensor& buffer = buffers[slot];
  const int64_t n = std::max<int64_t>(rows * cols, 1);
  if (!buffer.defined() || buffer.numel() < n) buffer = Tensor::empty({n});
  return buffer.narrow(0, 0, rows * cols).view({rows, cols});
}

}  // namespace cabm
