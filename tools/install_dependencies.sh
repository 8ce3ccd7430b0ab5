#!/usr/bin/env bash
# Installs what deltaproof builds against, from Debian 12's packages. Idempotent: safe to rerun.
# CUDA is optional: kernels and GPU tests build when nvcc is on PATH (or in /usr/local/cuda/bin).
set -euo pipefail
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update
$SUDO apt-get install -y --no-install-recommends \
  build-essential cmake ninja-build pkg-config ccache python3 \
  libeigen3-dev libboost-dev libgmp-dev libmpfr-dev \
  libgtest-dev librapidcheck-dev libbenchmark-dev libcli11-dev \
  nlohmann-json3-dev libzip-dev \
  python3-dev pybind11-dev python3-numpy python3-pytest python3-matplotlib python3-pip python3-setuptools python3-wheel python3-build python3-venv \
  python3-nbclient python3-nbformat python3-ipykernel
