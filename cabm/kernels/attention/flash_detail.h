// Internal to kernels/: the fp32 tile kernels of attention/flash.cpp run on bf16 inputs. This is
// the path attention/flash_bf16.cpp takes on CPUs without AVX-512 BF16 (see attention/flash_bf16.h):
// q, k, v are widened to fp32 (exact) as tiles are packed into per-thread scratch, every block
// product runs on the SIMD micro-kernel of simd.h, and the other operands of the
// products are rounded to bf16 values where the bf16 contract says so (P before P·V; dO, P∘z and
// dS in the backward), so that the results equal the portable bf16 path's up to the order of fp32
// sums.
#pragma once

#include "cabm/kernels/attention/flash.h"

namespace cabm::detail {

// As attention_flash_bf16_forward / _backward: q, k, v BF16 head views; the rest F32. Shapes are
// checked by the caller; saved.lse must be defined.
void attention_flash_bf16_forward_simd(const Tensor& q, const Tensor& k, const Tensor& v,
                                       const AttentionOptions& options, const Tensor& out, const Tensor* lse,
                                       const FlashConfig& config);
void attention_flash_bf16_backward_simd(const AttentionSaved& saved, const Tensor& dout,
                                        const AttentionOptions& options, const AttentionGrads& grads,
                                        const FlashConfig& config);

// The runs the tiled backwards (the fp32 family; bf16 on vdpbf16ps and AMX) cut the key tiles of
// few heads into (attention/backward_split.h): the processors this process may use
// (omp_get_num_procs()), at most kMaxSplitRuns, or the count pinned by set_backward_split_runs
// (tests: run counts above and below the thread count on any machine; 0 unpins). Never the thread
// count, so that dq is the same bits for any number of threads. Not meant to be changed while
// kernels run.
inline constexpr int kMaxSplitRuns = 16;
int backward_split_runs();
void set_backward_split_runs(int runs);

// The query rows of each head the tiled backwards hold at once: config.backward_rows (rounded up
// to block_q) where set, else all N when N rows of row_bytes (the per-row buffers of a head's
// group: Q, dO, dQ, lse, D, ...) fit in kBackwardChunkBytes, else a multiple of block_q that does.
// Each chunk is walked against every key tile, so each extra chunk costs one more packing of the
// key tiles (O(M·d) against O(rows·M·d) of products), and the working memory stays bounded at any
// N. It depends only on the shapes, never on the thread count.
inline constexpr int64_t kBackwardChunkBytes = 4 << 20;
int64_t backward_chunk_rows(int64_t N, int64_t block_q, int64_t row_bytes, const FlashConfig& config);

}  // namespace cabm::detail
