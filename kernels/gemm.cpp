#include "kernels/gemm.h"

#include "core/error.h"
#include "kernels/bf16.h"

#include <dnnl.h>

#include <algorithm>
#include <cstring>
#include <dnnl.hpp>
#include <memory>
#include <mutex>
#include <vector>

namespace cabm {

namespace {
template <typename Ref>
void check_operands(const Ref& a, const Ref& b, int64_t ldc) {
  CABM_CHECK(a.cols == b.rows, "gemm inner dimensions differ: [{}, {}] x [{}, {}]", a.rows, a.cols, b.rows, b.cols);
  CABM_CHECK(a.ld >= (a.transposed ? a.rows : a.cols) || a.rows == 0 || a.cols == 0, "gemm lda {} too small", a.ld);
  CABM_CHECK(b.ld >= (b.transposed ? b.rows : b.cols) || b.rows == 0 || b.cols == 0, "gemm ldb {} too small", b.ld);
  CABM_CHECK(ldc >= b.cols || a.rows == 0, "gemm ldc {} too small for {} columns", ldc, b.cols);
}
// oneDNN 2.6's sgemm computes C = Aᵀ·B (a weight gradient dYᵀ·X: A and B stored K × M and K × N,
// K = tokens) without packing an operand whose rows are 32-byte aligned, reading its K rows in
// place. When those rows are 4 KiB apart (ld a multiple of 1024 floats: the feed-forward's
// 1024-wide activations) they all fall into the same few L1 sets and the product runs at half
// speed. Measured here (Zen 3, 2 threads, K = 4096, GFLOP/s): M = 256, N = 1024, B's ld 1024:
// 81, the same with B copied to ld 1040: 168 (the copy: 2 ms of the 13); M = 1024, N = 256, A's
// ld 1024: 72, copied: 119. So such an operand is copied once into rows kAliasPad floats longer.
constexpr int64_t kAliasPad = 16;
bool rows_alias(int64_t ld, int64_t rows) { return ld % 1024 == 0 && rows >= 256; }

// The stored rows × cols matrix at src (leading dimension ld) copied to scratch with leading
// dimension cols + kAliasPad; returns the copy.
const float* pad_rows(const float* src, int64_t rows, int64_t cols, int64_t ld, std::vector<float>& scratch) {
  const int64_t padded = cols + kAliasPad;
  scratch.resize(static_cast<size_t>(rows * padded));
  float* dst = scratch.data();
#pragma omp parallel for schedule(static) if (rows * cols >= (1 << 18))
  for (int64_t r = 0; r < rows; ++r) std::memcpy(dst + r * padded, src + r * ld, static_cast<size_t>(cols) * 4);
  return dst;
}

// Leading dimensions as oneDNN gets them: at least 1 even for degenerate operands.
int64_t effective_lda(const MatrixRef& a) { return std::max<int64_t>(a.ld, a.transposed ? a.rows : a.cols); }
int64_t effective_ldb(const MatrixRef& b) { return std::max<int64_t>(b.ld, b.transposed ? b.rows : b.cols); }

}  // namespace

GemmWorkspace gemm_workspace(const MatrixRef& a, const MatrixRef& b) {
  GemmWorkspace w;
  const int64_t M = a.rows, N = b.cols, K = a.cols;
  if (!a.transposed || b.transposed || M == 0 || N == 0 || K == 0) return w;
  if (rows_alias(effective_lda(a), K)) w.a_bytes = K * (M + kAliasPad) * 4;
  if (rows_alias(effective_ldb(b), K)) w.b_bytes = K * (N + kAliasPad) * 4;
  return w;
}

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
  const int64_t lda = effective_lda(a), ldb = effective_ldb(b);
  if (const GemmWorkspace w = gemm_workspace(a, b); w.a_bytes > 0 || w.b_bytes > 0) {
    thread_local std::vector<float> a_copy, b_copy;
    const float* ap = w.a_bytes > 0 ? pad_rows(a.data, K, M, lda, a_copy) : a.data;
    const float* bp = w.b_bytes > 0 ? pad_rows(b.data, K, N, ldb, b_copy) : b.data;
    const int64_t lda_used = w.a_bytes > 0 ? M + kAliasPad : lda, ldb_used = w.b_bytes > 0 ? N + kAliasPad : ldb;
    const dnnl_status_t status =
        dnnl_sgemm('T', 'N', M, N, K, alpha, ap, lda_used, bp, ldb_used, beta, c, ldc);
    CABM_CHECK(status == dnnl_success, "oneDNN sgemm failed with status {}", static_cast<int>(status));
    return;
  }
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

// ---------------------------------------------------------------------------------------------
// bf16 GEMM.

namespace {

// One oneDNN matmul per distinct call signature. alpha and beta are part of the key because
// they are baked into the primitive's attributes (output scale, sum post-op); in cabm they take
// a handful of values (1, 0), so the cache stays small.
struct Bf16Key {
  int64_t M, N, K, lda, ldb, ldc;
  bool ta, tb;
  float alpha, beta;
  bool operator==(const Bf16Key& o) const {
    return M == o.M && N == o.N && K == o.K && lda == o.lda && ldb == o.ldb && ldc == o.ldc && ta == o.ta &&
           tb == o.tb && std::memcmp(&alpha, &o.alpha, 4) == 0 && std::memcmp(&beta, &o.beta, 4) == 0;
  }
};

constexpr const char* kFallbackName = "fp32 sgemm (converted)";

struct Bf16Plan {
  Bf16Key key;
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul primitive;
  bool reference;  // oneDNN offers only its reference implementation: use the fp32 fallback
  std::string impl;
};

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// A small most-recently-used list: lookups are a linear scan of at most kCapacity keys, negligible
// next to a matmul, and the plans are shared_ptrs so a plan evicted while another thread runs it
// stays alive.
class Bf16PlanCache {
 public:
  static constexpr size_t kCapacity = 64;
  std::shared_ptr<const Bf16Plan> get(const Bf16Key& key) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (size_t n = 0; n < plans_.size(); ++n) {
        if (plans_[n]->key == key) {
          std::rotate(plans_.begin(), plans_.begin() + static_cast<std::ptrdiff_t>(n),
                      plans_.begin() + static_cast<std::ptrdiff_t>(n) + 1);
          return plans_.front();
        }
      }
    }
    // Created outside the lock (primitive creation can take milliseconds); two threads racing on a
    // new key both create one, and the second insert is dropped.
    auto plan = std::make_shared<const Bf16Plan>(create(key));
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& p : plans_)
      if (p->key == key) return p;
    plans_.insert(plans_.begin(), plan);
    if (plans_.size() > kCapacity) plans_.pop_back();
    return plan;
  }

 private:
  static Bf16Plan create(const Bf16Key& k) {
    using dt = dnnl::memory::data_type;
    using dims = dnnl::memory::dims;
    const dnnl::memory::desc a_md(dims{k.M, k.K}, dt::bf16, k.ta ? dims{1, k.lda} : dims{k.lda, 1});
    const dnnl::memory::desc b_md(dims{k.K, k.N}, dt::bf16, k.tb ? dims{1, k.ldb} : dims{k.ldb, 1});
    const dnnl::memory::desc c_md(dims{k.M, k.N}, dt::f32, dims{k.ldc, 1});
    dnnl::primitive_attr attr;
    if (k.alpha != 1.0f) attr.set_output_scales(0, {k.alpha});
    if (k.beta != 0.0f) {
      dnnl::post_ops ops;
      ops.append_sum(k.beta);
      attr.set_post_ops(ops);
    }
    dnnl::matmul::primitive_desc pd;
    try {
      pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, c_md), attr, cpu_engine());
    } catch (const dnnl::error&) {  // no bf16 matmul at all for this CPU (e.g. AVX2 only)
      return {k, {}, {}, true, kFallbackName};
    }
    std::string impl = pd.impl_info_str();
    if (impl.rfind("ref", 0) == 0) return {k, {}, {}, true, kFallbackName};
    return {k, pd, dnnl::matmul(pd), false, impl};
  }

  std::mutex mutex_;
  std::vector<std::shared_ptr<const Bf16Plan>> plans_;
};

