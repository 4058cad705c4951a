#include "cabm/kernels/gemm.h"

#include "cabm/core/error.h"
#include "cabm/core/threads.h"
#include "cabm/kernels/bf16.h"
#include "cabm/kernels/gemm_route.h"

#include <cblas.h>
#include <dnnl.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <limits>
#include <dnnl.hpp>
#include <memory>
#include <mutex>
#include <unordered_map>
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
// Leading dimensions as oneDNN gets them: at least 1 even for degenerate operands.
int64_t effective_lda(const MatrixRef& a) { return std::max<int64_t>(a.ld, a.transposed ? a.rows : a.cols); }
int64_t effective_ldb(const MatrixRef& b) { return std::max<int64_t>(b.ld, b.transposed ? b.rows : b.cols); }

void run_gemm(GemmLibrary library, const MatrixRef& a, const MatrixRef& b, int64_t lda, int64_t ldb, float* c,
              int64_t ldc, float alpha, float beta) {
  const int64_t M = a.rows, N = b.cols, K = a.cols;
  if (library == GemmLibrary::kOpenBlas) {
    // OpenBLAS's OpenMP build: the same thread pool (and thread count) as oneDNN and our kernels.
    // OpenBLAS documents (Makefile.rule, NUM_PARALLEL) that calls into this build from several
    // threads at once may wait for each other or corrupt each other's work buffers; we have not
    // seen it (test_gemm's ConcurrentCallsFromThreads), but a caller may use gemm() from several
    // threads, so the calls are serialised here: one lock per product of milliseconds.
    static std::mutex openblas_mutex;
    const std::lock_guard<std::mutex> lock(openblas_mutex);
    CABM_CHECK(std::max({M, N, K, lda, ldb, ldc}) <= std::numeric_limits<blasint>::max(),
               "gemm: sizes beyond OpenBLAS's {}-bit integers", 8 * sizeof(blasint));
    cblas_sgemm(CblasRowMajor, a.transposed ? CblasTrans : CblasNoTrans, b.transposed ? CblasTrans : CblasNoTrans,
                static_cast<blasint>(M), static_cast<blasint>(N), static_cast<blasint>(K), alpha, a.data,
                static_cast<blasint>(lda), b.data, static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
    return;
  }
  const dnnl_status_t status = dnnl_sgemm(a.transposed ? 'T' : 'N', b.transposed ? 'T' : 'N', M, N, K, alpha, a.data,
                                          lda, b.data, ldb, beta, c, ldc);
  CABM_CHECK(status == dnnl_success, "oneDNN sgemm failed with status {}", static_cast<int>(status));
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
  const int64_t lda = effective_lda(a), ldb = effective_ldb(b);
  // Inside a parallel region the libraries run on one thread: that is the thread count to time.
  const int threads = omp_in_parallel() ? 1 : num_threads();
  const GemmShape shape{a.transposed, b.transposed, M, N, K, lda, ldb, ldc, threads};
  std::vector<float> scratch;  // the trial's output: the caller's c may be an input (beta != 0)
  const auto trial = [&](GemmLibrary library) {
    scratch.resize(static_cast<size_t>(M * ldc));
    const auto t0 = std::chrono::steady_clock::now();
    run_gemm(library, a, b, lda, ldb, scratch.data(), ldc, alpha, 0.0f);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  run_gemm(gemm_route(shape, trial), a, b, lda, ldb, c, ldc, alpha, beta);
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
  bool bias;
  bool operator==(const Bf16Key& o) const {
    return M == o.M && N == o.N && K == o.K && lda == o.lda && ldb == o.ldb && ldc == o.ldc && ta == o.ta &&
           tb == o.tb && std::memcmp(&alpha, &o.alpha, 4) == 0 && std::memcmp(&beta, &o.beta, 4) == 0 && bias == o.bias;
  }
};

constexpr const char* kFallbackName = "fp32 sgemm (converted)";

}  // namespace

bool onednn_multiplies_bf16() {
  // dnnl_cpu_isa_t is a set of feature bits: avx512_core_bf16's are in amx's too.
  static const bool yes = (static_cast<unsigned>(dnnl_get_effective_cpu_isa()) & dnnl_cpu_isa_avx512_core_bf16) ==
                          static_cast<unsigned>(dnnl_cpu_isa_avx512_core_bf16);
  return yes;
}

namespace {

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

// The bias: N floats, one per column of c.
dnnl::memory::desc bias_md(int64_t N) {
  return dnnl::memory::desc(dnnl::memory::dims{1, N}, dnnl::memory::data_type::f32, dnnl::memory::dims{N, 1});
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

  // Each implementation of the cached plans with how many shapes run on it, most shapes first.
  std::vector<std::pair<std::string, int>> implementations() {
    std::vector<std::pair<std::string, int>> out;
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& p : plans_) {
      auto it = std::find_if(out.begin(), out.end(), [&](const auto& e) { return e.first == p->impl; });
      if (it == out.end())
        out.emplace_back(p->impl, 1);
      else
        ++it->second;
    }
    std::stable_sort(out.begin(), out.end(), [](const auto& x, const auto& y) { return x.second > y.second; });
    return out;
  }

  static Bf16Plan create(const Bf16Key& k) {
    if (!onednn_multiplies_bf16()) return {k, {}, {}, true, kFallbackName};
    using dt = dnnl::memory::data_type;
    using dims = dnnl::memory::dims;
    const dnnl::memory::desc a_md(dims{k.M, k.K}, dt::bf16, k.ta ? dims{1, k.lda} : dims{k.lda, 1});
    const dnnl::memory::desc b_md(dims{k.K, k.N}, dt::bf16, k.tb ? dims{1, k.ldb} : dims{k.ldb, 1});
    const dnnl::memory::desc c_md(dims{k.M, k.N}, dt::f32, dims{k.ldc, 1});
    dnnl::primitive_attr attr;
    // A scratchpad of our own per execution: with the library's (shared by all primitives in
    // Debian's build, DNNL_ENABLE_CONCURRENT_EXEC=OFF) two threads running products at once, or
    // a primitive run on a thread other than the one that made it, race on the same buffer
    // (GemmBf16.ConcurrentCallsShareTheCache caught wrong results under load).
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (k.alpha != 1.0f) attr.set_output_scales(0, {k.alpha});
    if (k.beta != 0.0f) {
      dnnl::post_ops ops;
      ops.append_sum(k.beta);
      attr.set_post_ops(ops);
    }
    dnnl::matmul::primitive_desc pd;
    try {
      const dnnl::matmul::desc desc =
          k.bias ? dnnl::matmul::desc(a_md, b_md, bias_md(k.N), c_md) : dnnl::matmul::desc(a_md, b_md, c_md);
      pd = dnnl::matmul::primitive_desc(desc, attr, cpu_engine());
    } catch (const dnnl::error&) {  // no bf16 matmul at all for this CPU
      return {k, {}, {}, true, kFallbackName};
    }
    std::string impl = pd.impl_info_str();
    if (impl.rfind("ref", 0) == 0) return {k, {}, {}, true, kFallbackName};
    return {k, pd, dnnl::matmul(pd), false, impl};
  }

 private:
  std::mutex mutex_;
  std::vector<std::shared_ptr<const Bf16Plan>> plans_;
};

// Products that took the converted fallback without asking oneDNN (portable forced, or no bf16
// unit that outruns fp32 FMAs): they make no plan, so gemm_bf16_implementations_used counts them here.
std::atomic<int64_t> g_forced_portable_products{0};
std::atomic<int64_t> g_widened_products{0};
constexpr const char* kWidenedReason = "no AMX, vdpbf16ps not faster than FMAs";
// Products handed over already widened (gemm_bf16_widened) where neither applies: oneDNN has no
// bf16 matmul here at all, or it has one and the caller widened anyway.
std::atomic<int64_t> g_converted_products{0};
std::atomic<int64_t> g_given_widened_products{0};

// oneDNN's bf16 matmul runs on AMX tiles or vdpbf16ps where the CPU has them (and emulates bf16 on
// plain AVX-512F). Without AMX, where vdpbf16ps does no more multiply-adds per second than fp32
// FMAs (bf16.h: the Intel Xeons measured; its avx512_core_bf16 kernels ran cabm's training
// products at about half the speed of the fp32 ones there), widened operands and fp32 gemm win.
bool widen_for_fp32() {
  return !cpu_has_amx_bf16() && cpu_has_avx512_bf16() && !bf16_vdpbf16ps_active();
}

Bf16PlanCache& plan_cache() {
  static Bf16PlanCache cache;
  return cache;
}

// Whether oneDNN has a bf16 matmul other than its reference loops and its emulation on this CPU
// (onednn_multiplies_bf16), asked once for one plain shape outside the cache.
bool onednn_has_bf16_matmul() {
  static const bool has = !Bf16PlanCache::create({64, 64, 64, 64, 64, 64, false, false, 1.0f, 0.0f, false}).reference;
  return has;
}

Bf16Key make_key(const MatrixRefBf16& a, const MatrixRefBf16& b, int64_t ldc, float alpha, float beta, bool bias) {
  const int64_t M = a.rows, N = b.cols, K = a.cols;
  const int64_t lda = std::max<int64_t>(a.ld, a.transposed ? M : K), ldb = std::max<int64_t>(b.ld, b.transposed ? K : N);
  return {M, N, K, lda, ldb, ldc, a.transposed, b.transposed, alpha, beta, bias};
}

// c = beta · c + bias in every row (beta = 0 ignores c): a bias for the paths that add products onto c.
void bias_into(float* c, int64_t ldc, int64_t M, int64_t N, float beta, const float* bias) {
  // On every thread, as linear.cpp's broadcast_bias: a training batch's QKV projection is 12 MiB,
  // which one thread writes at a fraction of two threads' rate (the big preset's bf16 step where
  // products are widened, Xeon model 207: median of three 961 → 885 ms).
  const int64_t rows_per_block = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(N, 1));
  parallel_for_blocks(M, rows_per_block, [&](int64_t r0, int64_t r1) {
    for (int64_t i = r0; i < r1; ++i)
      for (int64_t j = 0; j < N; ++j) c[i * ldc + j] = (beta == 0.0f ? 0.0f : beta * c[i * ldc + j]) + bias[j];
  });
}

