// Matrix multiplication, row-major, through one narrow interface backed by oneDNN and OpenBLAS:
// which one runs a product is decided on the machine (gemm_route.h). Everything in cabm that
// multiplies matrices calls this, so the backing library can be changed (or a packed-weight path
// added) in one place.
#pragma once

#include "cabm/core/dtype.h"

#include <cstdint>
#include <string>

namespace cabm {

// A row-major matrix operand: element (r, c) of op(X) is data[r * ld + c], or
// data[c * ld + r] when `transposed` (then the stored matrix is cols × rows).
struct MatrixRef {
  const float* data;
  int64_t rows;  // rows of op(X)
  int64_t cols;  // cols of op(X)
  int64_t ld;
  bool transposed = false;
};

// c[M, N] (row-major, leading dimension ldc) = alpha · op(a)[M, K] · op(b)[K, N] + beta · c.
// beta = 0 ignores c's previous contents (NaN included).
void gemm(const MatrixRef& a, const MatrixRef& b, float* c, int64_t ldc, float alpha = 1.0f,
          float beta = 0.0f);

// Plain triple loop in double precision accumulation: the oracle the tests compare to.
void gemm_reference(const MatrixRef& a, const MatrixRef& b, float* c, int64_t ldc, float alpha = 1.0f,
                    float beta = 0.0f);

// ---------------------------------------------------------------------------------------------
// bf16 × bf16 → fp32 (mixed precision): the operands are bf16, every product and sum is fp32, C is
// fp32. The same operand convention as MatrixRef, with a bf16 pointer.
struct MatrixRefBf16 {
  const bf16* data;
  int64_t rows;  // rows of op(X)
  int64_t cols;  // cols of op(X)
  int64_t ld;
  bool transposed = false;
};

// c[M, N] = alpha · op(a)[M, K] · op(b)[K, N] + beta · c (+ bias[n] in every row, with alpha 1),
// fp32 accumulation; beta = 0 ignores c. Runs oneDNN's matmul primitive (bf16 inputs, f32 output;
// alpha as its output scale, beta as a sum post-op, the bias as its bias: added as the product is
// stored, where broadcasting it into c first cost a pass over c, 5% of a bf16 training step), one
// primitive per (shape, strides, transposes, alpha, beta, bias or not), created on first use and
// cached (thread-safe). Where oneDNN has no bf16 multiply instructions to run
// (onednn_multiplies_bf16: CPUs without AVX512_BF16 or AMX-BF16), the operands are converted to
// fp32 (exactly) and multiplied by gemm(): the same math, a different summation order. So are they
// on CPUs with AVX512_BF16 but no AMX where vdpbf16ps does not outrun fp32 FMAs (bf16.h's
// bf16_vdpbf16ps_active(); Intel Xeons without AMX), into per-thread buffers kept between calls.
void gemm_bf16(const MatrixRefBf16& a, const MatrixRefBf16& b, float* c, int64_t ldc, float alpha = 1.0f,
               float beta = 0.0f, const float* bias = nullptr);

// Whether oneDNN's bf16 matmul multiplies on bf16 units here: its effective ISA (the CPU's, or less
// under ONEDNN_MAX_CPU_ISA) has AVX512_BF16 (vdpbf16ps) or AMX-BF16. Below that oneDNN has either
// only its reference loops (AVX2 CPUs) or, on AVX-512 CPUs without BF16 (Intel's Skylake-SP to Ice
// Lake server), a bf16 GEMM that widens its operands on the fly ("gemm:jit"), which ran the big
// preset's training products at about 0.4x gemm()'s fp32 speed (docs/mixed_precision.md, session
// 41): widening once and calling gemm() is faster there.
bool onednn_multiplies_bf16();

// Whether gemm_bf16 multiplies in fp32 on operands it first widens (exactly) to fp32: where
// portable is forced, where oneDNN has no bf16 multiply instructions (onednn_multiplies_bf16), and
// on CPUs with AVX512_BF16 but no AMX where vdpbf16ps does not outrun fp32 FMAs. There, callers
// that keep operands for products (the mixed-precision modules, cabm/nn/bf16_util.h) keep them as
// fp32 holding bf16 values and call gemm_bf16_widened, which saves the rounding to bf16 and the
// widening back (a Xeon without AMX: 9% of a bf16 training step's samples down to 2.4%, the step
// from 0.84–0.87 to 0.97–0.98 of fp32's speed; docs/mixed_precision.md, session 37).
bool gemm_bf16_widens();

// gemm_bf16 on operands already widened: a and b are fp32 views whose values are bf16 values
// (rounded, e.g. by round_to_bf16_values in cabm/kernels/bf16.h). Where gemm_bf16_widens(), the
// same result as gemm_bf16 on the bf16 forms of compact operands (ld = their stored column count),
// bit for bit: the same fp32 product with the same bias pass. Elsewhere an fp32 product of the
// same values (a different summation order from oneDNN's bf16 kernels).
void gemm_bf16_widened(const MatrixRef& a, const MatrixRef& b, float* c, int64_t ldc, float alpha = 1.0f,
                       float beta = 0.0f, const float* bias = nullptr);

// What gemm_bf16 runs for these operands: oneDNN's implementation name ("brg:avx512_core_bf16",
// ...), or "fp32 sgemm (converted)" for the fallback. For benchmarks and logs.
std::string gemm_bf16_implementation(const MatrixRefBf16& a, const MatrixRefBf16& b, int64_t ldc);

// What gemm_bf16 has run in this process (the products it keeps a primitive for, at most the 64
// most recent shapes): "brg:avx512_core_amx_bf16 (27 shapes)", several implementations most shapes
// first, then "fp32 sgemm (converted), portable forced (N products)" if products ran while
// portable was forced, "fp32 sgemm (converted), no AMX, vdpbf16ps not faster than FMAs (N
// products)" if they were widened for speed and "fp32 sgemm (converted), no bf16 units for oneDNN
// here (N products)" for gemm_bf16_widened's products where oneDNN has none
// (onednn_multiplies_bf16; "operands given widened" where it has); or "none yet". oneDNN picks per
// shape (on an AMX Xeon a 1 × 1 product takes avx512_core_bf16 and training's products
// AMX), so benchmarks print this after their runs.
std::string gemm_bf16_implementations_used();

// The oracle: gemm_reference on the operands converted to fp32 (exact), double accumulation, then
// the bias added.
void gemm_bf16_reference(const MatrixRefBf16& a, const MatrixRefBf16& b, float* c, int64_t ldc, float alpha = 1.0f,
                         float beta = 0.0f, const float* bias = nullptr);

}  // namespace cabm
