// Opens the region in which a run-time dispatched kernel's body is compiled for no vector extension (plain C++, which the compiler may vectorise for the build's flags), whatever
// the build's own flags (cpu_isa.h): a per-set file includes its kernel's item header (every
// header the body needs, compiled for the build's flags), then this, then the body, then
// simd_set_end.h. CABM_SIMD_LEVEL and CABM_SIMD_NS choose simd.h's flavour and its
// namespace (GCC does not define __AVX512F__ inside a target region; one namespace per set, so
// that inline vector functions of different sets never merge at link time). No include guard:
// one region per file.
#define CABM_SIMD_LEVEL 0
#define CABM_SIMD_NS simd_portable
// Contraction off: GCC's default (-ffp-contract=fast) fuses a · b + c into an FMA where the build's
// target has one, case by case, so two instantiations of one sum (the fp32 attention's tile product
// with and without its running maximum) could round differently and break the kernels' bit-for-bit
// promises (FlashVariants.AlibiZeroSlopesEqualPlainAttentionBitForBit failed so under
// CABM_SIMD_ISA=portable). simd.h's portable fma says where it fuses. Clang contracts only within
// one expression, which keeps equal sums equal.
#if !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#define CABM_SIMD_PORTABLE_REGION 1
#endif
