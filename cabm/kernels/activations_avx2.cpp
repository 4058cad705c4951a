// The GELU spans for AVX2 + FMA, whatever the build's own flags: chosen at run time
// (cpu_isa.h). See activations_body.h for the scheme.
#include "cabm/kernels/activations_item.h"

#include "cabm/kernels/simd_set_avx2_begin.h"
#define CABM_GELU_VARIANT gelu_avx2
#include "cabm/kernels/activations_body.h"
#include "cabm/kernels/simd_set_end.h"
