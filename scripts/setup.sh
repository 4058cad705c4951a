#!/usr/bin/env bash
# Installs every Debian package that cabm's build, tests and main job need.
# Works as root or through sudo; does nothing when everything is present.
# Usage: setup.sh [--list | --no-venv]
set -euo pipefail

packages=(
  g++ cmake ninja-build pkg-config
  libdnnl-dev            # GEMM (oneDNN)
  ocl-icd-opencl-dev     # oneDNN's CMake package file requires OpenCL; libdnnl-dev only Recommends it
  libopenblas-openmp-dev # GEMM (OpenBLAS, OpenMP build): the weight-gradient products
  nlohmann-json3-dev     # safetensors headers, checkpoints
  libcli11-dev libfmt-dev
  libgtest-dev libbenchmark-dev
  clang-14               # the fuzz build (scripts/fuzz.sh, third pass of scripts/test.sh)
  libclang-rt-14-dev     # libFuzzer and clang's ASan/UBSan runtimes; clang-14 does not depend on it
  libomp-14-dev          # OpenMP for clang (omp.h, libomp.so): the library links OpenMP::OpenMP_CXX
  python3-torch python3-numpy   # PyTorch reference fixtures (tests only; never linked)
  python3-venv           # the venv for the Hugging Face fixtures (scripts/setup_venv.sh)
  libutf8proc-dev        # Unicode normalisation and categories for the tokenizers
  libsentencepiece-dev   # SentencePiece models (XLM-R tokenizers)
  openmpi-bin libopenmpi-dev   # data-parallel training over MPI (optional at build time)
  fortunes               # default training corpus
  wamerican wngerman wfrench wspanish witalian   # langid demo word lists
)

# `setup.sh --list` prints the list, one name a line, and installs nothing: the test
# scripts/check_setup_packages.py reads it to prove the list covers the build.
if [ "${1:-}" = "--list" ]; then
  printf '%s\n' "${packages[@]}"
  exit 0
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo_cmd=()
  if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
  echo "setup: installing ${missing[*]}"
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The tests' Python packages that Debian lacks (PyPI, pinned) go into a virtual environment;
# the main job does not need them (`setup.sh --no-venv`).
if [ "${1:-}" != "--no-venv" ]; then
  bash "$(dirname "$0")/setup_venv.sh"
fi
