// Bytes → what `cabm attention` does: one safetensors file (q, k, v, the optional tensors and
// metadata of docs/attention_file.md), parsed, then run_attention_file in fp32 and bf16
// (rotary, the attention kernel forward and, with dout, backward). An input is skipped before
// running when it holds more than kMaxElements elements in all, declares a size above
// kMaxElements on any axis, or asks for more than kMaxWork score-times-head-dim products
// (B·N·M·Hq·max(d, dv)), so that one input runs in milliseconds.
//
// Invariants: "out" [B, N, Hq, dv] and "lse" [B, Hq, N]; with dout, "dq", "dk", "dv" of the
// shapes of q, k, v and "dsinks" [Hq] exactly when sinks were given; nothing else; all F32.
// No NaN in out or lse when the input cannot overflow float arithmetic: every F32 tensor
// value finite (a float mask may hold −inf) and small enough that no score, bias or rotary
// angle can reach ±inf (see overflow_free). Overflow of huge finite inputs to ±inf, then
// inf − inf = NaN, is IEEE arithmetic, what PyTorch does too, not a finding.
#include "cabm/interop/attention_file.h"
#include "tests/fuzz/fuzz_util.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

namespace {

constexpr int64_t kMaxElements = 1 << 14;
constexpr double kMaxWork = 1 << 16;
// Scores, biases and mask values below this stay finite through the kernels' sums (softmax
// numerators are ≤ 1, so P·V and lse = m + log(l) cannot overflow either).
constexpr double kMaxScore = 1e30;
constexpr double kMaxPosition = 1099511627776.0;  // 2^40, what the parser allows

bool small_enough(const cabm::SafetensorsFile& in) {
  int64_t elements = 0;
  for (const auto& [name, t] : in.tensors) {
    for (const int64_t s : t.shape())
      if (s > kMaxElements) return false;  // a zero-element tensor may still declare huge sizes
    elements += t.numel();
  }
  if (elements > kMaxElements) return false;
  const cabm::Tensor *q = in.find("q"), *k = in.find("k"), *v = in.find("v");
  if (!q || !k || !v || q->dim() != 4 || k->dim() != 4 || v->dim() != 4) return true;  // refused before any work
  const double work =
      static_cast<double>(q->size(0)) * q->size(1) * k->size(1) * q->size(2) * std::max(q->size(3), v->size(3));
  return work <= kMaxWork;
}

// Largest |x| over an F32 tensor; NaN if it holds a NaN or +inf, or −inf where not allowed.
double max_abs(const cabm::Tensor& t, bool minus_inf_allowed) {
  double m = 0.0;
  const float* x = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (minus_inf_allowed && x[i] == -INFINITY) continue;
    if (!std::isfinite(x[i])) return NAN;
    m = std::max(m, static_cast<double>(std::fabs(x[i])));
  }
  return m;
}

double metadata_number(const cabm::SafetensorsFile& in, const std::string& key, double fallback) {
  const std::string* text = in.find_metadata(key);
  return text ? std::strtod(text->c_str(), nullptr) : fallback;  // the run accepted it: a finite number
}

// Whether no intermediate of an accepted input can overflow to ±inf: |scores| ≤ |scale|·d·
// max|q|·max|k| (rotary keeps each pair's norm: at most √2 per element), ALiBi biases ≤
// |slope|·2^41, float mask values, and rotary angles ≤ 2^40/θ (θ < 1) all below kMaxScore.
// The scale is the metadata's value as a double: the kernels' float must hold it.
bool overflow_free(const cabm::SafetensorsFile& in) {
  std::map<std::string, double> largest;
  for (const auto& [name, t] : in.tensors) {
    if (t.dtype() != cabm::DType::F32) continue;
    const double m = max_abs(t, name == "mask");
    if (!(m <= kMaxScore)) return false;  // NaN or too large
    largest[name] = m;
  }
  const cabm::Tensor& q = in.get("q");
  const double d = static_cast<double>(q.size(3));
  const double scale = std::fabs(metadata_number(in, "scale", 1.0 / std::sqrt(d)));
  if (2.0 * scale * d * largest["q"] * largest["k"] > kMaxScore) return false;
  if (largest["alibi_slopes"] * 2.0 * kMaxPosition > kMaxScore) return false;
  const std::string* rope = in.find_metadata("rope");
  if (rope && *rope != "none" && kMaxPosition / metadata_number(in, "rope_theta", 10000.0) > kMaxScore) return false;
  return true;
}

bool has_nan(const cabm::Tensor& t) {
  const float* x = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i)
    if (std::isnan(x[i])) return true;
  return false;
}

void expect(const std::map<std::string, cabm::Tensor>& out, const std::string& name, const cabm::Shape& shape) {
  const auto it = out.find(name);
  if (it == out.end()) cabm::fuzz::invariant_failed("run_attention_file left out an output (out, lse, dq, dk, dv)");
  if (!it->second.defined() || it->second.dtype() != cabm::DType::F32)
    cabm::fuzz::invariant_failed("an output is not F32");
  if (it->second.shape() != shape) cabm::fuzz::invariant_failed("an output has the wrong shape");
}

void attention_file(std::string_view bytes) {
  const cabm::SafetensorsFile in = cabm::parse_safetensors(bytes, "fuzz-attention.safetensors");
  if (!small_enough(in)) return;
  for (const cabm::Precision precision : {cabm::Precision::kFp32, cabm::Precision::kBf16}) {
    const std::map<std::string, cabm::Tensor> out = cabm::run_attention_file(in, precision);
    // Accepted: q, k, v are F32 [B, N, Hq, d], [B, M, Hkv, d], [B, M, Hkv, dv].
    const cabm::Tensor &q = in.get("q"), &k = in.get("k"), &v = in.get("v");
    const int64_t B = q.size(0), N = q.size(1), Hq = q.size(2), dv = v.size(3);
    expect(out, "out", {B, N, Hq, dv});
    expect(out, "lse", {B, Hq, N});
    size_t outputs = 2;
    if (in.find("dout")) {
      expect(out, "dq", q.shape());
      expect(out, "dk", k.shape());
      expect(out, "dv", v.shape());
      outputs += 3;
      if (in.find("sinks")) {
        expect(out, "dsinks", {Hq});
        ++outputs;
      }
    }
    if (out.size() != outputs) cabm::fuzz::invariant_failed("run_attention_file returned an unexpected output");
    if (overflow_free(in)) {
      if (has_nan(out.at("out"))) cabm::fuzz::invariant_failed("NaN in 'out' from an input that cannot overflow");
      if (has_nan(out.at("lse"))) cabm::fuzz::invariant_failed("NaN in 'lse' from an input that cannot overflow");
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return cabm::fuzz::run([&] { attention_file(cabm::fuzz::as_text(data, size)); });
}
