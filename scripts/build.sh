#!/usr/bin/env bash
# Configures and builds omnitron into build/ (CUDA is compiled in when nvcc is found).
# Extra arguments go to cmake, e.g. scripts/build.sh -DOMNITRON_CUDA=OFF
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cmake -S "$root" -B "$root/build" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
ninja -C "$root/build"
