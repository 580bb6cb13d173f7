# shellcheck shell=bash
# Helpers shared by tools/test, tools/demo, tools/gpu/build, tools/gpu/run and .ci/run.
# Source it; it defines functions only (and TP_* variables).

TP_PACKAGES=(bazel-bootstrap libboost-test-dev libbenchmark-dev)
TP_MIN_CUDA_MAJOR=12
TP_MIN_CUDA_MINOR=4

tp_die() {
  echo "error: $*" >&2
  exit 1
}

# Prints the nvcc to use: $CUDA_PATH/bin/nvcc, else /usr/local/cuda/bin/nvcc (what the
# Bazel rules run by default), else the first nvcc on PATH.
tp_find_nvcc() {
  local c
  for c in ${CUDA_PATH:+"$CUDA_PATH/bin/nvcc"} /usr/local/cuda/bin/nvcc "$(command -v nvcc 2>/dev/null || true)"; do
    if [[ -n "$c" && -x "$c" ]]; then
      echo "$c"
      return 0
    fi
  done
  return 1
}

# Exits with a clear message unless a CUDA toolkit >= 12.4 is installed. Exports
# CUDA_PATH when nvcc lives elsewhere than /usr/local/cuda (the Bazel rules then run
# $CUDA_PATH/bin/nvcc; see tools/bazel/cuda.bzl and .bazelrc).
tp_check_cuda() {
  local nvcc ver major minor root
  if ! nvcc=$(tp_find_nvcc); then
    tp_die "nvcc not found (looked in \$CUDA_PATH/bin, /usr/local/cuda/bin and PATH).
tensorplay needs the CUDA toolkit ${TP_MIN_CUDA_MAJOR}.${TP_MIN_CUDA_MINOR} or newer: https://developer.nvidia.com/cuda-downloads"
  fi
  ver=$("$nvcc" --version 2>/dev/null | sed -n 's/.*release \([0-9][0-9]*\)\.\([0-9][0-9]*\).*/\1.\2/p' | head -n 1)
  [[ -n "$ver" ]] || tp_die "could not read the CUDA version from '$nvcc --version'."
  major=${ver%%.*}
  minor=${ver#*.}
  if ((major < TP_MIN_CUDA_MAJOR || (major == TP_MIN_CUDA_MAJOR && minor < TP_MIN_CUDA_MINOR))); then
    tp_die "CUDA $ver found ($nvcc), but tensorplay needs CUDA ${TP_MIN_CUDA_MAJOR}.${TP_MIN_CUDA_MINOR} or newer."
  fi
  root=$(dirname "$(dirname "$nvcc")")
  if [[ "$root" != /usr/local/cuda ]]; then
    export CUDA_PATH="$root"
  fi
  # The Bazel repository @cuda (WORKSPACE) is /usr/local/cuda: the static runtime must be there.
  [[ -f /usr/local/cuda/lib64/libcudart_static.a ]] ||
    tp_die "/usr/local/cuda/lib64/libcudart_static.a not found: link your CUDA toolkit to /usr/local/cuda."
  echo "CUDA $ver: $nvcc"
}

# Is Debian package $1 installed?
tp_have_package() {
  dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'ok installed'
}

# Installs TP_PACKAGES plus "$@" with apt-get when some are missing (sudo when not root).
tp_install_packages() {
  local p missing=() sudo=()
  if ! command -v dpkg-query >/dev/null 2>&1; then
    # Not Debian/Ubuntu: just check for what the build needs.
    command -v bazel >/dev/null 2>&1 || tp_die "bazel not found and this is not a Debian/Ubuntu system: install Bazel 4.2.3 by hand."
    [[ -f /usr/include/boost/test/included/unit_test.hpp ]] || tp_die "Boost.Test headers not found."
    return 0
  fi
  for p in "${TP_PACKAGES[@]}" "$@"; do
    tp_have_package "$p" || missing+=("$p")
  done
  ((${#missing[@]} == 0)) && return 0
  command -v apt-get >/dev/null 2>&1 || tp_die "missing packages (${missing[*]}) and no apt-get."
  if ((EUID != 0)); then
    command -v sudo >/dev/null 2>&1 || tp_die "missing packages (${missing[*]}): run as root or install them."
    sudo=(sudo)
  fi
  echo "Installing ${missing[*]} with apt-get..."
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

# Bazel flags for logs that are not a terminal (CI, redirected output).
tp_bazel_log_flags() {
  if [[ ! -t 2 ]]; then
    echo "--curses=no --color=no --show_progress_rate_limit=30"
  fi
}

# Prints "passed failed skipped" for one JUnit XML file written by Boost.Test; returns 1
# (printing nothing) when the file is missing, empty or unreadable. python3 when there is
# one, else awk (Boost writes every <testcase>, <skipped/>, <failure>, <error> tag at the
# start of a line).
tp_count_junit() {
  local f=$1 here
  [[ -s "$f" ]] || return 1
  here=$(dirname "${BASH_SOURCE[0]}")
  if command -v python3 >/dev/null 2>&1; then
    python3 "$here/junit.py" count "$f"
    return
  fi
  awk '
    function close_case() { if (open) { if (sk) s++; else if (fl) f++; else p++ } open = 0 }
    /<testcase[ >]/ { close_case(); open = 1; sk = 0; fl = 0; if ($0 ~ /<testcase[^>]*\/>/) close_case() }
    /^<skipped/ { sk = 1 }
    /^<(failure|error)[ >]/ { fl = 1 }
    /<\/testcase>/ { close_case() }
    /<\/testsuite>/ { ended = 1 }
    END { close_case(); if (!ended) exit 1; print p + 0, f + 0, s + 0 }
  ' "$f"
}
