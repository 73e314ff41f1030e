#!/usr/bin/env bash
# Installs what is needed, builds everything (warnings are errors; CUDA compiled and
# linked when nvcc is present; the GPU kernels also compiled as HIP by Debian's hipcc) and
# runs the tests (the GPU kernels run on the GPU emulator; device tests skip without a GPU).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh" --hip
bash "$root/scripts/build.sh" -DOMNITRON_WERROR=ON
cd "$root/build"
ctest --output-on-failure -j 2 --timeout 900
