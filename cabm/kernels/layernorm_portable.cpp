// The LayerNorm row kernels in plain C++ (vectorised as far as the build's own flags allow): the fallback chosen at run
// time (cpu_isa.h). See layernorm_body.h for the scheme.
#include "cabm/kernels/layernorm_item.h"

#include "cabm/kernels/simd_set_portable_begin.h"
#define CABM_LAYERNORM_VARIANT layernorm_portable
#include "cabm/kernels/layernorm_body.h"
#include "cabm/kernels/simd_set_end.h"
