#include "cabm/kernels/gemm_route.h"

#include "cabm/core/error.h"
#include "cabm/kernels/machine_wisdom.h"
#include "cabm/kernels/openblas_core.h"

#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>

namespace cabm {

namespace {

std::optional<GemmLibrary> pinned_from_env() {
  const char* value = std::getenv("CABM_GEMM");
  if (value == nullptr || std::string(value).empty() || std::string(value) == "auto") return std::nullopt;
  const std::string v = value;
  if (v == "onednn") return GemmLibrary::kOneDnn;
  if (v == "openblas") return GemmLibrary::kOpenBlas;
  throw Error(fmt::format("CABM_GEMM is '{}', expected onednn, openblas or auto", v));
}

std::optional<GemmLibrary> parse_library(const std::string& name) {
  if (name == "oneDNN") return GemmLibrary::kOneDnn;
  if (name == "OpenBLAS") return GemmLibrary::kOpenBlas;
  return std::nullopt;
}

class Router {
 public:
  GemmLibrary route(const GemmShape& shape, const GemmTrial& trial) {
    const std::lock_guard<std::mutex> lock(mutex_);
    init();
    if (pin_) return *pin_;
    const std::string key = shape.key();
    if (auto it = decisions_.find(key); it != decisions_.end()) return it->second.library;
    // Another process may have decided since this one last read the file.
    if (auto found = read_wisdom(key)) return remember(*found);
    const TrialTimes t = time_trial(trial);
    ++trials_;
    const bool openblas = t.openblas < kGemmRouteOpenBlasMargin * t.onednn &&
                          t.openblas_round_wins >= kGemmRouteOpenBlasRoundWins;
    GemmRouteDecision d{key, openblas ? GemmLibrary::kOpenBlas : GemmLibrary::kOneDnn, t.onednn, t.openblas, false,
                        t.openblas_round_wins};
    append_wisdom(d);
    // Two processes that decided at once keep whichever line reached the file first.
    if (auto first = read_wisdom(key); first && first->library != d.library) d.library = first->library;
    return remember(d);
  }

  std::vector<GemmRouteDecision> decisions() {
    const std::lock_guard<std::mutex> lock(mutex_);
    std::vector<GemmRouteDecision> out;
    for (const auto& [key, d] : decisions_) out.push_back(d);
    return out;
  }
  std::optional<GemmLibrary> pin() {
    const std::lock_guard<std::mutex> lock(mutex_);
    init();
    return pin_;
  }
  // The pin without the lock, for the untimed small products (one per gemm() call on the
  // training step's hot path): mirrored in an atomic whenever it changes.
  std::optional<GemmLibrary> pin_fast() {
    const int code = pin_code_.load(std::memory_order_acquire);
    if (code == kPinUnknown) return pin();
    if (code == kPinNone) return std::nullopt;
    return static_cast<GemmLibrary>(code);
  }
  int64_t trials() {
    const std::lock_guard<std::mutex> lock(mutex_);
    return trials_;
  }
  void set_pin(std::optional<GemmLibrary> pin) {
    const std::lock_guard<std::mutex> lock(mutex_);
    init();
    pin_ = pin;
    publish_pin();
  }
  void reset(const std::optional<std::string>& wisdom) {
    const std::lock_guard<std::mutex> lock(mutex_);
    init();
    decisions_.clear();
    trials_ = 0;
    if (wisdom) wisdom::reset(*wisdom);
  }

 private:
  void init() {
    if (initialised_) return;
    pin_ = pinned_from_env();
    publish_pin();
    initialised_ = true;
  }

  struct TrialTimes {
    double onednn, openblas;  // best of the rounds
    int openblas_round_wins;  // rounds in which OpenBLAS beat oneDNN by the margin
  };
  static TrialTimes time_trial(const GemmTrial& trial) {
    double best[2] = {1e30, 1e30};
    int wins = 0;
    const GemmLibrary libraries[2] = {GemmLibrary::kOneDnn, GemmLibrary::kOpenBlas};
    for (int round = 0; round < kGemmRouteRounds; ++round) {
      double t[2];
      for (int n = 0; n < 2; ++n) {
        const int lib = (round + n) % 2;
        trial(libraries[lib]);  // warm-up
        t[lib] = trial(libraries[lib]);
        best[lib] = std::min(best[lib], t[lib]);
      }
      // The two timed calls of a round are adjacent in time: comparing them cancels slow drifts
      // of the machine's load, and a vote over rounds outweighs one call that another process
      // slowed down (which best times alone would take at face value).
      if (t[1] < kGemmRouteOpenBlasMargin * t[0]) ++wins;
    }
    return {best[0], best[1], wins};
  }

  GemmLibrary remember(const GemmRouteDecision& d) {
    decisions_[d.key] = d;
    return d.library;
  }

