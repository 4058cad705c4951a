// The LayerNorm row kernels for AVX2 + FMA, whatever the build's own flags: chosen at run time
// (cpu_isa.h). See layernorm_body.h for the scheme.
#include "cabm/kernels/layernorm_item.h"

#include "cabm/kernels/simd_set_avx2_begin.h"
#define CABM_LAYERNORM_VARIANT layernorm_avx2
#include "cabm/kernels/layernorm_body.h"
#include "cabm/kernels/simd_set_end.h"
