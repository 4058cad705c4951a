// The tiled attention kernel's tile loops for AVX-512 (F, BW, DQ, VL), whatever the build's own flags:
// chosen at run time (cpu_isa.h). See attention/flash_item.h and attention/decode_body.h for the scheme.
#include "cabm/kernels/attention/flash_item.h"

#include "cabm/kernels/simd_set_avx512_begin.h"
#define CABM_FLASH_SET avx512
#include "cabm/kernels/attention/flash_backward_body.h"
#include "cabm/kernels/attention/flash_forward_body.h"
#include "cabm/kernels/simd_set_end.h"
