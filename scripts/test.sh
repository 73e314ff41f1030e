#!/usr/bin/env bash
# Installs what is needed, builds everything (warnings are errors; CUDA compiled and
# linked when nvcc is present; the GPU kernels also compiled as HIP by Debian's hipcc) and
# runs the tests (the GPU kernels run on the GPU emulator at 32 and 64 lanes, with its race and
# bounds checks, and again built with ASan + UBSan; device tests skip without a GPU).
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
# Without a GPU the CUDA build is a compile and link check, and one architecture checks the
# same source (both take the sm_80+ paths): sm_90 only, which halves nvcc's time.
# scripts/build.sh builds sm_80 and sm_90 again.
cuda_archs=()
if ! nvidia-smi -L >/dev/null 2>&1; then
  cuda_archs=(-DCMAKE_CUDA_ARCHITECTURES=90)
  echo "No GPU visible: CUDA is compiled and linked for sm_90 only, as a check"
fi
# The emulated GPU tests run twice: with the emulator's race and bounds checks, and under ASan +
# UBSan (OMNITRON_ASAN_TESTS: tests/CMakeLists.txt says which of them).
bash "$root/scripts/build.sh" -DOMNITRON_WERROR=ON -DOMNITRON_ASAN_TESTS=ON "${hip_check[@]}" \
  "${cuda_archs[@]}"

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
