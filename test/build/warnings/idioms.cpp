// test/build/warnings/idioms.cpp: the README's and the guide's idioms in a host-only translation
// unit (g++, clang++): idioms_common.hpp and idioms_libraries.hpp (cuBLAS, NCCL), written as the
// documentation writes them. tools/check_warnings compiles it with -Wall -Wextra -Werror at -O0 and
// -O2; it is never linked or run.
#ifdef __CUDACC__
#error "idioms.cpp is for host compilers; idioms.cu is nvcc's"
#endif

#include "idioms_common.hpp"
#include "idioms_libraries.hpp"
