// tensorplay/src/library.cpp: the library's non-template functions, compiled once, for programs
// built with TENSORPLAY_SEPARATE_COMPILATION (tensorplay/config.hpp; the default targets,
// Bazel's //:tensorplay and CMake's tensorplay::tensorplay, build this file and define it for
// their dependents). Header-only programs do not use this file.
//
// Every header that <tensorplay/graph.hpp> brings ends with its definitions, under
// TENSORPLAY_DEFINE_BODIES: defined here, they are compiled here as ordinary functions.
#if !defined(TENSORPLAY_SEPARATE_COMPILATION)
#error "tensorplay/src/library.cpp is for builds with TENSORPLAY_SEPARATE_COMPILATION defined"
#endif
#define TENSORPLAY_DEFINE_LIBRARY 1

#include <tensorplay/graph.hpp>
