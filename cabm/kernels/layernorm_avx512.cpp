// The LayerNorm row kernels for AVX-512 (F, BW, DQ, VL), whatever the build's own flags: chosen at run time
// (cpu_isa.h). See layernorm_body.h for the scheme.
#include "cabm/kernels/layernorm_item.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,bmi2,f16c"))), \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,bmi2,f16c")
#endif
#define CABM_SIMD_LEVEL 2
#define CABM_SIMD_NS simd_avx512
#define CABM_LAYERNORM_VARIANT layernorm_avx512
#include "cabm/kernels/layernorm_body.h"
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
