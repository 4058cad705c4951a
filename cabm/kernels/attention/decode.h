// Split-key attention for decoding: a few query rows per head (one new token, or a handful)
// against a long key/value cache. FlashAttention's "flash-decoding" split (Dao et al. 2023, "Flash-
// Decoding for long-context inference"): the keys are cut into fixed chunks, every (batch item,
// key/value head, chunk) is a work item, each computes a partial softmax state (row maximum m,
// sum l, unnormalised output acc) and the chunks are merged in chunk order:
//   m = max_c m_c,   l = Σ_c l_c e^(m_c − m),   out = Σ_c acc_c e^(m_c − m) / l,   lse = m + log l.
// With GQA the rows of all H/Hkv query heads of a key/value head are one work item, so each key
// and value row is read from memory once per group, not once per query head: decoding is a
// stream over the cache, bounded by memory bandwidth. The chunk size does not depend on the
// thread count, so results are bit-identical for any number of threads.
//
// Same conventions as attention_reference.h. Takes: q F32 or BF16 (widened exactly), k and v of
// q's dtype (a BF16 cache is widened in registers; P is not rounded to bf16, unlike the tiled bf16
// kernel), masks made only of causal, sliding-window and key-padding parts, soft-capping, ALiBi,
// no dropout. Sinks are folded in by the entry point (attention/attention.cpp), like for the tiled kernels.
#pragma once

#include "cabm/kernels/attention/reference.h"

#include <cstdint>

namespace cabm {

// The instruction set the kernel runs with now (cpu_isa.h: the widest this CPU has, or the
// override): "avx512", "avx2" or "portable". Every set is compiled into every build.
const char* attention_decode_isa();

// Query rows per head up to which attention_forward takes this kernel.
inline constexpr int64_t kDecodeMaxQueryRows = 8;

// Whether attention_decode_forward takes these operands and options.
bool attention_decode_supports(const Tensor& q, const Tensor& k, const AttentionOptions& options);

// q [B, N, H, d], k [B, M, Hkv, d], v [B, M, Hkv, dv]: strided views with unit last stride, all F32
// or all BF16. out F32 [B, N, H, dv] (strided view), lse null or F32 [B, H, N] contiguous.
// chunk: keys per work item (0 = the default, 512).
void attention_decode_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options,
                              const Tensor& out, const Tensor* lse = nullptr, int64_t chunk = 0);

}  // namespace cabm
