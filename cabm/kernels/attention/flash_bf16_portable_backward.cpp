// The portable path of attention_flash_bf16_backward, written to be read: FlashAttention-2's
// backward (Dao 2023, Algorithm 2) in scalar fp32 on the head widened to fp32 (exact), one element
// (query i, key j) at a time. With s the scores in
// base 2 (soft-capped and with ALiBi as in the forward), z the dropout factor (keep/(1 − p) or 0,
// 1 without dropout), g_ij = 1 − tanh²(t_ij/c) the soft-cap's derivative (1 without it) and
// bf16(·) the rounding to the nearest bf16 value (the derivation is in attention/reference.cpp):
//
//   P_ij  = exp2(s_ij − lse2_i)               fp32, from the forward's lse (no second softmax pass),
//                                             by the forward's polynomial (exp2_weight)
//   dV_j += bf16(P_ij z_ij) · bf16(dO_i)
//   dP_ij = z_ij · bf16(dO_i) · v_j
//   dT_ij = P_ij (dP_ij − D_i) g_ij,   D_i = dO_i · O_i in fp32
//   dQ_i += scale · bf16(dT_ij) k_j,    dK_j += scale · bf16(dT_ij) q_i
//
// One work item is a key/value head (b, hk) with its query heads h in order (GQA: dK and dV sum
// over them); per query head, key tiles in order, query tiles in order within each, tiles skipped
// where the mask blocks them entirely. Every gradient element has one writer and a fixed order of
// sums: the result is bitwise the same for any thread count.
#include "cabm/kernels/attention/flash_bf16_backward.h"

#include "cabm/kernels/attention/bf16_packing.h"
#include "cabm/kernels/attention/bf16_variants.h"
#include "cabm/kernels/attention/tile_mask.h"
#include "cabm/kernels/bf16.h"
#include "cabm/kernels/exp2_poly.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <vector>

