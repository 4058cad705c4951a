#include "kernels/gemm.h"

#include "core/error.h"

#include <dnnl.h>

namespace cabm {

namespace {
void check_operands(const MatrixRef& a, const MatrixRef& b, int64_t ldc) {
  CABM_CHECK(a.cols == b.rows, "gemm inner dimensions differ: [{}, {}] x [{}, {}]", a.rows, a.cols, b.rows, b.cols);
  CABM_CHECK(a.ld >= (a.transposed ? a.rows : a.cols) || a.rows == 0 || a.cols == 0, "gemm lda {} too small", a.ld);
  CABM_CHECK(b.ld >= (b.transposed ? b.rows : b.cols) || b.rows == 0 || b.cols == 0, "gemm ldb {} too small", b.ld);
  CABM_CHECK(ldc >= b.cols || a.rows == 0, "gemm ldc {} too small for {} columns", ldc, b.cols);
}
}  // namespace

void gemm(const MatrixRef& a, const MatrixRef& b, float* c, int64_t ldc, float alpha, float beta) {
  check_operands(a, b, ldc);
  const int64_t M = a.rows, N = b.cols, K = a.cols;
  if (M == 0 || N == 0) return;
  if (K == 0) {  // oneDNN rejects K = 0; the product is empty.
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    return;
  }
  // oneDNN needs ld >= 1 even for degenerate single-row/column operands.
  const int64_t lda = std::max<int64_t>(a.ld, a.transposed ? M : K);
  const int64_t ldb = std::max<int64_t>(b.ld, b.transposed ? K : N);
  const dnnl_status_t status = dnnl_sgemm(a.transposed ? 'T' : 'N', b.transposed ? 'T' : 'N', M, N, K, alpha, a.data,
                                          lda, b.data, ldb, beta, c, ldc);
  CABM_CHECK(status == dnnl_success, "oneDNN sgemm failed with status {}", static_cast<int>(status));
}

void gemm_reference(const MatrixRef& a, const MatrixRef& b, float* c, int64_t ldc, float alpha, float beta) {
  check_operands(a, b, ldc);
  auto at = [](const MatrixRef& x, int64_t r, int64_t col) {
    return static_cast<double>(x.transposed ? x.data[col * x.ld + r] : x.data[r * x.ld + col]);
  };
  for (int64_t i = 0; i < a.rows; ++i) {
    for (int64_t j = 0; j < b.cols; ++j) {
      double sum = 0;
      for (int64_t k = 0; k < a.cols; ++k) sum += at(a, i, k) * at(b, k, j);
      const double prev = beta == 0.0f ? 0.0 : static_cast<double>(beta) * c[i * ldc + j];
      c[i * ldc + j] = static_cast<float>(alpha * sum + prev);
    }
  }
}

}  // namespace cabm
