// The GELU spans in plain C++ (vectorised as far as the build's own flags allow): the fallback chosen at run
// time (cpu_isa.h). See activations_body.h for the scheme.
#include "cabm/kernels/activations_item.h"

#include "cabm/kernels/simd_set_portable_begin.h"
#define CABM_GELU_VARIANT gelu_portable
#include "cabm/kernels/activations_body.h"
#include "cabm/kernels/simd_set_end.h"