namespace cabm::detail {

void backward_row_terms(const AttentionSaved& saved, const Tensor& dout, int64_t b, int64_t h, int64_t i0, int64_t i1,
                        float* delta, float* lse2) {
  constexpr float kLog2e = 1.4426950408889634f;
  const Tensor& o = saved.out;
  const int64_t N = o.size(1), H = o.size(2), dv = o.size(3);
  const float* lse = saved.lse.data<float>() + (b * H + h) * N;
  const HeadRows g_rows = head_rows(dout, b, h), o_rows = head_rows(o, b, h);
  constexpr int kParts = 8;  // partial sums over the columns c ≡ k (mod 8): a dot the compiler vectorizes
  for (int64_t i = i0; i < i1; ++i) {
    const float *gi = g_rows.row(i), *oi = o_rows.row(i);
    float part[kParts] = {};
    int64_t c = 0;
    for (; c + kParts <= dv; c += kParts)
      for (int k = 0; k < kParts; ++k) part[k] += gi[c + k] * oi[c + k];
    for (int k = 0; c < dv; ++c, ++k) part[k] += gi[c] * oi[c];
    delta[i - i0] = ((part[0] + part[4]) + (part[2] + part[6])) + ((part[1] + part[5]) + (part[3] + part[7]));
    lse2[i - i0] = lse[i] == -INFINITY ? INFINITY : lse[i] * kLog2e;
  }
}

namespace {

constexpr float kLog2e = 1.4426950408889634f;

float round_bf16(float x) {
  return bf16_to_float(float_to_bf16(x));
}

struct BackwardProblem {
  int64_t B, N, H, Hkv, M, d, dv;
  int64_t block_q, block_k;
  float scale, keep_scale;
  bool dropout;
};

struct BackwardArgs {
  const AttentionSaved& saved;
  const Tensor& dout;
  const AttentionGrads& grads;
  const AttentionOptions& options;
  const TileMask& mask;
  const ScoreVariants& variants;
  const BackwardProblem& p;
};

// Per-thread buffers: the heads widened to fp32 ([N][d], [M][d], [M][dv], dO as bf16 values
// [N][dv]), lse2 and D per query row, the dq accumulator [N][d], the key/value head's dk and dv
// accumulators [M][d], [M][dv], one mask tile, dropout factors and key positions of a tile.
struct BackwardBuffers {
  std::vector<float> q, k, v, g, lse2, delta, dq, dk, dv, mask, z;
  std::vector<int64_t> kpos;
  explicit BackwardBuffers(const BackwardProblem& p)
      : q(static_cast<size_t>(p.N * p.d)),
        k(static_cast<size_t>(p.M * p.d)),
        v(static_cast<size_t>(p.M * p.dv)),
        g(static_cast<size_t>(p.N * p.dv)),
        lse2(static_cast<size_t>(p.N)),
        delta(static_cast<size_t>(p.N)),
        dq(static_cast<size_t>(p.N * p.d)),
        dk(static_cast<size_t>(p.M * p.d)),
        dv(static_cast<size_t>(p.M * p.dv)),
        mask(static_cast<size_t>(p.block_q * p.block_k)),
        z(static_cast<size_t>(p.block_k)),
        kpos(static_cast<size_t>(p.block_k)) {}
};

// Query head h's share of the gradients: dq of its rows (written), dk and dv added to buf.dk, buf.dv.
void backward_query_head_portable(const BackwardArgs& args, BackwardBuffers& buf, int64_t b, int64_t h) {
  const BackwardProblem& p = args.p;
  const ScoreVariants& variants = args.variants;
  const int64_t N = p.N, M = p.M, d = p.d, dv = p.dv;
  const Tensor& q = args.saved.q;
  bf16_to_float_2d(bf16_head_ptr(q, b, h), q.stride(1), buf.q.data(), d, N, d);
  backward_row_terms(args.saved, args.dout, b, h, 0, args.p.N, buf.delta.data(), buf.lse2.data());
  const HeadRows g_rows = head_rows(args.dout, b, h);
  for (int64_t i = 0; i < N; ++i) {
    const float* gi = g_rows.row(i);
    for (int64_t c = 0; c < dv; ++c) buf.g[i * dv + c] = round_bf16(gi[c]);
  }
  std::fill(buf.dq.begin(), buf.dq.end(), 0.0f);
  const float qscale = p.scale * kLog2e, cap = variants.cap(), slope = variants.slope(h);
  const DropoutMatrix dropout(args.options, b, h, p.H, M);

  for (int64_t j0 = 0; j0 < M; j0 += p.block_k) {
    const int64_t nk = std::min(p.block_k, M - j0);
    const Range keys{j0, j0 + nk};
    if (slope != 0.0f) variants.key_positions(j0, nk, buf.kpos.data());
    const Range query_range = args.mask.query_range(b, keys);
    for (int64_t i0 = query_range.begin / p.block_q * p.block_q; i0 < query_range.end; i0 += p.block_q) {
      const int64_t ni = std::min(p.block_q, N - i0);
      const Range rows{i0, i0 + ni};
      const TileKind kind = args.mask.classify(b, h, rows, keys);
      if (kind == TileKind::kSkip) continue;
      if (kind == TileKind::kPartial) args.mask.fill(b, h, rows, keys, kLog2e, buf.mask.data(), nk, 1);
      for (int64_t r = 0; r < ni; ++r) {
        const int64_t i = i0 + r;
        const float* qi = buf.q.data() + i * d;
        const float* gi = buf.g.data() + i * dv;
        float* dqi = buf.dq.data() + i * d;
        const int64_t qpos = variants.query_position(i);
        if (p.dropout) dropout.fill_row(i, j0, j0 + nk, p.keep_scale, buf.z.data(), 1);
        for (int64_t c = 0; c < nk; ++c) {
          const int64_t j = j0 + c;
          const float* kj = buf.k.data() + j * d;
          const float* vj = buf.v.data() + j * dv;
          float score = 0.0f;
          for (int64_t e = 0; e < d; ++e) score += qi[e] * kj[e];
          float cap_grad = 1.0f;  // dt/du of the soft-cap
          float score_scale = qscale;
          if (variants.active()) {  // as variant_scores_portable, then base 2
            float t = score * p.scale;
            if (cap > 0.0f) {
              const float th = std::tanh(t / cap);
              t = cap * th;
              cap_grad = 1.0f - th * th;
            }
            if (slope != 0.0f) t -= slope * static_cast<float>(std::llabs(qpos - buf.kpos[c]));
            score = t * kLog2e;
            score_scale = 1.0f;
          }
          // The exponent rounded as in the forward (softmax_rows_portable), lse2 for the maximum;
          // recomputed scores may exceed lse by rounding: clamp, P <= 1.
          const float x = kind == TileKind::kPartial ? std::fma(score, score_scale, buf.mask[r * nk + c]) - buf.lse2[i]
                                                     : std::fma(score, score_scale, -buf.lse2[i]);
          const float prob = exp2_weight(std::min(x, 0.0f));
          if (prob == 0.0f) continue;  // masked (or underflowed): no gradient at all
          const float z = p.dropout ? buf.z[c] : 1.0f;
          float dprob = 0.0f;
          for (int64_t e = 0; e < dv; ++e) dprob += gi[e] * vj[e];
          dprob *= z;
          const float pz = round_bf16(prob * z);
          const float dt = round_bf16(prob * (dprob - buf.delta[i]) * cap_grad);
          float* dkj = buf.dk.data() + j * d;
          float* dvj = buf.dv.data() + j * dv;
          for (int64_t e = 0; e < dv; ++e) dvj[e] += pz * gi[e];
          for (int64_t e = 0; e < d; ++e) {
            dqi[e] += dt * kj[e];
            dkj[e] += dt * qi[e];
          }
        }
      }
    }
  }
  const HeadRows dq_rows = head_rows(args.grads.dq, b, h);
  for (int64_t i = 0; i < N; ++i) {
    float* dqrow = dq_rows.row(i);
    for (int64_t e = 0; e < d; ++e) dqrow[e] = buf.dq[i * d + e] * p.scale;
  }
}

void backward_kv_head_portable(const BackwardArgs& args, BackwardBuffers& buf, int64_t b, int64_t hk) {
  const BackwardProblem& p = args.p;
  const Tensor &k = args.saved.k, &v = args.saved.v;
  bf16_to_float_2d(bf16_head_ptr(k, b, hk), k.stride(1), buf.k.data(), p.d, p.M, p.d);
  bf16_to_float_2d(bf16_head_ptr(v, b, hk), v.stride(1), buf.v.data(), p.dv, p.M, p.dv);
  std::fill(buf.dk.begin(), buf.dk.end(), 0.0f);
  std::fill(buf.dv.begin(), buf.dv.end(), 0.0f);
  const int64_t group = p.H / p.Hkv;
  for (int64_t h = hk * group; h < (hk + 1) * group; ++h) backward_query_head_portable(args, buf, b, h);
  const HeadRows dk_rows = head_rows(args.grads.dk, b, hk), dv_rows = head_rows(args.grads.dv, b, hk);
  for (int64_t j = 0; j < p.M; ++j) {
    float* dkrow = dk_rows.row(j);
    for (int64_t e = 0; e < p.d; ++e) dkrow[e] = buf.dk[j * p.d + e] * p.scale;
    std::copy_n(buf.dv.begin() + j * p.dv, p.dv, dv_rows.row(j));
  }
}

}  // namespace

void attention_flash_bf16_backward_portable(const AttentionSaved& saved, const Tensor& dout,
                                            const AttentionOptions& options, const AttentionGrads& grads,
                                            const FlashConfig& config) {
  const FlashConfig tiles = flash_resolved_config(config, options, saved.q.size(3), saved.q.size(1), true, DType::BF16);
  BackwardProblem p{};
  p.B = saved.q.size(0), p.N = saved.q.size(1), p.H = saved.q.size(2), p.Hkv = saved.k.size(2);
  p.M = saved.k.size(1), p.d = saved.q.size(3), p.dv = saved.v.size(3);
  p.block_q = tiles.block_q, p.block_k = tiles.block_k;
  p.scale = attention_scale(options, p.d);
  p.keep_scale = 1.0f / (1.0f - options.dropout);
  p.dropout = options.dropout > 0.0f;
  const TileMask mask(options.mask, p.B, p.H, p.N, p.M);
  const ScoreVariants variants(options, p.N, p.M, p.d);
  const BackwardArgs args{saved, dout, grads, options, mask, variants, p};
#pragma omp parallel
  {
    BackwardBuffers buf(p);
#pragma omp for schedule(dynamic, 1)
    for (int64_t hd = 0; hd < p.B * p.Hkv; ++hd) backward_kv_head_portable(args, buf, hd / p.Hkv, hd % p.Hkv);
  }
}

}  // namespace cabm::detail