Bf16PlanCache& plan_cache() {
  static Bf16PlanCache cache;
  return cache;
}

Bf16Key make_key(const MatrixRefBf16& a, const MatrixRefBf16& b, int64_t ldc, float alpha, float beta) {
  const int64_t M = a.rows, N = b.cols, K = a.cols;
  return {M, N, K, std::max<int64_t>(a.ld, a.transposed ? M : K), std::max<int64_t>(b.ld, b.transposed ? K : N),
          ldc, a.transposed, b.transposed, alpha, beta};
}

// The stored matrix of an operand (cols × rows when transposed) converted to contiguous fp32.
MatrixRef to_f32(const MatrixRefBf16& x, std::vector<float>& buffer) {
  const int64_t stored_rows = x.transposed ? x.cols : x.rows, stored_cols = x.transposed ? x.rows : x.cols;
  buffer.resize(static_cast<size_t>(stored_rows * stored_cols));
  bf16_to_float_2d(x.data, x.ld, buffer.data(), stored_cols, stored_rows, stored_cols);
  return {buffer.data(), x.rows, x.cols, std::max<int64_t>(stored_cols, 1), x.transposed};
}

void gemm_bf16_via_f32(const MatrixRefBf16& a, const MatrixRefBf16& b, float* c, int64_t ldc, float alpha,
                       float beta) {
  std::vector<float> abuf, bbuf;
  gemm(to_f32(a, abuf), to_f32(b, bbuf), c, ldc, alpha, beta);
}

}  // namespace

