// Opens the region in which a run-time dispatched kernel's body is compiled for AVX-512 (F, BW, DQ, VL), whatever
// the build's own flags (cpu_isa.h): a per-set file includes its kernel's item header (every
// header the body needs, compiled for the build's flags), then this, then the body, then
// simd_set_end.h. CABM_SIMD_LEVEL and CABM_SIMD_NS choose simd.h's flavour and its
// namespace (GCC does not define __AVX512F__ inside a target region; one namespace per set, so
// that inline vector functions of different sets never merge at link time). No include guard:
// one region per file.
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,bmi2,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,bmi2,f16c")
#endif
#define CABM_SIMD_TARGET_REGION 1
#define CABM_SIMD_LEVEL 2
#define CABM_SIMD_NS simd_avx512
