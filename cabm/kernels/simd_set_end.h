// Closes the region simd_set_<set>_begin.h opened.
#if defined(CABM_SIMD_TARGET_REGION)
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#undef CABM_SIMD_TARGET_REGION
#endif
#if defined(CABM_SIMD_PORTABLE_REGION)
#pragma GCC pop_options
#undef CABM_SIMD_PORTABLE_REGION
#endif
