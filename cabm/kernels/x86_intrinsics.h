// <immintrin.h> for cabm's kernels, with the one known warning of GCC 12's own AVX-512 headers
// silenced: their intrinsics pass a self-initialised `__Y` as the unused merge operand
// (`__m512 __Y = __Y;`), which -Wuninitialized / -Wmaybe-uninitialized report at every call
// site once inlined (47 lines per build on an AVX-512 machine). The suppression covers the
// header's own lines only, so the same warning in cabm's code still stands out. Include this
// before anything else that may include <immintrin.h>.
#pragma once

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#ifndef __clang__  // a GCC-only warning group; clang warns about the unknown name
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#pragma GCC diagnostic pop
