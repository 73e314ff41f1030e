#!/usr/bin/env bash
# Installs what is needed, builds everything (warnings are errors; CUDA compiled and
# linked when nvcc is present; the GPU kernels also compiled as HIP by Debian's hipcc) and
# runs the tests (the GPU kernels run on the GPU emulator at 32 and 64 lanes, with its race and
# bounds checks, and again in an ASan + UBSan build; device tests skip without a GPU).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh" --hip
bash "$root/scripts/build.sh" -DOMNITRON_WERROR=ON
cd "$root/build"
ctest --output-on-failure -j 2 --timeout 900
# The emulated GPU tests once more under ASan + UBSan: a second, small build (-O1; the emulated
# GPU library and its 32-lane test binary only; the long training test is left out).
cmake -S "$root" -B "$root/build-sanitize" -G Ninja -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_FLAGS_RELEASE=-O1 -DNDEBUG" \
  -DOMNITRON_SANITIZE=ON -DOMNITRON_CUDA=OFF -DOMNITRON_HIP_CHECK=OFF -DOMNITRON_WERROR=ON >/dev/null
ninja -C "$root/build-sanitize" omnitron_gpu_emulated_tests
cd "$root/build-sanitize" && ctest --output-on-failure -j 2 --timeout 900 -R '^emulated\.' -E Bf16TrainingTracks
