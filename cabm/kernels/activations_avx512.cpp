// The GELU spans for AVX-512 (F, BW, DQ, VL), whatever the build's own flags: chosen at run time
// (cpu_isa.h). See activations_body.h for the scheme.
#include "cabm/kernels/activations_item.h"

#include "cabm/kernels/simd_set_avx512_begin.h"
#define CABM_GELU_VARIANT gelu_avx512
#include "cabm/kernels/activations_body.h"
#include "cabm/kernels/simd_set_end.h"
