// The helpers of util/flash_bf16_cases.h.
#include "util/flash_bf16_cases.h"

#include "cabm/kernels/attention/flash_amx.h"
#include "cabm/kernels/attention/flash_bf16.h"
#include "cabm/kernels/attention/reference.h"

#include <algorithm>
#include <string>

namespace cabm::test::flash_bf16 {

Heads make_heads(int64_t B, int64_t L, int64_t H, int64_t d, uint64_t seed, bool strided, float range) {
  const Shape shape = head_buffer_shape(B, L, H, d, strided);
  Tensor x = random_tensor(shape, seed, -range, range);
  Tensor xb = Tensor::empty(shape, DType::BF16);
  float_to_bf16(x.data<float>(), xb.data<bf16>(), x.numel());
  bf16_to_float(xb.data<bf16>(), x.data<float>(), x.numel());
  return {head_view(xb, d, strided), head_view(x, d, strided)};
}

Inputs make_inputs(const Dims& s, uint64_t seed, bool strided, float qk_range) {
  Tensor g = strided ? random_tensor({s.B, s.N, s.H, s.dv + 2}, seed + 3).narrow(3, 1, s.dv)
                     : random_tensor({s.B, s.N, s.H, s.dv}, seed + 3);
  return {s, make_heads(s.B, s.N, s.H, s.d, seed, strided, qk_range),
          make_heads(s.B, s.M, s.H, s.d, seed + 1, strided, qk_range),
          make_heads(s.B, s.M, s.H, s.dv, seed + 2, strided), g};
}

std::vector<MaskCase> mask_cases() {
  std::vector<MaskCase> cases =
      pick(tile_mask_cases(),
           {"none", "causal", "causal_top_left", "key_padding", "sliding_window", "block_sparse_odd", "allow_nm",
            "additive_hnm", "additive_transposed", "allow_key_broadcast", "window_padding_tensors"});
  cases.push_back({"causal_and_padding", [](const Dims& s) {
                     return Mask::causal() & Mask::key_padding({s.M, s.M / 2 + 1});
                   }});
  cases.push_back({"window_block_allow_additive", [](const Dims& s) {
                     return Mask::sliding_window(30, 10) & Mask::block_sparse(random_layout(s, 8, 8, 27, 0.7f)) &
                            Mask::allow(random_bool({s.B, 1, s.N, s.M}, 28, 0.8f)) &
                            Mask::additive(random_tensor({s.N, s.M}, 29, -1.0f, 1.0f));
                   }});
  return cases;
}

ScopedPath::ScopedPath(const PathSetting& setting) : isa(setting.isa) {
  detail::set_amx_emulation(setting.emulated_amx);
  set_bf16_products_override(setting.products);
}
ScopedPath::~ScopedPath() {
  detail::set_amx_emulation(false);
  set_bf16_products_override(Bf16Products::kAuto);
}

namespace {
// The settings of forward_paths / backward_paths; `name` picks the forward's or the backward's
// path names, and a setting that reaches a path already listed is left out.
std::vector<PathSetting> paths(const char* (*name)()) {
  std::vector<PathSetting> out;
  std::vector<std::string> seen;
  std::vector<PathSetting> candidates{{Bf16Isa::kPortable}, {Bf16Isa::kAuto}};
  if (cpu_has_avx512_bf16()) {
    candidates.push_back({Bf16Isa::kAvx512Bf16});
    candidates.push_back({Bf16Isa::kAvx512Bf16, true});
    candidates.push_back({Bf16Isa::kAvx512Bf16, false, Bf16Products::kFp32});
  }
  for (const PathSetting& setting : candidates) {
    ScopedPath scoped(setting);
    if (std::find(seen.begin(), seen.end(), name()) != seen.end()) continue;
    seen.emplace_back(name());
    out.push_back(setting);
  }
  return out;
}
}  // namespace

std::vector<PathSetting> forward_paths() {
  return paths(&attention_flash_bf16_path);
}
std::vector<PathSetting> backward_paths() {
  return paths(&attention_flash_bf16_backward_path);
}

Outcome run_reference(const Inputs& in, const AttentionOptions& options, bool backward) {
  return test::run_reference(in.q.f32, in.k.f32, in.v.f32, in.g, options, backward);
}

void run_backward(const Inputs& in, const Outcome& saved, const AttentionOptions& options, const FlashConfig& config,
                  Outcome& r) {
  r.grads = strided_grads(in.s);
  attention_flash_bf16_backward({in.q.bf, in.k.bf, in.v.bf, saved.out, saved.lse}, in.g, options, r.grads, config);
}

Outcome run_bf16(const Inputs& in, const AttentionOptions& options, const FlashConfig& config, bool backward) {
  Outcome r = strided_outputs(in.s);
  attention_flash_bf16_forward(in.q.bf, in.k.bf, in.v.bf, options, r.out, &r.lse, config);
  if (backward) run_backward(in, r, options, config, r);
  return r;
}

Outcome portable_on_tiles_of(const PathSetting& setting, const Inputs& in, const AttentionOptions& options,
                             const FlashConfig& config, bool backward, const Outcome& portable) {
  const auto tiles_on = [&](const PathSetting& on) {
    ScopedPath scoped(on);
    return attention_flash_bf16_forward_tiles(in.q.bf, options, config);
  };
  const FlashConfig tiles = tiles_on(setting), portable_tiles = tiles_on({Bf16Isa::kPortable});
  if (tiles.block_q == portable_tiles.block_q && tiles.block_k == portable_tiles.block_k) return portable;
  ScopedPath scoped({Bf16Isa::kPortable});
  Outcome r = strided_outputs(in.s);
  attention_flash_bf16_forward(in.q.bf, in.k.bf, in.v.bf, options, r.out, &r.lse, tiles);
  if (backward) run_backward(in, r, options, config, r);
  return r;
}

WeightStats weight_stats(const Inputs& in, const AttentionOptions& options) {
  const Dims& s = in.s;
  WeightStats w;
  for (bool dropped : {true, false}) {
    AttentionOptions o = options;
    if (!dropped) o.dropout = 0.0f;
    Tensor out = Tensor::zeros({s.B, s.N, s.H, s.dv}), weights = Tensor::zeros({s.B, s.H, s.N, s.M});
    attention_reference_forward(in.q.f32, in.k.f32, in.v.f32, o, out, &weights);
    const float* a = weights.data<float>();
    double max_weight = 0, max_col = 0;
    for (int64_t bh = 0; bh < s.B * s.H; ++bh)
      for (int64_t j = 0; j < s.M; ++j) {
        double col = 0;
        for (int64_t i = 0; i < s.N; ++i) {
          const double x = a[(bh * s.N + i) * s.M + j];
          col += x;
          max_weight = std::max(max_weight, x);
        }
        max_col = std::max(max_col, col);
      }
    (dropped ? w.max_a : w.max_p) = max_weight;
    (dropped ? w.col_a : w.col_p) = max_col;
  }
  return w;
}

}  // namespace cabm::test::flash_bf16
