# cmake/tensorplayUsage.cmake: the usage requirements of tensorplay that depend on the
# consumer's CMake and CUDA toolkit. CMakeLists.txt (add_subdirectory, build tree) and the
# installed tensorplayConfig.cmake (find_package) both include it, so that both decide the
# same way, with the CMake and the toolkit that compile the consumer.
include_guard(GLOBAL)

# C++20 for the C++ and CUDA sources of the targets that link `target`, asked the way the
# consumer's CMake can: the compile feature (cxx_std_20, cuda_std_20) when it knows it for the
# compiler of that language, else -std=c++20 for the sources of that language. CMake 3.25
# knows no cuda_std_20 for nvcc (target_compile_features and CUDA_STANDARD 20 both fail
# there), but nvcc takes -std=c++20. A feature the consumer's CMake does not know for a
# language it never enabled would fail too, hence the check per language. CMake knows the
# features once the language is enabled: enable CUDA before find_package(tensorplay).
# BUILD_INTERFACE: for the build tree only, so that the exported target carries neither and
# the installed config decides again.
function(tensorplay_require_cxx20 target)
  cmake_parse_arguments(PARSE_ARGV 1 arg "BUILD_INTERFACE" "" "")
  foreach(lang IN ITEMS CXX CUDA)
    string(TOLOWER "${lang}_std_20" feature)
    if(feature IN_LIST CMAKE_${lang}_COMPILE_FEATURES)
      set(requirement ${feature})
      set(command target_compile_features)
    else()
      set(requirement "$<$<COMPILE_LANGUAGE:${lang}>:-std=c++20>")
      set(command target_compile_options)
    endif()
    if(arg_BUILD_INTERFACE)
      set(requirement "$<BUILD_INTERFACE:${requirement}>")
    endif()
    cmake_language(CALL ${command} ${target} INTERFACE "${requirement}")
  endforeach()
endfunction()

# The CUDA runtime the headers call: the shared one (CUDA::cudart) for targets that ask
# for it (CUDA_RUNTIME_LIBRARY Shared), else the static one, as CMake links CUDA targets by
# default. One runtime per program: two would each keep their own state.
function(tensorplay_link_cuda_runtime target)
  set(shared "$<STREQUAL:$<UPPER_CASE:$<TARGET_PROPERTY:CUDA_RUNTIME_LIBRARY>>,SHARED>")
  target_link_libraries(${target} INTERFACE "$<IF:${shared},CUDA::cudart,CUDA::cudart_static>")
endfunction()

# Defines tensorplay::nccl (tensorplay::tensorplay + NCCL) when NCCL is found, first in the
# CUDA toolkit's folders, then in the system's; sets `found_var` to TRUE or FALSE.
# TENSORPLAY_NCCL_LIBRARY / TENSORPLAY_NCCL_INCLUDE_DIR (cache) point elsewhere.
# GLOBAL: visible to the whole project (add_subdirectory).
function(tensorplay_add_nccl_target found_var)
  cmake_parse_arguments(PARSE_ARGV 1 arg "GLOBAL" "" "")
  if(NOT TARGET tensorplay::nccl)
    find_library(TENSORPLAY_NCCL_LIBRARY NAMES nccl HINTS "${CUDAToolkit_LIBRARY_DIR}"
                 DOC "NCCL library linked by tensorplay::nccl")
    find_path(TENSORPLAY_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS}
              DOC "Folder of nccl.h for tensorplay::nccl")
    if(TENSORPLAY_NCCL_LIBRARY AND TENSORPLAY_NCCL_INCLUDE_DIR)
      set(scope)
      if(arg_GLOBAL)
        set(scope GLOBAL)
      endif()
      add_library(tensorplay::nccl INTERFACE IMPORTED ${scope})
      set_target_properties(tensorplay::nccl PROPERTIES
        INTERFACE_LINK_LIBRARIES "tensorplay::tensorplay;${TENSORPLAY_NCCL_LIBRARY}"
        INTERFACE_INCLUDE_DIRECTORIES "${TENSORPLAY_NCCL_INCLUDE_DIR}")
    endif()
  endif()
  if(TARGET tensorplay::nccl)
    set(${found_var} TRUE PARENT_SCOPE)
  else()
    set(${found_var} FALSE PARENT_SCOPE)
  endif()
endfunction()

