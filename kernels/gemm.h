// Matrix multiplication, row-major, through one narrow interface backed by oneDNN.
// Everything in cabm that multiplies matrices calls this, so the backing library can be
// changed (or a packed-weight path added) in one place.
#pragma once

#include <cstdint>

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

}  // namespace cabm
