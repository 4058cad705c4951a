// bf16 helpers for the modules' mixed-precision paths (cabm/nn/mixed_precision.h): rounding fp32
// views to bf16 buffers in parallel, and grow-only per-thread scratch so that the bf16 products
// do not allocate once they have seen their largest shape.
#pragma once

#include "cabm/core/tensor.h"

#include <optional>

namespace cabm {

// dst = float_to_bf16(src) element by element (cabm/kernels/bf16.h, round to nearest even).
// src: F32 [rows, cols] with unit column stride; dst: BF16 [rows, cols] with unit column stride,
// or F32, which receives the rounded values widened back (round_to_bf16_values; src may be dst).
// Split across threads by rows (each row is converted by one call, so the bits do not depend
// on the thread count).
void round_to_bf16(const Tensor& src, const Tensor& dst);

// How the mixed-precision modules keep the operands of their bf16 products: BF16, or F32 holding
// bf16 values where gemm_bf16 would widen them to fp32 anyway (gemm_bf16_widens(): CPUs without
// a bf16 product unit that outruns their FMAs). Either way the products see the same values.
DType rounded_dtype();

namespace detail {
// Tests: pin rounded_dtype() to BF16 or F32 (std::nullopt follows gemm_bf16_widens() again), so
// that one CPU runs the modules on both forms of their operands.
void set_rounded_dtype_override(std::optional<DType> dtype);
}  // namespace detail

// The inverse: dst (F32 [rows, cols]) = src (BF16 [rows, cols]), exact.
void widen_from_bf16(const Tensor& src, const Tensor& dst);

// A contiguous BF16 [rows, cols] view of a grow-only buffer: reallocated only when a larger one
// is asked for. Slot k (0 <= k < kBf16ScratchSlots) of the calling thread; a view stays valid
// until the next call for the same slot on the same thread.
inline constexpr int kBf16ScratchSlots = 2;
Tensor bf16_scratch(int slot, int64_t rows, int64_t cols);
// The same for rounded operands: a [rows, cols] view of rounded_dtype() (its own slots).
Tensor rounded_scratch(int slot, int64_t rows, int64_t cols);

}  // namespace cabm