// The stored matrix of an operand (cols × rows when transposed) converted to contiguous fp32.
// Grown to the largest need and never cleared: every element the product reads is written first
// (std::vector::resize would zero each growth again, 2% of a widened bf16 training step).
class F32Buffer {
 public:
  float* get(int64_t n) {
    if (n > capacity_) {
      data_ = std::make_unique_for_overwrite<float[]>(static_cast<size_t>(n));
      capacity_ = n;
    }
    return data_.get();
  }

 private:
  std::unique_ptr<float[]> data_;
  int64_t capacity_ = 0;
};

MatrixRef to_f32(const MatrixRefBf16& x, F32Buffer& buffer) {
  const int64_t stored_rows = x.transposed ? x.cols : x.rows, stored_cols = x.transposed ? x.rows : x.cols;
  float* data = buffer.get(stored_rows * stored_cols);
  // On every thread: one thread widened a training step's operands at 6.6% of the step.
  const int64_t rows_per_block = std::max<int64_t>(1, (int64_t{1} << 18) / std::max<int64_t>(stored_cols, 1));
  parallel_for_blocks(stored_rows, rows_per_block, [&](int64_t r0, int64_t r1) {
    bf16_to_float_2d(x.data + r0 * x.ld, x.ld, data + r0 * stored_cols, stored_cols, r1 - r0, stored_cols);
  });
  return {data, x.rows, x.cols, std::max<int64_t>(stored_cols, 1), x.transposed};
}

