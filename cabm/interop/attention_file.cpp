#include "cabm/interop/attention_file.h"

#include "cabm/core/checked.h"
#include "cabm/kernels/attention/attention.h"
#include "cabm/kernels/bf16.h"
#include "cabm/kernels/rope.h"

#include <cmath>
#include <limits>
#include <set>

namespace cabm {
namespace {

const std::set<std::string> kTensors = {"q", "k", "v", "mask", "alibi_slopes", "sinks", "q_positions", "k_positions",
                                        "dout"};
// "format" is what safetensors' own writers may add ("pt", "np"); it says nothing about the math.
const std::set<std::string> kMetadata = {"scale",   "causal", "window_left", "window_right", "alibi",
                                         "softcap", "rope",   "rope_theta",  "rope_dim",     "format"};

struct Problem {
  int64_t B, N, M, Hq, Hkv, d, dv;
};

[[noreturn]] void fail(const SafetensorsFile& in, const std::string& what) {
  throw Error(fmt::format("{}: {}", in.path, what));
}

double metadata_real(const SafetensorsFile& in, const std::string& key, const RealRange& range, double fallback) {
  const std::string* text = in.find_metadata(key);
  if (!text) return fallback;
  return parse_real(*text, range, fmt::format("{}: metadata '{}'", in.path, key));
}

int64_t metadata_window(const SafetensorsFile& in, const std::string& key) {
  const std::string* text = in.find_metadata(key);
  if (!text) return Mask::kUnbounded;
  const int64_t value = parse_integer(*text, -1, Mask::kUnbounded - 1, fmt::format("{}: metadata '{}'", in.path, key));
  return value == -1 ? Mask::kUnbounded : value;
}

std::string metadata_choice(const SafetensorsFile& in, const std::string& key, const std::set<std::string>& values,
                            const std::string& fallback) {
  const std::string* text = in.find_metadata(key);
  if (!text) return fallback;
  if (!values.count(*text)) {
    std::string list;
    for (const std::string& v : values) list += (list.empty() ? "" : ", ") + v;
    fail(in, fmt::format("metadata '{}' is '{}', expected one of: {}", key, *text, list));
  }
  return *text;
}

std::vector<int64_t> positions(const SafetensorsFile& in, const std::string& name, int64_t length) {
  const Tensor* t = in.find(name);
  std::vector<int64_t> result;
  if (!t) return result;
  in.get(name, DType::I64, {length});
  const int64_t* p = t->data<int64_t>();
  for (int64_t i = 0; i < length; ++i) {
    // Positions feed |i − j| and float angles: keep them well inside what both represent.
    if (p[i] < -(int64_t{1} << 40) || p[i] > (int64_t{1} << 40))
      fail(in, fmt::format("tensor '{}' holds {} at {}, outside ±2^40", name, p[i], i));
    result.push_back(p[i]);
  }
  return result;
}

Tensor per_head(const SafetensorsFile& in, const std::string& name, int64_t Hq) {
  const Tensor* t = in.find(name);
  if (!t) return Tensor();
  in.get(name, DType::F32, {Hq});
  return *t;
}

Problem read_problem(const SafetensorsFile& in) {
  for (const auto& [name, tensor] : in.tensors)
    if (!kTensors.count(name))
      fail(in, fmt::format("unknown tensor '{}' (cabm attention reads q, k, v, mask, alibi_slopes, sinks, "
                           "q_positions, k_positions, dout)",
                           name));
  for (const auto& [key, value] : in.metadata)
    if (!kMetadata.count(key))
      fail(in, fmt::format("unknown metadata key '{}' (cabm attention reads scale, causal, window_left, "
                           "window_right, alibi, softcap, rope, rope_theta, rope_dim)",
                           key));
  const Tensor& q = in.get("q", DType::F32, {-1, -1, -1, -1});
  const Tensor& k = in.get("k", DType::F32, {-1, -1, -1, -1});
  const Tensor& v = in.get("v", DType::F32, {-1, -1, -1, -1});
  Problem p{q.size(0), q.size(1), k.size(1), q.size(2), k.size(2), q.size(3), v.size(3)};
  for (int64_t n : {p.B, p.N, p.M, p.Hq, p.Hkv, p.d, p.dv})
    if (n < 1) fail(in, "q, k and v must have no empty axis");
  if (k.size(0) != p.B || k.size(3) != p.d)
    fail(in, fmt::format("tensor 'k' has shape {}, expected [{}, M, Hkv, {}] (q is {})", shape_str(k.shape()), p.B,
                         p.d, shape_str(q.shape())));
  if (v.size(0) != p.B || v.size(1) != p.M || v.size(2) != p.Hkv)
    fail(in, fmt::format("tensor 'v' has shape {}, expected [{}, {}, {}, dv] (k is {})", shape_str(v.shape()), p.B,
                         p.M, p.Hkv, shape_str(k.shape())));
  if (p.Hq % p.Hkv != 0)
    fail(in, fmt::format("q has {} heads and k, v have {}: Hq must be a multiple of Hkv", p.Hq, p.Hkv));
  if (in.find("dout")) in.get("dout", DType::F32, {p.B, p.N, p.Hq, p.dv});
  return p;
}

Mask read_mask(const SafetensorsFile& in, const Problem& p) {
  Mask mask;
  const std::string causal = metadata_choice(in, "causal", {"none", "top_left", "bottom_right"}, "none");
  if (causal == "top_left") mask = mask & Mask::causal(CausalAlign::kTopLeft);
  if (causal == "bottom_right") mask = mask & Mask::causal(CausalAlign::kBottomRight);
  const int64_t left = metadata_window(in, "window_left"), right = metadata_window(in, "window_right");
  if (left != Mask::kUnbounded || right != Mask::kUnbounded) mask = mask & Mask::sliding_window(left, right);
  if (const Tensor* t = in.find("mask")) {
    if (t->dtype() != DType::BOOL && t->dtype() != DType::F32)
      fail(in, fmt::format("tensor 'mask' is {}, expected BOOL (true = may attend) or F32 (added to the scores)",
                           dtype_name(t->dtype())));
    if (t->dim() > 4) fail(in, fmt::format("tensor 'mask' has rank {}, expected at most 4", t->dim()));
    const Mask part = t->dtype() == DType::BOOL ? Mask::allow(*t) : Mask::additive(*t);
    try {
      part.validate(p.B, p.Hq, p.N, p.M);
    } catch (const Error& e) {
      fail(in, fmt::format("tensor 'mask' {} does not broadcast to [B, Hq, N, M] = [{}, {}, {}, {}] ({})",
                           shape_str(t->shape()), p.B, p.Hq, p.N, p.M, e.what()));
    }
    mask = mask & part;
  }
  return mask;
}

AttentionOptions read_options(const SafetensorsFile& in, const Problem& p) {
  AttentionOptions options;
  options.mask = read_mask(in, p);
  // Ranges in float: the kernels take floats, and a double beyond them would round to ±inf
  // (scale) or to 0 (softcap, which then means "off").
  if (in.find_metadata("scale")) options.scale = static_cast<float>(metadata_real(in, "scale", {-3.0e38, 3.0e38}, 0.0));
  options.softcap = static_cast<float>(metadata_real(in, "softcap", {std::numeric_limits<float>::min(), 3.0e38}, 0.0));
  const bool paper_alibi = metadata_choice(in, "alibi", {"true", "false"}, "false") == "true";
  if (const Tensor* slopes = in.find("alibi_slopes")) {
    if (paper_alibi) fail(in, "metadata alibi=true and tensor 'alibi_slopes' both give the slopes: keep one");
    in.get("alibi_slopes", DType::F32, {p.Hq});
    options.alibi_slopes.assign(slopes->data<float>(), slopes->data<float>() + p.Hq);
    for (float s : options.alibi_slopes)
      if (!std::isfinite(s)) fail(in, "tensor 'alibi_slopes' must be finite");
  } else if (paper_alibi) {
    options.alibi_slopes = alibi_paper_slopes(p.Hq);
  }
  options.q_positions = positions(in, "q_positions", p.N);
  options.k_positions = positions(in, "k_positions", p.M);
  options.sinks = per_head(in, "sinks", p.Hq);
  if (options.sinks.defined()) {
    for (int64_t h = 0; h < p.Hq; ++h)
      if (!std::isfinite(options.sinks.data<float>()[h])) fail(in, "tensor 'sinks' must be finite");
  }
  return options;
}

RopeOptions read_rope(const SafetensorsFile& in, const Problem& p) {
  RopeOptions rope;
  rope.style = parse_rope_style(metadata_choice(in, "rope", {"none", "neox", "gptj"}, "none"));
  rope.theta = static_cast<float>(metadata_real(in, "rope_theta", {0.0, 3.0e38, true, false}, 10000.0));
  if (const std::string* text = in.find_metadata("rope_dim"))
    rope.rope_dim = parse_integer(*text, 2, p.d, fmt::format("{}: metadata 'rope_dim'", in.path));
  if (rope.style != RopeStyle::kNone || in.find_metadata("rope_dim")) {  // an odd rope_dim is wrong either way
    try {
      rope_resolved_dim(rope, p.d);
    } catch (const Error& e) {
      fail(in, fmt::format("metadata 'rope_dim' / 'rope_theta' for head dim {}: {}", p.d, e.what()));
    }
  }
  return rope;
}

// Positions for rotary: the file's, or the defaults of attention/reference.h (keys 0…M−1,
// queries M−N…M−1).
std::vector<int64_t> or_default(const std::vector<int64_t>& given, int64_t length, int64_t first) {
  if (!given.empty()) return given;
  std::vector<int64_t> result(static_cast<size_t>(length));
  for (int64_t i = 0; i < length; ++i) result[i] = first + i;
  return result;
}

}  // namespace

std::map<std::string, Tensor> run_attention_file(const SafetensorsFile& in, Precision precision) {
  const Problem p = read_problem(in);
  const AttentionOptions options = read_options(in, p);
  const RopeOptions rope = read_rope(in, p);

  Tensor q = in.get("q").clone(), k = in.get("k").clone();
  const Tensor& v = in.get("v");
  const std::vector<int64_t> q_pos = or_default(options.q_positions, p.N, p.M - p.N);
  const std::vector<int64_t> k_pos = or_default(options.k_positions, p.M, 0);
  rope_forward(q, q_pos, rope);
  rope_forward(k, k_pos, rope);

  const bool bf16 = precision == Precision::kBf16;
  const Tensor qa = bf16 ? rounded_to_bf16(q) : q, ka = bf16 ? rounded_to_bf16(k) : k, va = bf16 ? rounded_to_bf16(v) : v;
  std::map<std::string, Tensor> result;
  Tensor out = Tensor::empty({p.B, p.N, p.Hq, p.dv}), lse = Tensor::empty({p.B, p.Hq, p.N});
  attention_forward(qa, ka, va, options, out, &lse);
  result["out"] = out;
  result["lse"] = lse;
  if (const Tensor* dout = in.find("dout")) {
    AttentionGrads grads{Tensor::empty(q.shape()), Tensor::empty(k.shape()), Tensor::empty(v.shape())};
    if (options.sinks.defined()) grads.dsinks = Tensor::empty({p.Hq});
    attention_backward({qa, ka, va, out, lse}, *dout, options, grads);
    rope_backward(grads.dq, q_pos, rope);
    rope_backward(grads.dk, k_pos, rope);
    result["dq"] = grads.dq;
    result["dk"] = grads.dk;
    result["dv"] = grads.dv;
    if (options.sinks.defined()) result["dsinks"] = grads.dsinks;
  }
  return result;
}

}  // namespace cabm
