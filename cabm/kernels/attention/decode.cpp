#include "cabm/kernels/attention/decode.h"

#include "cabm/kernels/attention/decode_item.h"
#include "cabm/kernels/cpu_isa.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <vector>

namespace cabm {

KeyRange decode_allowed_keys(const Mask& mask, int64_t b, int64_t i, int64_t N, int64_t M) {
  int64_t begin = 0, end = M;
  const int64_t p = i + M - N;  // bottom-right position of query i
  if (mask.causal_align() == CausalAlign::kBottomRight) end = std::min(end, p + 1);
  if (mask.causal_align() == CausalAlign::kTopLeft) end = std::min(end, i + 1);
  if (mask.window_left() != Mask::kUnbounded) begin = std::max(begin, p - mask.window_left());
  if (mask.window_right() != Mask::kUnbounded) end = std::min(end, p + mask.window_right() + 1);
  if (!mask.key_lengths().empty()) end = std::min(end, mask.key_lengths()[b]);
  return {std::max<int64_t>(begin, 0), std::max(end, begin)};
}

namespace {

constexpr int64_t kDefaultChunk = 512;

// The work items prefetch the next block's rows (attention/decode_body.h) when the call's K and V
// are more than 16 L2 caches' worth, so that they stream from L3 or memory. Below, the rows are
// near already and the prefetches only cost. Zen 4 (1 MiB L2, 32 MiB L3), `cabm bench decode`
// with them at every size: 8 MiB (M 1,024, d 128, fp32) 15% slower; 16 MiB within noise; 32 MiB
// and more: bf16 caches 1.5–1.8× faster at d 64, 1.1× at d 128, fp32 1.0–1.15×. Prefetching all
// heads' rows at the start of a block gained half as much, into L1 lost 10–40%. (The OS's L3 size
// is no guide: this VM reports 320 MiB.)
std::atomic<int> g_prefetch_override{-1};  // set_decode_prefetch

bool prefetch_wanted(const DecodeShape& s, DType dtype) {
  const int forced = g_prefetch_override.load(std::memory_order_relaxed);
  if (forced >= 0) return forced == 1;
  return s.B * s.M * s.Hkv * (s.d + s.dv) * static_cast<int64_t>(dtype_size(dtype)) > 16 * cpu_l2_bytes();
}

using RunItem = void (*)(const DecodeWork&, int64_t, int64_t, int64_t, const DecodePartial*, float*);

RunItem run_item_for(SimdIsa isa) {
  switch (isa) {
    case SimdIsa::kAvx512:
      return decode_avx512::run_item;
    case SimdIsa::kAvx2:
      return decode_avx2::run_item;
    case SimdIsa::kPortable:
      break;
  }
  return decode_portable::run_item;
}

}  // namespace

void set_decode_prefetch(int mode) {
  CABM_CHECK(mode >= -1 && mode <= 1, "set_decode_prefetch: mode {} is not -1, 0 or 1", mode);
  g_prefetch_override.store(mode, std::memory_order_relaxed);
}

const char* attention_decode_isa() {
  return simd_isa_name(simd_isa());
}

bool attention_decode_supports(const Tensor& q, const Tensor& k, const AttentionOptions& options) {
  if (q.dim() != 4 || k.dim() != 4 || q.size(1) > kDecodeMaxQueryRows) return false;
  // Malformed shapes go to the other kernels, whose checks name the problem.
  if (k.size(2) < 1 || q.size(2) % k.size(2) != 0 || q.size(0) != k.size(0) || q.size(3) != k.size(3)) return false;
  if (options.dropout > 0.0f) return false;
  const Mask& mask = options.mask;
  return mask.block_layouts().empty() && mask.allowed().empty() && mask.biases().empty();
}

void attention_decode_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options,
                              const Tensor& out, const Tensor* lse, int64_t chunk) {
  CABM_CHECK(attention_decode_supports(q, k, options), "attention_decode_forward: unsupported operands or options");
  CABM_CHECK(q.dtype() == k.dtype() && q.dtype() == v.dtype() && (q.dtype() == DType::F32 || q.dtype() == DType::BF16),
             "attention_decode_forward: q, k, v must all be F32 or all BF16");
  for (const Tensor* t : {&q, &k, &v}) CABM_CHECK(t->stride(3) == 1, "attention_decode_forward: unit last stride");
  CABM_CHECK(out.dtype() == DType::F32 && out.dim() == 4 && out.stride(3) == 1, "attention_decode_forward: out F32");
  DecodeShape s{q.size(0), q.size(1), q.size(2), q.size(3), k.size(1), k.size(2), v.size(3), 0, 0};
  CABM_CHECK(s.Hkv >= 1 && s.H % s.Hkv == 0 && k.size(0) == s.B && k.size(3) == s.d && v.size(0) == s.B &&
                 v.size(1) == s.M && v.size(2) == s.Hkv && out.shape() == (Shape{s.B, s.N, s.H, s.dv}),
             "attention_decode_forward: q {}, k {}, v {}, out {} do not match", shape_str(q.shape()),
             shape_str(k.shape()), shape_str(v.shape()), shape_str(out.shape()));
  if (lse) CABM_CHECK(lse->shape() == (Shape{s.B, s.H, s.N}) && lse->is_contiguous(), "lse must be [B, H, N]");
  check_attention_variants(options, s.H, s.N, s.M);
  options.mask.validate(s.B, s.H, s.N, s.M);
  s.group = s.H / s.Hkv;
  s.rows = s.group * s.N;
  if (chunk <= 0) chunk = kDefaultChunk;
  const int64_t chunks = std::max<int64_t>(1, (s.M + chunk - 1) / chunk), R = s.rows;
  const int64_t items = s.B * chunks;  // each: one batch item's key chunk, every key/value head
  // Partial states of every work item; one allocation per call (small: items · R · (dv + 2)).
  const size_t states = static_cast<size_t>(s.B * s.Hkv * chunks * R);
  std::vector<float> m(states), l(states), acc(states * static_cast<size_t>(s.dv));
  const DecodeWork work{q, k, v, options, s, attention_scale(options, s.d), prefetch_wanted(s, k.dtype())};
  const RunItem run_item = run_item_for(simd_isa());
  const int64_t scratch_floats = decode_scratch_floats(s);
#pragma omp parallel
  {
    std::vector<float> scratch(static_cast<size_t>(scratch_floats));
    std::vector<DecodePartial> parts(static_cast<size_t>(s.Hkv));
#pragma omp for schedule(dynamic, 1)
    for (int64_t n = 0; n < items; ++n) {
      const int64_t b = n / chunks, c = n % chunks;
      for (int64_t hk = 0; hk < s.Hkv; ++hk) {
        const int64_t state = (b * s.Hkv + hk) * chunks + c;  // the merge's layout
        parts[hk] = {m.data() + state * R, l.data() + state * R, acc.data() + state * R * s.dv};
      }
      run_item(work, b, c * chunk, std::min(s.M, (c + 1) * chunk), parts.data(), scratch.data());
    }
  }
  // Merge the chunks of each row in chunk order (deterministic for any thread count).
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t hk = 0; hk < s.Hkv; ++hk) {
      const int64_t first = (b * s.Hkv + hk) * chunks;
      for (int64_t r = 0; r < R; ++r) {
        const int64_t h = hk * s.group + r / s.N, i = r % s.N;
        float mm = -INFINITY;
        for (int64_t c = 0; c < chunks; ++c) mm = std::max(mm, m[(first + c) * R + r]);
        float* o = out.data<float>() + b * out.stride(0) + i * out.stride(1) + h * out.stride(2);
        std::fill_n(o, s.dv, 0.0f);
        float total = 0.0f;
        if (mm != -INFINITY) {
          for (int64_t c = 0; c < chunks; ++c) {
            const float mc = m[(first + c) * R + r];
            if (mc == -INFINITY) continue;
            const float w = std::exp(mc - mm);
            total += l[(first + c) * R + r] * w;
            const float* a = acc.data() + ((first + c) * R + r) * s.dv;
            for (int64_t e = 0; e < s.dv; ++e) o[e] += a[e] * w;
          }
          const float inv = 1.0f / total;
          for (int64_t e = 0; e < s.dv; ++e) o[e] *= inv;
        }
        if (lse) lse->data<float>()[(b * s.H + h) * s.N + i] = mm == -INFINITY ? -INFINITY : mm + std::log(total);
      }
    }
  }
}

}  // namespace cabm
