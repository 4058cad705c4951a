// Which kernels OpenBLAS runs, and the ones to ask it for where it does not know the CPU.
//
// OpenBLAS built with DYNAMIC_ARCH (Debian's) picks its kernels ("core") from the CPU's vendor,
// family and model when it loads. A model that its release does not list gets its generic
// x86-64 kernels, "Prescott" (SSE3): Debian 12's OpenBLAS 0.3.21 does so on the Intel Xeon family
// 6 model 207 (AVX-512) that cabm has run on since session 34, and on the Xeon of the same
// model, where OpenBLAS ran every training product at 32–50 GFLOP/s (../shared/machines/xeon-amx.md)
// against oneDNN's 162–227. OPENBLAS_CORETYPE names the core instead, but OpenBLAS reads it only
// as it loads: a process cannot change its kernels afterwards. The cabm CLI sets it where the
// user has not and executes itself again (cli/main.cpp); a program that links cabm sets it itself.
// gemm()'s routes are timed on the machine either way (gemm_route.h), so a slow OpenBLAS costs
// speed there only where oneDNN is slower still.
#pragma once

#include "cabm/kernels/cpu_isa.h"

#include <string>

namespace cabm {

// The core this process's OpenBLAS runs, as it names it: "SkylakeX", "Haswell", "Zen", "Prescott".
std::string openblas_core();

// The core to ask for (the value of OPENBLAS_CORETYPE) when OpenBLAS chose `core` on a CPU whose
// best SIMD set is `isa`: "SkylakeX" on AVX-512 and "Haswell" on AVX2 + FMA where `core` is one
// of OpenBLAS's cores without AVX2 (its Prescott fallback, or an older Intel core); nullptr where
// the choice stands (a core with AVX2 kernels is OpenBLAS's own judgement, e.g. Zen).
const char* openblas_core_to_request(const std::string& core, SimdIsa isa);

}  // namespace cabm
