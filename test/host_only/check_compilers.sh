#!/usr/bin/env bash
# test/host_only/check_compilers.sh: tensorplay's headers under host compilers, without a warning.
# Run by Bazel (sh_test //test:host_compilers_test) from the runfiles root, or by hand from the
# repository root. With every host compiler found here (g++, clang++):
#   - host_only_test.cpp compiles (with only the CUDA include folders);
#   - every public header (tensorplay/*.hpp but thrust.hpp, which needs nvcc) compiles alone, and
#     the option structs written as the README writes them (designated initialisers naming some
#     members) compile, with -Wall -Wextra -Wpedantic -Wshadow -Wconversion -Werror. The CUDA
#     folders are -isystem: their warnings are CUDA's, not ours.
# With nvcc (${CUDA_PATH:-/usr/local/cuda}/bin/nvcc), the same designated initialisers under nvcc's
# warnings and -Xcompiler=-Wall,-Wextra, all as errors; //:header_check compiles every header
# alone with those flags.
set -euo pipefail
cuda=${CUDA_PATH:-/usr/local/cuda}
src=test/host_only/host_only_test.cpp
[[ -f "$src" ]] || { echo "missing $src (run from the workspace or runfiles root)"; exit 1; }
tmp=${TEST_TMPDIR:-$(mktemp -d)}
system=(-isystem "$cuda/include" -isystem "$cuda/include/cccl")
strict=(-Wall -Wextra -Wpedantic -Wshadow -Wconversion -Werror)

# Every option struct of the public API as the README and the guide write them.
cat >"$tmp/readme_idioms.cpp" <<'CPP'
#include <tensorplay/graph.hpp>
namespace tp = tensorplay;
void capture_on(tp::Graph& graph, tp::StreamRef stream) {
  graph.capture([] {}, {.stream = stream});
  graph.capture_begin({.capture_error_mode = tp::CaptureErrorMode::Relaxed, .stream = stream});
  graph.capture_end();
  graph.capture([] {}, {.pool = graph.pool(), .stream = stream});
}
tp::Graph graph_sharing(const tp::Graph& other) { return tp::Graph({.pool = other.pool()}); }
tp::Graph uploaded_graph() { return tp::Graph({.upload = true}); }
tp::Graph global_mode_graph() { return tp::Graph({.capture_error_mode = tp::CaptureErrorMode::Global}); }
tp::Pool offloadable_pool() { return tp::graph_pool_handle({.offloadable = true}); }
tp::BucketOptions padded_buckets() { return {.zero_fill_tail = true}; }
tp::BucketOptions bounded_buckets(tp::Pool pool) { return {.pool = pool, .max_executables = 4}; }
tp::CaptureOptions on_stream(tp::StreamRef stream) { return {.stream = stream}; }
tp::GraphOptions with_pool(tp::Pool pool) { return {.pool = pool}; }
CPP

failed=0
check() {  # check <what> <command...>: runs the command, reports, counts a failure
  local what=$1
  shift
  if "$@" >"$tmp/out.txt" 2>&1; then
    echo "ok    $what"
  else
    echo "FAIL  $what"
    head -n 40 "$tmp/out.txt"
    failed=$((failed + 1))
  fi
}

tried=0
for cxx in g++ clang++; do
  command -v "$cxx" >/dev/null 2>&1 || { echo "$cxx: not installed, skipped"; continue; }
  echo "$cxx: $("$cxx" --version | head -n 1)"
  check "$cxx $src" "$cxx" -std=c++20 -fsyntax-only -Wall -Wextra -Werror -I. "${system[@]}" "$src"
  for h in tensorplay/*.hpp; do
    [[ "$h" == tensorplay/thrust.hpp ]] && continue
    printf '#include <%s>\n' "${h}" >"$tmp/alone.cpp"
    check "$cxx $h alone" "$cxx" -std=c++20 -fsyntax-only "${strict[@]}" -I. "${system[@]}" "$tmp/alone.cpp"
    check "$cxx $h alone, separate compilation" "$cxx" -std=c++20 -fsyntax-only "${strict[@]}" \
      -DTENSORPLAY_SEPARATE_COMPILATION -I. "${system[@]}" "$tmp/alone.cpp"
  done
  # tensorplay/src/library.cpp, which compiles every definition out of line.
  check "$cxx tensorplay/src/library.cpp" "$cxx" -std=c++20 -fsyntax-only "${strict[@]}" \
    -DTENSORPLAY_SEPARATE_COMPILATION -I. "${system[@]}" tensorplay/src/library.cpp
  check "$cxx README idioms" "$cxx" -std=c++20 -fsyntax-only "${strict[@]}" -I. "${system[@]}" "$tmp/readme_idioms.cpp"
  tried=$((tried + 1))
done
((tried > 0)) || { echo "no host compiler found"; exit 1; }

if [[ -x "$cuda/bin/nvcc" ]]; then
  check "nvcc README idioms" env TMPDIR="$tmp" "$cuda/bin/nvcc" -std=c++20 -arch=sm_90 -Werror=all-warnings \
    -Xcompiler=-Wall,-Wextra,-Werror -I. -x cu -c "$tmp/readme_idioms.cpp" -o "$tmp/readme_idioms.o"
else
  echo "nvcc: not found at $cuda/bin/nvcc, skipped"
fi
((failed == 0)) || { echo "$failed check(s) failed"; exit 1; }
echo "all checks passed"
