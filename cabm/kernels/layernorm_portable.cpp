// The LayerNorm row kernels in plain C++ (vectorised as far as the build's own flags allow): the fallback chosen at run
// time (cpu_isa.h). See layernorm_body.h for the scheme.
#include "cabm/kernels/layernorm_item.h"

#define CABM_SIMD_LEVEL 0
#define CABM_SIMD_NS simd_portable
#define CABM_LAYERNORM_VARIANT layernorm_portable
#include "cabm/kernels/layernorm_body.h"
