// The LayerNorm row kernels for AVX-512 (F, BW, DQ, VL), whatever the build's own flags: chosen at run time
// (cpu_isa.h). See layernorm_body.h for the scheme.
#include "cabm/kernels/layernorm_item.h"

#include "cabm/kernels/simd_set_avx512_begin.h"
#define CABM_LAYERNORM_VARIANT layernorm_avx512
#include "cabm/kernels/layernorm_body.h"
#include "cabm/kernels/simd_set_end.h"
