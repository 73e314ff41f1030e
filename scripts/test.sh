#!/usr/bin/env bash
# Installs what is needed, builds everything (warnings are errors; CUDA compiled and
# linked when nvcc is present) and runs the tests.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
bash "$root/scripts/build.sh" -DOMNITRON_WERROR=ON
cd "$root/build"
ctest --output-on-failure -j 2 --timeout 900
