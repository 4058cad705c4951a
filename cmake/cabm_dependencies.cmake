# cabm's library dependencies, all from Debian packages (scripts/setup.sh installs them). Used
# by the build and, installed beside cabmConfig.cmake, by every project that finds cabm, so
# that both resolve them alike. Each find names its package when it fails.
include(CMakeFindDependencyMacro)

# Inside find_package(cabm) a missing dependency makes cabm not found (find_dependency); in
# cabm's own build it is an error.
macro(cabm_find_dependency name)
  if(CMAKE_FIND_PACKAGE_NAME STREQUAL "cabm")
    find_dependency(${name} ${ARGN})
  else()
    find_package(${name} REQUIRED ${ARGN})
  endif()
endmacro()

cabm_find_dependency(OpenMP)          # g++ (libgomp)
cabm_find_dependency(fmt)             # libfmt-dev
cabm_find_dependency(nlohmann_json)   # nlohmann-json3-dev
cabm_find_dependency(dnnl)            # libdnnl-dev (its package file needs ocl-icd-opencl-dev)

# OpenBLAS, the build that runs on OpenMP (libopenblas-openmp-dev): the same thread pool as
# oneDNN and cabm's kernels. gemm() takes it for the weight-gradient products
# (cabm/kernels/gemm.cpp). Debian ships no CMake package for it: an imported target here.
if(NOT TARGET cabm::openblas)
  find_path(CABM_OPENBLAS_INCLUDE cblas.h PATHS /usr/include/x86_64-linux-gnu/openblas-openmp NO_DEFAULT_PATH)
  find_library(CABM_OPENBLAS_LIB openblas PATHS /usr/lib/x86_64-linux-gnu/openblas-openmp NO_DEFAULT_PATH)
  if(NOT CABM_OPENBLAS_INCLUDE OR NOT CABM_OPENBLAS_LIB)
    message(FATAL_ERROR "OpenBLAS's OpenMP build not found: apt-get install libopenblas-openmp-dev "
                        "(cabm's scripts/setup.sh installs every dependency)")
  endif()
  add_library(cabm::openblas UNKNOWN IMPORTED)
  set_target_properties(cabm::openblas PROPERTIES IMPORTED_LOCATION ${CABM_OPENBLAS_LIB}
                                                  INTERFACE_INCLUDE_DIRECTORIES ${CABM_OPENBLAS_INCLUDE})
endif()

# Open MPI (openmpi-bin, libopenmpi-dev) for data-parallel training (cabm/train/distributed.h),
# optional: without it cabm builds and runs as one process. CABM_WITH_MPI says which build this
# is (the installed cabmConfig.cmake records it, so that a consumer links MPI when cabm did).
set(MPI_CXX_SKIP_MPICXX ON)  # the C API only (the C++ bindings are deprecated)
if(NOT DEFINED CABM_WITH_MPI)
  set(CABM_MPI AUTO CACHE STRING "Data-parallel training over MPI: AUTO (if found), ON (required), OFF")
  if(CABM_MPI STREQUAL "OFF")
    set(CABM_WITH_MPI OFF)
  else()
    if(CABM_MPI STREQUAL "ON")
      find_package(MPI REQUIRED COMPONENTS CXX)
    else()
      find_package(MPI COMPONENTS CXX)
    endif()
    set(CABM_WITH_MPI ${MPI_CXX_FOUND})
  endif()
elseif(CABM_WITH_MPI)
  cabm_find_dependency(MPI COMPONENTS CXX)
endif()

# utf8proc (libutf8proc-dev) and SentencePiece (libsentencepiece-dev): Unicode categories,
# normalisation and SentencePiece models for the Hugging Face tokenizers (cabm/io/). Debian's
# pkg-config files are not needed: imported targets from the header and the library, as above.
if(NOT TARGET cabm::utf8proc)
  find_path(CABM_UTF8PROC_INCLUDE utf8proc.h)
  find_library(CABM_UTF8PROC_LIB utf8proc)
  if(NOT CABM_UTF8PROC_INCLUDE OR NOT CABM_UTF8PROC_LIB)
    message(FATAL_ERROR "utf8proc not found: apt-get install libutf8proc-dev "
                        "(cabm's scripts/setup.sh installs every dependency)")
  endif()
  add_library(cabm::utf8proc UNKNOWN IMPORTED)
  set_target_properties(cabm::utf8proc PROPERTIES IMPORTED_LOCATION ${CABM_UTF8PROC_LIB}
                                                  INTERFACE_INCLUDE_DIRECTORIES ${CABM_UTF8PROC_INCLUDE})
endif()
if(NOT TARGET cabm::sentencepiece)
  find_path(CABM_SENTENCEPIECE_INCLUDE sentencepiece_processor.h)
  find_library(CABM_SENTENCEPIECE_LIB sentencepiece)
  if(NOT CABM_SENTENCEPIECE_INCLUDE OR NOT CABM_SENTENCEPIECE_LIB)
    message(FATAL_ERROR "SentencePiece not found: apt-get install libsentencepiece-dev "
                        "(cabm's scripts/setup.sh installs every dependency)")
  endif()
  add_library(cabm::sentencepiece UNKNOWN IMPORTED)
  set_target_properties(cabm::sentencepiece PROPERTIES IMPORTED_LOCATION ${CABM_SENTENCEPIECE_LIB}
                                                       INTERFACE_INCLUDE_DIRECTORIES ${CABM_SENTENCEPIECE_INCLUDE})
endif()