  // The first usable line of this machine for `key`: machine, key, library, the two times.
  static std::optional<GemmRouteDecision> read_wisdom(const std::string& key) {
    const auto known = [](const std::vector<std::string>& f) { return parse_library(f[0]).has_value(); };
    if (const auto fields = wisdom::first(key, 3, known))
      return GemmRouteDecision{key, *parse_library((*fields)[0]), 0, 0, true};
    return std::nullopt;
  }
  static void append_wisdom(const GemmRouteDecision& d) {
    wisdom::append(d.key, {gemm_library_name(d.library), fmt::format("{:.6g}", d.onednn_seconds),
                           fmt::format("{:.6g}", d.openblas_seconds)});
  }

  std::mutex mutex_;
  bool initialised_ = false;
  void publish_pin() { pin_code_.store(pin_ ? static_cast<int>(*pin_) : kPinNone, std::memory_order_release); }

  static constexpr int kPinUnknown = -2, kPinNone = -1;
  std::optional<GemmLibrary> pin_;
  std::atomic<int> pin_code_{kPinUnknown};
  std::map<std::string, GemmRouteDecision> decisions_;
  int64_t trials_ = 0;
};

Router& router() {
  static Router r;
  return r;
}

}  // namespace

std::string gemm_library_name(GemmLibrary library) {
  return library == GemmLibrary::kOneDnn ? "oneDNN" : "OpenBLAS";
}

namespace {
int64_t size_class(int64_t n) {
  int64_t c = 1;
  while (c < n) c *= 2;
  return c;
}
}  // namespace

// One decision serves a class of shapes: the transposes, M, N and K each rounded up to a power of
// two, the three leading dimensions exactly, and the thread count. Inference meets a new row count
// with nearly every batch (texts × their length); timing each one cost more than it saved (cabm
// embed, 1,000 texts of 8-128 tokens, MiniLM-L6, a 2-core Xeon: 65 s with a decision per exact
// shape, 27 s pinned to oneDNN), so the row count is only a size class. The leading dimensions
// are the weights' widths in every product cabm runs (x·Wᵀ, dY·W, dYᵀ·X), fixed for a model, and
// they matter more than size: oneDNN's Aᵀ·B runs at 63-79 GFLOP/s when A's leading dimension is
// 1024 or 2048 and at 111-128 when it is 768, 1000 or 1056, while OpenBLAS stays at 120-145 on all
// of them (AMD EPYC Zen 3, session 11, bench_gemm_libraries 4096 256 F): one decision per power
// of two sent 1024 the way 768 had gone, at 0.5× the faster library.
std::string GemmShape::key() const {
  return fmt::format("{}{} M~{} N~{} K~{} ld {} {} {} t{}", ta ? 'T' : 'N', tb ? 'T' : 'N', size_class(M),
                     size_class(N), size_class(K), lda, ldb, ldc, threads);
}

GemmLibrary gemm_route(const GemmShape& shape, const GemmTrial& trial) {
  if (shape.M * shape.N * shape.K < kGemmRouteMinMacs) {
    if (const auto pin = router().pin_fast()) return *pin;
    return GemmLibrary::kOneDnn;
  }
  return router().route(shape, trial);
}

std::vector<GemmRouteDecision> gemm_route_decisions() { return router().decisions(); }

std::string gemm_route_summary() {
  // Which OpenBLAS kernels the OpenBLAS times came from (kernels/openblas_core.h).
  const std::string kernels = "; OpenBLAS runs its " + openblas_core() + " kernels";
  if (const auto pin = router().pin())
    return "gemm routes: every product on " + gemm_library_name(*pin) + " (pinned)" + kernels;
  const auto decisions = gemm_route_decisions();
  if (decisions.empty()) return "gemm routes: every product on oneDNN (none large enough to time)" + kernels;
  int64_t timed = 0;
  std::string list;
  for (const auto& d : decisions) {
    timed += d.from_wisdom ? 0 : 1;
    list += fmt::format("{}{} -> {}", list.empty() ? "" : "; ", d.key, gemm_library_name(d.library));
    if (!d.from_wisdom) list += fmt::format(" ({:.3g} vs {:.3g} ms)", d.onednn_seconds * 1e3, d.openblas_seconds * 1e3);
  }
  return fmt::format("gemm routes ({} timed here, {} from {}; oneDNN vs OpenBLAS): {}{}", timed,
                     static_cast<int64_t>(decisions.size()) - timed, wisdom::path(), list, kernels);
}

void set_gemm_library_override(std::optional<GemmLibrary> library) { router().set_pin(library); }
void reset_gemm_routes(const std::optional<std::string>& wisdom) { router().reset(wisdom); }
int64_t gemm_route_trials() { return router().trials(); }

}  // namespace cabm
