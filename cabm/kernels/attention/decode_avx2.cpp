// The split-key decode kernel's work item for AVX2 + FMA, whatever the build's own flags:
// chosen at run time (cpu_isa.h). See attention/decode_body.h for the scheme.
#include "cabm/kernels/attention/decode_item.h"

#include "cabm/kernels/simd_set_avx2_begin.h"
#define CABM_DECODE_VARIANT decode_avx2
#include "cabm/kernels/attention/decode_body.h"
#include "cabm/kernels/simd_set_end.h"
