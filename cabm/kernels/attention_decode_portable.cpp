// The split-key decode kernel's work item for no vector extension beyond the build's flags, whatever the build's own
// flags: chosen at run time (cpu_isa.h). See attention_decode_body.h for the scheme.
#include "cabm/kernels/attention_decode_item.h"

#define CABM_SIMD_LEVEL 0
#define CABM_SIMD_NS simd_portable
#define CABM_DECODE_VARIANT decode_portable
#include "cabm/kernels/attention_decode_body.h"