// The fp32 product of widened operands, the bias first written into c: gemm_bf16's converted
// route and gemm_bf16_widened both end here, so they give the same bits.
void widened_product(const MatrixRef& a, const MatrixRef& b, float* c, int64_t ldc, float alpha, float beta,
                     const float* bias) {
  if (bias) {
    bias_into(c, ldc, a.rows, b.cols, beta, bias);
    beta = 1.0f;
  }
  gemm(a, b, c, ldc, alpha, beta);
}

void gemm_bf16_via_f32(const MatrixRefBf16& a, const MatrixRefBf16& b, float* c, int64_t ldc, float alpha, float beta,
                       const float* bias) {
  // Per calling thread, grown to the largest operands and reused (fresh pages are expensive here).
  thread_local F32Buffer abuf, bbuf;
  widened_product(to_f32(a, abuf), to_f32(b, bbuf), c, ldc, alpha, beta, bias);
}

}  // namespace

// Forced portable (bf16.h: the override, or CABM_FORCE_PORTABLE) means the converted route on every
// CPU, whatever oneDNN has: also where cabm takes the CPU for one without AVX512_BF16
// (CABM_MAX_CPU_ISA) while oneDNN still multiplies bf16.
bool gemm_bf16_widens() {
  return bf16_portable_forced() || widen_for_fp32() || !onednn_has_bf16_matmul();
}

void gemm_bf16_widened(const MatrixRef& a, const MatrixRef& b, float* c, int64_t ldc, float alpha, float beta,
                       const float* bias) {
  CABM_CHECK(!bias || alpha == 1.0f, "gemm_bf16_widened: a bias needs alpha 1, got {}", alpha);
  if (a.rows == 0 || b.cols == 0) return;
  auto& counter = bf16_portable_forced()      ? g_forced_portable_products
                  : widen_for_fp32()          ? g_widened_products
                  : !onednn_has_bf16_matmul() ? g_converted_products
                                              : g_given_widened_products;
  counter.fetch_add(1, std::memory_order_relaxed);
  widened_product(a, b, c, ldc, alpha, beta, bias);
}

