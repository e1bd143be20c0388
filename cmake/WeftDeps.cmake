# Finds weft's dependencies: system packages through pkg-config / CMake configs, header-only ones
# also under WEFT_DEPS_PREFIX (for machines without a package registry).
find_package(PkgConfig REQUIRED)
find_package(Threads REQUIRED)

list(PREPEND CMAKE_PREFIX_PATH ${WEFT_DEPS_PREFIX}/usr)

pkg_check_modules(PMIX REQUIRED IMPORTED_TARGET pmix)
pkg_check_modules(HWLOC REQUIRED IMPORTED_TARGET hwloc)
find_package(yaml-cpp REQUIRED)
if(TARGET yaml-cpp::yaml-cpp)
  set(WEFT_YAML_TARGET yaml-cpp::yaml-cpp)
else()
  set(WEFT_YAML_TARGET yaml-cpp)
endif()

# Header-only libraries: a CMake package if there is one, else the header under the prefix.
function(weft_header_only target header)
  find_path(${target}_INCLUDE ${header} HINTS ${WEFT_DEPS_PREFIX}/usr/include)
  if(NOT ${target}_INCLUDE)
    message(FATAL_ERROR "weft: ${header} not found; run 'scripts/weft deps' (or 'scripts/weft vendor' "
                        "on a machine with apt to unpack it into ${WEFT_DEPS_PREFIX})")
  endif()
  add_library(weft_dep_${target} INTERFACE)
  target_include_directories(weft_dep_${target} SYSTEM INTERFACE ${${target}_INCLUDE})
endfunction()
weft_header_only(cli11 CLI/CLI.hpp)
weft_header_only(json nlohmann/json.hpp)
weft_header_only(doctest doctest/doctest.h)

find_path(IBVERBS_INCLUDE infiniband/verbs.h)
find_library(IBVERBS_LIBRARY ibverbs)
if(IBVERBS_INCLUDE AND IBVERBS_LIBRARY)
  set(WEFT_HAVE_IBVERBS ON)
else()
  set(WEFT_HAVE_IBVERBS OFF)
  message(WARNING "weft: libibverbs not found; the ibverbs backend is not built")
endif()

if(WEFT_WITH_CUDA)
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    # Hopper only: wgmma and setmaxnreg need the arch-specific target; the -gencode form is the
    # one nvcc 13.0 accepts for them without also running a plain sm_90 pass.
    set(CMAKE_CUDA_ARCHITECTURES OFF)
    enable_language(CUDA)
    set(CMAKE_CUDA_STANDARD 17)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    set(CMAKE_CUDA_FLAGS "${CMAKE_CUDA_FLAGS} -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr")
    find_package(CUDAToolkit REQUIRED)
    # weftrun's CPU commands (--help, plan, topo) start where no CUDA library is installed (a login
    # node): the CUDA runtime is linked statically, and it loads the driver (libcuda) itself when the
    # first GPU call is made. Every target names CUDA::cudart; that name now links the static runtime.
    option(WEFT_STATIC_CUDART "link the CUDA runtime statically (weftrun then needs no CUDA library to start)" ON)
    if(WEFT_STATIC_CUDART AND TARGET CUDA::cudart_static)
      set(CMAKE_CUDA_RUNTIME_LIBRARY Static)
      get_target_property(weft_cudart_static CUDA::cudart_static IMPORTED_LOCATION)
      set_target_properties(CUDA::cudart PROPERTIES IMPORTED_LOCATION "${weft_cudart_static}")
      set_property(TARGET CUDA::cudart APPEND PROPERTY INTERFACE_LINK_LIBRARIES CUDA::cudart_static_deps)
    endif()
    find_path(NCCL_INCLUDE nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
    find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR})
    set(WEFT_HAVE_CUDA ON)
  else()
    message(WARNING "weft: no CUDA compiler; GPU code is not built")
    set(WEFT_HAVE_CUDA OFF)
  endif()
else()
  set(WEFT_HAVE_CUDA OFF)
endif()
