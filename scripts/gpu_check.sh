#!/usr/bin/env bash
# One command for a machine with a GPU: builds omnitron with its GPU backend into build-gpu/
# (CUDA when nvcc is found, else HIP when hipcc is), prints `omnitron info`, runs the GPU op
# tests on the device and the GPU benchmarks that exist, and ends with a summary table.
#   bash scripts/gpu_check.sh                 from the repository root
#   bash scripts/gpu_check.sh -DFOO=BAR ...   extra arguments go to cmake
# Needs a compiler, cmake and the GPU toolkit; omnitron's Debian packages are installed with
# scripts/setup.sh when some are missing and apt can reach its mirrors (skipped offline).
# Logs: build-gpu/gpu_check/*.log. Exits non-zero when the build or a check failed, or when
# no GPU was visible (every device test would only skip).
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$root/build-gpu"
logs="$build/gpu_check"
mkdir -p "$logs"
cd "$root" || exit 1

declare -a summary=()
status=0
note() { summary+=("$(printf '%-22s %s' "$1" "$2")"); }
say() { printf '\n==== %s\n' "$*"; }

# ---- Packages: only when something is missing and apt works (the machine may be offline) ----
packages=(cmake pkg-config libopenblas-openmp-dev libgtest-dev libpcre2-dev
          libsentencepiece-dev libzstd-dev libyaml-dev)