void gemm_bf16(const MatrixRefBf16& a, const MatrixRefBf16& b, float* c, int64_t ldc, float alpha, float beta) {
  check_operands(a, b, ldc);
  const int64_t M = a.rows, N = b.cols, K = a.cols;
  if (M == 0 || N == 0) return;
  if (K == 0) {
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    return;
  }
  if (bf16_active_isa() == Bf16Isa::kPortable && cpu_has_avx512_bf16())
    return gemm_bf16_via_f32(a, b, c, ldc, alpha, beta);  // forced portable (tests, comparisons)
  const auto plan = plan_cache().get(make_key(a, b, ldc, alpha, beta));
  if (plan->reference) return gemm_bf16_via_f32(a, b, c, ldc, alpha, beta);
  const dnnl::engine& engine = cpu_engine();
  thread_local dnnl::stream stream(engine);
  dnnl::memory am(plan->pd.src_desc(), engine, const_cast<bf16*>(a.data));
  dnnl::memory bm(plan->pd.weights_desc(), engine, const_cast<bf16*>(b.data));
  dnnl::memory cm(plan->pd.dst_desc(), engine, c);
  plan->primitive.execute(stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
  stream.wait();
}

std::string gemm_bf16_implementation(const MatrixRefBf16& a, const MatrixRefBf16& b, int64_t ldc) {
  check_operands(a, b, ldc);
  if (a.rows == 0 || b.cols == 0 || a.cols == 0) return "none (empty)";
  if (bf16_active_isa() == Bf16Isa::kPortable && cpu_has_avx512_bf16()) return kFallbackName;
  return plan_cache().get(make_key(a, b, ldc, 1.0f, 0.0f))->impl;
}

void gemm_bf16_reference(const MatrixRefBf16& a, const MatrixRefBf16& b, float* c, int64_t ldc, float alpha,
                         float beta) {
  check_operands(a, b, ldc);
  std::vector<float> abuf, bbuf;
  gemm_reference(to_f32(a, abuf), to_f32(b, bbuf), c, ldc, alpha, beta);
}

}  // namespace cabm
