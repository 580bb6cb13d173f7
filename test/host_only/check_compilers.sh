#!/usr/bin/env bash
# test/host_only/check_compilers.sh: <tensorplay/graph.hpp> in translation units compiled by host
# compilers, with only the CUDA include folders: host_only_test.cpp must compile with every
# compiler found here (g++, clang++). Run by Bazel (sh_test) from the runfiles root.
set -euo pipefail
cuda=${CUDA_PATH:-/usr/local/cuda}
src=test/host_only/host_only_test.cpp
[[ -f "$src" ]] || { echo "missing $src (run from the workspace or runfiles root)"; exit 1; }
tried=0
for cxx in g++ clang++; do
  command -v "$cxx" >/dev/null 2>&1 || { echo "$cxx: not installed, skipped"; continue; }
  "$cxx" -std=c++20 -fsyntax-only -Wall -Wextra -Wno-missing-field-initializers -Werror -I. -I"$cuda/include" "$src"
  echo "$cxx ($("$cxx" --version | head -n 1)): compiles $src"
  tried=$((tried + 1))
done
((tried > 0)) || { echo "no host compiler found"; exit 1; }
