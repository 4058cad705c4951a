// What `cabm attention` runs: the attention kernel on tensors from a safetensors file, forward
// and (when the file has `dout`) backward, with every variant of attention/reference.h and
// rotary positions (rope.h). The contract is in docs/attention_file.md; in short:
//   IN (F32): q [B, N, Hq, d], k [B, M, Hkv, d], v [B, M, Hkv, dv]; optional mask (BOOL, true =
//   may attend, or F32 added to the scores) broadcastable to [B, Hq, N, M], alibi_slopes [Hq],
//   sinks [Hq], q_positions [N] and k_positions [M] (I64), dout [B, N, Hq, dv].
//   IN metadata: scale, causal (none | top_left | bottom_right), window_left, window_right
//   (−1 = unbounded), alibi (true | false), softcap (c > 0), rope (none | neox | gptj),
//   rope_theta, rope_dim.
//   OUT (F32): out [B, N, Hq, dv], lse [B, Hq, N]; with dout: dq, dk, dv (with respect to q
//   and k before rotary), and dsinks [Hq] when sinks were given.
// Any missing or unknown tensor, wrong dtype or shape, Hq not a multiple of Hkv, or unknown
// metadata key or value is a cabm::Error naming the file and what is wrong.
#pragma once

#include "cabm/io/safetensors.h"
#include "cabm/nn/mixed_precision.h"

#include <map>
#include <string>

namespace cabm {

// precision kBf16: q, k, v (after rotary) rounded to bf16 and the bf16 kernels, fp32 outputs.
std::map<std::string, Tensor> run_attention_file(const SafetensorsFile& input, Precision precision = Precision::kFp32);

}  // namespace cabm