# The run-time path of the CUDA libraries for the executables and shared libraries that link
# `target`. CMake leaves the CUDA toolkit's library folder out of the rpath, because nvcc links
# from it implicitly, so a program linking CUDA::cublas (or CUDA::cudart, ...) would need
# LD_LIBRARY_PATH. This adds that folder, and the folder of each shared library FindCUDAToolkit
# found or was pointed at (CUDA_cublas_LIBRARY=.../nvidia/cu13/lib/libcublas.so.13 for the
# pip-installed wheel PyTorch uses), each as found and as its real path.
# TENSORPLAY_CUDA_RPATH=OFF leaves the run-time path to the consumer. BUILD_INTERFACE: as for
# tensorplay_require_cxx20 (the installed config decides again, with the consumer's toolkit).
option(TENSORPLAY_CUDA_RPATH "Put the CUDA libraries' folders on the run-time path of what links tensorplay::tensorplay" ON)
function(tensorplay_add_cuda_rpath target)
  cmake_parse_arguments(PARSE_ARGV 1 arg "BUILD_INTERFACE" "" "")
  if(NOT TENSORPLAY_CUDA_RPATH)
    return()
  endif()
  set(files)
  foreach(lib IN ITEMS cudart cublas cublasLt cufft curand cusolver cusparse nvJitLink nvrtc)
    if(CUDA_${lib}_LIBRARY MATCHES "\\.so(\\.[0-9]+)*$")
      list(APPEND files "${CUDA_${lib}_LIBRARY}")
    endif()
  endforeach()
  set(dirs)
  if(CUDAToolkit_LIBRARY_DIR)
    list(APPEND dirs "${CUDAToolkit_LIBRARY_DIR}")
  endif()
  foreach(file IN LISTS files)
    get_filename_component(dir "${file}" DIRECTORY)
    file(REAL_PATH "${file}" real)
    get_filename_component(real_dir "${real}" DIRECTORY)
    list(APPEND dirs "${dir}" "${real_dir}")
  endforeach()
  list(REMOVE_DUPLICATES dirs)
  if(NOT dirs)
    return()
  endif()
  list(JOIN dirs ":" path)
  set(option "LINKER:-rpath,${path}")
  if(arg_BUILD_INTERFACE)
    set(option "$<BUILD_INTERFACE:${option}>")
  endif()
  target_link_options(${target} INTERFACE "${option}")
endfunction()

# tensorplay::tensorplay, the target programs link: the headers (`headers`, the INTERFACE target
# tensorplay::header_only) with the library's non-template functions compiled once (`source`,
# tensorplay/src/library.cpp, built here by the consumer's C++ compiler) instead of in every
# translation unit that includes them (tensorplay/config.hpp, TENSORPLAY_SEPARATE_COMPILATION,
# defined for everything that links it). When the consumer has not enabled C++, there is no
# compiler for that source: tensorplay::tensorplay is then the header-only target. A program links
# tensorplay::tensorplay or tensorplay::header_only, never both. tensorplay::compiled is the
# name the compiled target had before it became the default.
function(tensorplay_add_default_target source headers)
  if(TARGET tensorplay::tensorplay)
    return()
  endif()
  get_property(languages GLOBAL PROPERTY ENABLED_LANGUAGES)
  if(NOT "CXX" IN_LIST languages)
    add_library(tensorplay::tensorplay ALIAS ${headers})
    return()
  endif()
  add_library(tensorplay_compiled STATIC "${source}")
  add_library(tensorplay::tensorplay ALIAS tensorplay_compiled)
  add_library(tensorplay::compiled ALIAS tensorplay_compiled)
  target_link_libraries(tensorplay_compiled PUBLIC ${headers})
  target_compile_definitions(tensorplay_compiled PUBLIC TENSORPLAY_SEPARATE_COMPILATION)
  set_target_properties(tensorplay_compiled PROPERTIES POSITION_INDEPENDENT_CODE ON)
  # A single-config build with no CMAKE_BUILD_TYPE gives the compiler no -O flag: library.cpp
  # (replay, stage_and_launch, capture) would run unoptimised code, 1.7x raw CUDA per 1-kernel
  # capture in bench/replay_bench_compiled at -O0. It gets -O2 then, as Bazel's //:tensorplay does
  # outside -c dbg; any build type the consumer sets keeps its own flags.
  get_property(multi_config GLOBAL PROPERTY GENERATOR_IS_MULTI_CONFIG)
  if(NOT multi_config AND NOT CMAKE_BUILD_TYPE AND CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    target_compile_options(tensorplay_compiled PRIVATE -O2)
  endif()
endfunction()
