#!/usr/bin/env bash
# Configures and builds omnitron into build/ (CUDA is compiled in when nvcc is found, the
# kernels' HIP compile check when hipcc is found, at every run: a build/ that
# scripts/demo.sh configured without them gets them back).
# CUDA is built for sm_80 and sm_90 (A100, H100/H200) at every run, so a build/ that
# scripts/test.sh configured for its compile check only (sm_90, no GPU present) gets both back;
# the ASan + UBSan build of the emulated GPU tests (OMNITRON_ASAN_TESTS) is test.sh's only.
# Extra arguments go to cmake and win, e.g. scripts/build.sh -DOMNITRON_CUDA=OFF or
# scripts/build.sh -DCMAKE_CUDA_ARCHITECTURES=100
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
found() { command -v "$1" >/dev/null 2>&1 || [[ -x "$2/$1" ]]; }
defaults=(-DOMNITRON_CUDA=OFF -DOMNITRON_HIP_CHECK=OFF -DOMNITRON_ASAN_TESTS=OFF)
found nvcc /usr/local/cuda/bin && defaults[0]=-DOMNITRON_CUDA=ON && defaults+=("-DCMAKE_CUDA_ARCHITECTURES=80;90")
found hipcc /opt/rocm/bin && defaults[1]=-DOMNITRON_HIP_CHECK=ON
cmake -S "$root" -B "$root/build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${defaults[@]}" "$@" >/dev/null
ninja -C "$root/build"
