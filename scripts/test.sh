#!/usr/bin/env bash
# Installs what is needed, builds everything (warnings are errors; CUDA compiled and
# linked when nvcc is present; the GPU kernels also compiled as HIP by Debian's hipcc) and
# runs the tests (the GPU kernels run on the GPU emulator; device tests skip without a GPU).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh" --hip
# The HIP compile check is asked for by name: a configure from before hipcc was installed
# (scripts/demo.sh, run first as the README says) cached OMNITRON_HIP_CHECK=OFF, which
# would otherwise skip it without a word.
hip_check=()
if command -v hipcc >/dev/null 2>&1 || [[ -x /opt/rocm/bin/hipcc ]]; then
  hip_check=(-DOMNITRON_HIP_CHECK=ON)
fi
bash "$root/scripts/build.sh" -DOMNITRON_WERROR=ON "${hip_check[@]}"

# What the check compiled (said again after the tests, whose output is long).
hip_report() {
  local cache="$root/build/CMakeCache.txt" objects archs
  objects=$(find "$root/build/hip-check" -name '*.o' 2>/dev/null | wc -l)
  if [[ ${#hip_check[@]} -eq 0 ]]; then
    echo "HIP compile check: skipped, no hipcc (scripts/setup.sh --hip installs Debian's)"
  elif [[ "$objects" -gt 0 ]]; then
    archs=$(sed -n 's/^OMNITRON_HIP_CHECK_ARCHS:[A-Z]*=//p' "$cache")
    echo "HIP compile check: $objects GPU kernel files compiled by hipcc for" \
      "${archs//;/ and } (build/hip-check/)"
  else
    archs=$(sed -n 's/^OMNITRON_HIP_ARCHS:[A-Z]*=//p' "$cache")
    echo "HIP compile check: the HIP backend itself is built (OMNITRON_HIP=ON), for" \
      "${archs//;/ and }"
  fi
}
hip_report
cd "$root/build"
status=0
ctest --output-on-failure -j 2 --timeout 900 || status=$?
hip_report
exit "$status"
