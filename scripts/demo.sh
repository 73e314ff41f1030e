#!/usr/bin/env bash
# Installs what is needed, builds, and trains the demo: a small byte-level GPT on the
# King James Bible, on the CPU, in a few minutes, saved to build/demo-model.
# Arguments go to `omnitron train` and override the demo preset.
#
# Builds the omnitron binary only (no tests, benchmarks or GPU kernels), into build/, the
# directory scripts/build.sh and scripts/test.sh use. A fresh build/ is configured without
# the GPU backends unless an argument asks for a GPU (--device cuda, hip or auto); one that
# is configured already keeps its settings.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"

device=cpu
for ((i = 1; i <= $#; ++i)); do
  case "${!i}" in
    --device=*) device="${!i#--device=}" ;;
    --device) j=$((i + 1)) && device="${!j:-cpu}" ;;
  esac
done
gpu=()
case "$device" in
  cuda) gpu=(-DOMNITRON_CUDA=ON) ;;
  hip) gpu=(-DOMNITRON_CUDA=OFF -DOMNITRON_HIP=ON) ;;
  auto) ;;  # CMake's default: CUDA when nvcc is found
  *) [[ -f "$root/build/CMakeCache.txt" ]] || gpu=(-DOMNITRON_CUDA=OFF -DOMNITRON_HIP_CHECK=OFF) ;;
esac
cmake -S "$root" -B "$root/build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${gpu[@]}" >/dev/null
ninja -C "$root/build" omnitron
exec "$root/build/omnitron" train "$@"