missing=()
if command -v dpkg-query >/dev/null 2>&1; then
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
fi
if ((${#missing[@]} == 0)); then
  note "packages" "present (or not a Debian system)"
elif [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
  note "packages" "missing ${missing[*]}; not root or no apt-get: install them by hand"
else
  say "apt: ${missing[*]} missing; checking that apt can reach its mirrors"
  # apt-get update exits 0 after failed fetches unless told otherwise; count W:/E: lines too.
  if timeout 60 apt-get update -qq >"$logs/apt.log" 2>&1 && ! grep -qE '^(W|E):' "$logs/apt.log"
  then
    if bash scripts/setup.sh >"$logs/setup.log" 2>&1; then
      note "packages" "installed by scripts/setup.sh"
    else
      note "packages" "scripts/setup.sh failed (see $logs/setup.log); building anyway"
    fi
  else
    note "packages" "offline: missing ${missing[*]}; building anyway"
  fi
fi

# ---- Configure and build ----
if command -v nvcc >/dev/null 2>&1 || [[ -x /usr/local/cuda/bin/nvcc ]]; then
  backend=CUDA
  gpu_flags=(-DOMNITRON_CUDA=ON -DOMNITRON_HIP=OFF)
  # Compile the kernels for the GPUs present only (much faster than every default target).
  if nvidia-smi -L >/dev/null 2>&1; then gpu_flags+=(-DCMAKE_CUDA_ARCHITECTURES=native); fi
  smi="nvidia-smi"
elif command -v hipcc >/dev/null 2>&1; then
  backend=HIP
  gpu_flags=(-DOMNITRON_HIP=ON -DOMNITRON_CUDA=OFF)
  smi="rocm-smi"
else
  echo "gpu_check: neither nvcc nor hipcc found: install the CUDA toolkit or ROCm" >&2
  exit 1
fi
say "GPU: $backend"
if command -v "$smi" >/dev/null 2>&1; then "$smi" 2>&1 | tee "$logs/smi.log"; else
  echo "$smi not found"; fi

# Ninja when present, unless an earlier run chose the generator; ccache when present.
generator=()
[[ ! -f "$build/CMakeCache.txt" ]] && command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
if command -v ccache >/dev/null 2>&1; then
  gpu_flags+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  [[ $backend == CUDA ]] && gpu_flags+=(-DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
say "configure and build in build-gpu/"
build_ok=1
targets=()
if cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release "${gpu_flags[@]}" \
     "$@" >"$logs/configure.log" 2>&1; then
  # What this configuration can build of: the binary, the device tests, the NCCL check and the
  # GPU benchmarks (each exists only once its sources and build wiring do).
  if [[ -f "$build/build.ninja" ]]; then
    available=$(ninja -C "$build" -t targets all 2>/dev/null | sed -n 's|^\([^:]*/\)\{0,1\}\([A-Za-z0-9_]*\): .*|\2|p')
  else
    available=$(make -C "$build" help 2>/dev/null | sed -n 's/^\.\.\. \([A-Za-z0-9_]*\)$/\1/p')
  fi
  wanted=(omnitron omnitron_gpu_tests omnitron_nccl_check bench_gpu_ops bench_gpu_train_step)
  for t in "${wanted[@]}"; do
    grep -qx "$t" <<<"$available" && targets+=("$t")
  done
  echo "targets: ${targets[*]}"
  if ! cmake --build "$build" --parallel "$(nproc)" --target "${targets[@]}" \
       >"$logs/build.log" 2>&1; then
    grep -E 'error|Error' "$logs/build.log" | head -30
    build_ok=0
  fi
else
  tail -30 "$logs/configure.log"
  build_ok=0
fi
if ((build_ok)); then note "build ($backend)" "ok"; else
  note "build ($backend)" "FAILED (see $logs/configure.log, build.log)"
  status=1
fi

# ---- omnitron info ----
gpus=0
if [[ -x "$build/omnitron" ]]; then
  say "omnitron info"
  if "$build/omnitron" info 2>&1 | tee "$logs/info.log"; then
    devices=$(grep -m1 '^gpu devices:' "$logs/info.log" | sed 's/^gpu devices: *//')
    gpus=$(grep -cE '^  [0-9]+: ' "$logs/info.log")
    if ((gpus > 0)); then note "omnitron info" "$devices"; else
      note "omnitron info" "FAILED: no GPU visible: ${devices:-?}"
      status=1
    fi
  else
    note "omnitron info" "FAILED"
    status=1
  fi
fi

# ---- GPU op tests on the device ----
tests="$build/tests/omnitron_gpu_tests"
if [[ -x "$tests" ]]; then
  say "GPU op tests (device; failures in full, passes counted)"
  timeout 1800 "$tests" --gtest_brief=1 2>&1 | tee "$logs/gpu_tests.log"
  rc=${PIPESTATUS[0]}
  count() { grep -oE "^\[  $1 *\] [0-9]+ test" "$logs/gpu_tests.log" | grep -oE '[0-9]+' | tail -1; }
  passed=$(count PASSED)
  failed=$(count FAILED)
  skipped=$(count SKIPPED)
  line="passed ${passed:-0}, failed ${failed:-0}, skipped ${skipped:-0} (exit $rc)"
  if ((rc != 0)); then
    status=1
  elif ((${passed:-0} == 0)); then
    line="$line: none ran on a device"
    status=1
  fi
  note "gpu op tests" "$line"
  # Whether the MoE experts' GEMMs ran as one grouped cuBLAS call here (the GroupedGemm tests
  # print it; they compare the grouped call with one GEMM per expert either way).
  grouped=$(grep -m1 '^\[grouped gemm\] this device: ' "$logs/gpu_tests.log" |
            sed 's/^\[grouped gemm\] this device: //')
  note "grouped gemm" "${grouped:-not reported (GroupedGemm tests did not run)}"
else
  note "gpu op tests" "not built"
  status=1
fi

# ---- NCCL communicator on every GPU (one rank per GPU) ----
check="$build/tests/omnitron_nccl_check"
if [[ -x "$check" ]]; then
  say "NCCL communicator check on $gpus GPU(s)"
  if ((gpus > 1)) && command -v mpirun >/dev/null 2>&1; then
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 300 \
      mpirun -np "$gpus" --oversubscribe "$check" 2>&1 | tee "$logs/nccl_check.log"
  else
    timeout 300 "$check" 2>&1 | tee "$logs/nccl_check.log"
  fi
  rc=${PIPESTATUS[0]}
  if ((rc == 0)); then note "nccl check" "$(tail -1 "$logs/nccl_check.log")"; else
    note "nccl check" "FAILED (exit $rc)"
    status=1
  fi
else
  note "nccl check" "not built (OMNITRON_NCCL not wired or NCCL not found)"
fi

# ---- Training layouts over NCCL against one GPU (two GPUs or more) ----
if ((gpus > 1)) && [[ -x "$build/omnitron" && -x "$check" ]]; then
  say "training layouts on $gpus GPUs against one (scripts/gpu_layouts.sh)"
  bash scripts/gpu_layouts.sh "$build" "$gpus" "$logs/layouts" 2>&1 | tee "$logs/layouts.log"
  if ((PIPESTATUS[0] == 0)); then
    note "gpu layouts" "$(grep -c 'worst relative' "$logs/layouts.log") layouts match one GPU"
  else
    note "gpu layouts" "FAILED: $(grep -cE 'FAILED|DIFFERS' "$logs/layouts.log") layouts"
    status=1
  fi
else
  note "gpu layouts" "skipped: $gpus GPU(s) visible, the layouts need 2 or more"
fi

# ---- Benchmarks that exist ----
bench_lines=()
run_bench() {  # name, then its command line
  local name=$1
  shift
  say "$name"
  timeout 1200 "$@" 2>&1 | tee "$logs/$name.log"
  local rc=${PIPESTATUS[0]}
  if ((rc == 0)); then note "$name" "ok"; else
    note "$name" "FAILED (exit $rc)"
    status=1
  fi
  # The figures: lines with a rate or a time per step (else the last lines of the output).
  local figures
  figures=$(grep -E 'FLOP/s|GB/s|tokens/s|ms/step|validation' "$logs/$name.log" | tail -n 40)
  [[ -n $figures ]] || figures=$(tail -n 5 "$logs/$name.log")
  while IFS= read -r line; do bench_lines+=("$name: $line"); done <<<"$figures"
}
if [[ -x "$build/bench_gpu_ops" ]]; then run_bench bench_gpu_ops "$build/bench_gpu_ops"; else
  note "bench_gpu_ops" "not built (no bench/bench_gpu_ops.cpp)"; fi
if [[ -x "$build/bench_gpu_train_step" ]]; then
  run_bench bench_gpu_train_step "$build/bench_gpu_train_step"
else
  note "bench_gpu_train_step" "not built"
fi
# The demo trained end to end on the GPU (bf16), to read beside the CPU demo's validation loss.
if [[ -x "$build/omnitron" ]] && ((gpus > 0)); then
  run_bench gpu_demo "$build/omnitron" train --device cuda --bf16 --no-progress \
    --save "$build/gpu-demo-model" --log-interval 100
  bench_lines+=("gpu_demo: $(grep -m1 '^done:' "$logs/gpu_demo.log")")
fi
# The reference on the same GPU: PyTorch's SDPA (cuDNN and flash) and a PyTorch training step.
if command -v python3 >/dev/null 2>&1 && python3 -c 'import torch; assert torch.cuda.is_available()' \
     >/dev/null 2>&1; then
  run_bench pytorch_reference python3 "$root/bench/pytorch_reference.py"
else
  note "pytorch_reference" "skipped (no PyTorch with CUDA)"
fi

# ---- Summary ----
say "summary"
for s in "${summary[@]}"; do echo "  $s"; done
if ((${#bench_lines[@]})); then
  echo "  benchmark figures:"
  for l in "${bench_lines[@]}"; do echo "    $l"; done
fi
echo "  logs: $logs"
exit $status
