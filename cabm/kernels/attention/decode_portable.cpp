// The split-key decode kernel's work item for no vector extension beyond the build's flags, whatever the build's own
// flags: chosen at run time (cpu_isa.h). See attention/decode_body.h for the scheme.
#include "cabm/kernels/attention/decode_item.h"

#include "cabm/kernels/simd_set_portable_begin.h"
#define CABM_DECODE_VARIANT decode_portable
#include "cabm/kernels/attention/decode_body.h"
#include "cabm/kernels/simd_set_end.h"
