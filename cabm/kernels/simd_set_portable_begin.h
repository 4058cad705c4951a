// Opens the region in which a run-time dispatched kernel's body is compiled for no vector extension (plain C++, which the compiler may vectorise for the build's flags), whatever
// the build's own flags (cpu_isa.h): a per-set file includes its kernel's item header (every
// header the body needs, compiled for the build's flags), then this, then the body, then
// simd_set_end.h. CABM_SIMD_LEVEL and CABM_SIMD_NS choose simd.h's flavour and its
// namespace (GCC does not define __AVX512F__ inside a target region; one namespace per set, so
// that inline vector functions of different sets never merge at link time). No include guard:
// one region per file.
#define CABM_SIMD_LEVEL 0
#define CABM_SIMD_NS simd_portable
