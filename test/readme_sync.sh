#!/usr/bin/env bash
# test/readme_sync.sh: the README's first code block (without its #include line) is, line for
# line, the block between "README begin" and "README end" in test/readme_test.cu (indentation
# aside), so that the example the README shows is the one the GPU suite runs.
set -euo pipefail
readme=README.md
test=test/readme_test.cu
[[ -f "$readme" && -f "$test" ]] || { echo "run from the workspace or runfiles root"; exit 1; }
shown=$(awk '/^```cpp$/ { inside = 1; next } inside && /^```$/ { exit } inside && !/^#include/' "$readme" | sed 's/^ *//')
run=$(awk '/\/\/ README begin/ { inside = 1; next } /\/\/ README end/ { exit } inside' "$test" | sed 's/^ *//')
if [[ "$shown" != "$run" ]]; then
  echo "README.md's first example and $test differ:"
  diff <(echo "$shown") <(echo "$run") || true
  exit 1
fi
echo "README.md's first example is the one test/readme_test.cu runs ($(echo "$shown" | wc -l) lines)"
