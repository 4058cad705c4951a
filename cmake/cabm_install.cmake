# `cmake --install`: libcabm, its public headers under include/cabm/<layer>/, the `cabm`
# command, a CMake package (find_package(cabm CONFIG) → cabm::cabm) and a pkg-config file.
include(CMakePackageConfigHelpers)

set(CABM_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/cabm)
# Headers that only the kernels' own sources include: their content depends on the ISA flags
# the library was compiled with (or on a `#pragma GCC target` region opened around them), so they
# are not part of the interface: the SIMD vector type, the per-instruction-set bodies and items,
# the region headers, and what only those include. (Globs: one name pattern each.)
set(CABM_INTERNAL_HEADERS simd.h x86_intrinsics.h aligned_vector.h simd_set_*.h *_body.h *_item.h tile_product.h tile_transpose.h
                          row_prefetch.h backward_split.h
                          score_epilogue.h score_variants.h bf16_avx512.h bf16_variants.h
                          bf16_packing.h flash_detail.h tile_mask.h hf_tokenizer_impl.h
                          hf_tokenizer_files.h amx_tiles.h amx_tile_gemm.h flash_amx.h flash_bf16_backward.h
                          unit_loops.h)

install(TARGETS cabm_lib EXPORT cabmTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS cabm RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
set(exclude)
foreach(header ${CABM_INTERNAL_HEADERS})
  list(APPEND exclude PATTERN ${header} EXCLUDE)
endforeach()
install(DIRECTORY cabm/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/cabm
        FILES_MATCHING PATTERN "*.h" ${exclude})
install(EXPORT cabmTargets NAMESPACE cabm:: DESTINATION ${CABM_CMAKE_DIR})

configure_package_config_file(cmake/cabmConfig.cmake.in ${CMAKE_CURRENT_BINARY_DIR}/cabmConfig.cmake
                              INSTALL_DESTINATION ${CABM_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/cabmConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/cabmConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/cabmConfigVersion.cmake
              cmake/cabm_dependencies.cmake
        DESTINATION ${CABM_CMAKE_DIR})

# pkg-config: a static libcabm needs its private dependencies on the link line too.
get_filename_component(CABM_OPENBLAS_LIBDIR ${CABM_OPENBLAS_LIB} DIRECTORY)
set(CABM_PC_DEPS_LIBS "-ldnnl -L${CABM_OPENBLAS_LIBDIR} -lopenblas -lutf8proc -lsentencepiece")
if(CABM_WITH_MPI)  # Open MPI's libraries, by path (Debian's are outside the default search path)
  foreach(lib ${MPI_CXX_LIBRARIES})
    string(APPEND CABM_PC_DEPS_LIBS " ${lib}")
  endforeach()
endif()
if(BUILD_SHARED_LIBS)
  set(CABM_PC_LIBS "-L\${libdir} -lcabm -fopenmp")
  set(CABM_PC_LIBS_PRIVATE "${CABM_PC_DEPS_LIBS}")
else()
  set(CABM_PC_LIBS "-L\${libdir} -lcabm ${CABM_PC_DEPS_LIBS} -fopenmp")
  set(CABM_PC_LIBS_PRIVATE "")
endif()
file(RELATIVE_PATH CABM_PC_PREFIX_FROM_PCDIR /prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig /prefix)
configure_file(cmake/cabm.pc.in ${CMAKE_CURRENT_BINARY_DIR}/cabm.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/cabm.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