void gemm_bf16(const MatrixRefBf16& a, const MatrixRefBf16& b, float* c, int64_t ldc, float alpha, float beta,
               const float* bias) {
  check_operands(a, b, ldc);
  CABM_CHECK(!bias || alpha == 1.0f, "gemm_bf16: a bias needs alpha 1, got {}", alpha);
  const int64_t M = a.rows, N = b.cols, K = a.cols;
  if (M == 0 || N == 0) return;
  if (K == 0) {
    if (bias) return bias_into(c, ldc, M, N, beta, bias);
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    return;
  }
  if (bf16_portable_forced()) {  // tests, comparisons
    g_forced_portable_products.fetch_add(1, std::memory_order_relaxed);
    return gemm_bf16_via_f32(a, b, c, ldc, alpha, beta, bias);
  }
  if (widen_for_fp32()) {
    g_widened_products.fetch_add(1, std::memory_order_relaxed);
    return gemm_bf16_via_f32(a, b, c, ldc, alpha, beta, bias);
  }
  const auto plan = plan_cache().get(make_key(a, b, ldc, alpha, beta, bias != nullptr));
  if (plan->reference) return gemm_bf16_via_f32(a, b, c, ldc, alpha, beta, bias);
  const dnnl::engine& engine = cpu_engine();
  thread_local dnnl::stream stream(engine);
  dnnl::memory am(plan->pd.src_desc(), engine, const_cast<bf16*>(a.data));
  dnnl::memory bm(plan->pd.weights_desc(), engine, const_cast<bf16*>(b.data));
  dnnl::memory cm(plan->pd.dst_desc(), engine, c);
  // Per thread, grown to the largest need and then reused (fresh pages are expensive here).
  thread_local std::vector<uint8_t> scratchpad;
  const dnnl::memory::desc scratch_md = plan->pd.scratchpad_desc();
  if (scratchpad.size() < scratch_md.get_size()) scratchpad.resize(scratch_md.get_size());
  dnnl::memory sm(scratch_md, engine, scratchpad.data());
  std::unordered_map<int, dnnl::memory> args{
      {DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}, {DNNL_ARG_SCRATCHPAD, sm}};
  if (bias) args.emplace(DNNL_ARG_BIAS, dnnl::memory(bias_md(N), engine, const_cast<float*>(bias)));
  plan->primitive.execute(stream, args);
  stream.wait();
}

std::string gemm_bf16_implementation(const MatrixRefBf16& a, const MatrixRefBf16& b, int64_t ldc) {
  check_operands(a, b, ldc);
  if (a.rows == 0 || b.cols == 0 || a.cols == 0) return "none (empty)";
  if (bf16_portable_forced()) return kFallbackName;
  if (widen_for_fp32()) return std::string(kFallbackName) + ", " + kWidenedReason;
  return plan_cache().get(make_key(a, b, ldc, 1.0f, 0.0f, false))->impl;
}

std::string gemm_bf16_implementations_used() {
  std::string out;
  for (const auto& [impl, shapes] : plan_cache().implementations())
    out += (out.empty() ? "" : ", ") + impl + " (" + std::to_string(shapes) + (shapes == 1 ? " shape)" : " shapes)");
  if (const int64_t forced = g_forced_portable_products.load(std::memory_order_relaxed); forced > 0)
    out += (out.empty() ? "" : ", ") + std::string(kFallbackName) + ", portable forced (" + std::to_string(forced) +
           (forced == 1 ? " product)" : " products)");
  if (const int64_t widened = g_widened_products.load(std::memory_order_relaxed); widened > 0)
    out += (out.empty() ? "" : ", ") + std::string(kFallbackName) + ", " + kWidenedReason + " (" +
           std::to_string(widened) + (widened == 1 ? " product)" : " products)");
  const auto count = [&](const std::atomic<int64_t>& counter, const char* why) {
    if (const int64_t n = counter.load(std::memory_order_relaxed); n > 0)
      out += (out.empty() ? "" : ", ") + std::string(kFallbackName) + ", " + why + " (" + std::to_string(n) +
             (n == 1 ? " product)" : " products)");
  };
  count(g_converted_products, "no bf16 units for oneDNN here");
  count(g_given_widened_products, "operands given widened");
  return out.empty() ? "none yet" : out;
}

void gemm_bf16_reference(const MatrixRefBf16& a, const MatrixRefBf16& b, float* c, int64_t ldc, float alpha, float beta,
                         const float* bias) {
  check_operands(a, b, ldc);
  F32Buffer abuf, bbuf;
  if (bias) {
    bias_into(c, ldc, a.rows, b.cols, beta, bias);
    beta = 1.0f;
  }
  gemm_reference(to_f32(a, abuf), to_f32(b, bbuf), c, ldc, alpha, beta);
}

}  // namespace cabm
