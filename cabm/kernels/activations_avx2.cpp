// The GELU spans for AVX2 + FMA, whatever the build's own flags: chosen at run time
// (cpu_isa.h). See activations_body.h for the scheme.
#include "cabm/kernels/activations_item.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,bmi2,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,bmi2,f16c")
#endif
#define CABM_SIMD_LEVEL 1
#define CABM_SIMD_NS simd_avx2
#define CABM_GELU_VARIANT gelu_avx2
#include "cabm/kernels/activations_body.h"
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
