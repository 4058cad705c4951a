// The GELU spans in plain C++ (vectorised as far as the build's own flags allow): the fallback chosen at run
// time (cpu_isa.h). See activations_body.h for the scheme.
#include "cabm/kernels/activations_item.h"

#define CABM_SIMD_LEVEL 0
#define CABM_SIMD_NS simd_portable
#define CABM_GELU_VARIANT gelu_portable
#include "cabm/kernels/activations_body.h"
