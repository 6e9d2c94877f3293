#!/usr/bin/env bash
# Installs what DTP needs on Debian 12 (or Ubuntu): compiler, CMake, GoogleTest, CLI11,
# Open MPI, Doxygen + graphviz, matplotlib, git.
# Idempotent and quick on a ready machine: apt runs only when a package is missing.
# The CUDA toolkit is optional and never installed here; without nvcc the
# CUDA parts are simply not built.
set -euo pipefail

# What building, grading and training need.
packages=(
  build-essential cmake g++ git
  libgtest-dev
  libcli11-dev   # the one command-line parser of apps/ and bench/
  libopenmpi-dev openmpi-bin
  python3 python3-matplotlib
)
# What the whole test suite and the docs also need (CI, course staff). A
# student's grading job skips them: --grading.
extras=(
  doxygen graphviz
  libjs-mathjax  # MathJax 2, copied into the HTML docs so formulas render offline
  chromium       # tools/check_docs_html.py renders the docs headless (~80 MB download, ~290 MB installed)
  python3-torch libopenblas0  # the PyTorch cross-check (ctest -L crosscheck)
  clang-format-14             # tools/check-format.sh: the version the sources are formatted with
)
case "${1:-}" in
  "") packages+=("${extras[@]}") ;;
  --grading) ;;
  -h|--help)
    echo "usage: tools/setup-debian.sh [--grading]   (--grading: only what ./dtp grade needs)"
    exit 0 ;;
  *) echo "setup: unknown argument '$1' (expected --grading or nothing)" >&2; exit 2 ;;
esac

if ! command -v dpkg-query >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1; then
  echo "setup: this script needs a Debian-like system (dpkg and apt-get)." >&2
  echo "setup: install by hand: ${packages[*]}" >&2
  exit 1
fi

missing=()
for package in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$package" 2>/dev/null || true)
  if [[ "$status" != "install ok installed" ]]; then
    missing+=("$package")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "setup: all packages present"
else
  if [[ $(id -u) -eq 0 ]]; then
    as_root=()
  elif command -v sudo >/dev/null 2>&1; then
    as_root=(sudo)
  else
    echo "setup: missing packages: ${missing[*]}" >&2
    echo "setup: not root and no sudo; as root run: apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  "${as_root[@]}" apt-get update -qq
  "${as_root[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  echo "setup: installed ${#missing[@]} package(s)"
fi

# CUDA is optional: say what will happen, never fail on it.
if command -v nvcc >/dev/null 2>&1 || [[ -x /usr/local/cuda/bin/nvcc ]]; then
  echo "setup: CUDA toolkit found; the CUDA parts will be built"
else
  echo "setup: no CUDA toolkit (nvcc); building the CPU and MPI parts only"
fi
