#!/usr/bin/env bash
# The parallel layouts on real GPUs over NCCL/RCCL, against one GPU: every iteration's loss of
# each layout within a tolerance stated here of the one-GPU run (same seed, same global batch).
#   bash scripts/gpu_layouts.sh BUILD_DIR GPUS [LOG_DIR]
# scripts/gpu_check.sh runs it when two or more GPUs are visible. Ranks are started with
# torchrun when it is installed, else with mpirun; one line per layout, then exit 1 when any
# layout differed or failed. Layouts of four ranks run when four GPUs are visible.
set -uo pipefail

build=${1:?usage: gpu_layouts.sh BUILD_DIR GPUS [LOG_DIR]}
gpus=${2:?usage: gpu_layouts.sh BUILD_DIR GPUS [LOG_DIR]}
logs=${3:-$build/gpu_layouts}
omnitron="$build/omnitron"
mkdir -p "$logs"

# Tolerances, relative, at every iteration: float32 layouts sum in other orders (the emulated
# ranks of tests/gpu stay within 1e-6 over six steps; 20 steps here); bf16 rounds activations
# at other places (tensor-parallel partial sums are rounded before they are added).
fp32_tolerance=1e-4
bf16_tolerance=2e-2

common=(--mock-data --vocab-size 1024 --num-layers 4 --hidden-size 256 --num-attention-heads 8
        --seq-length 256 --micro-batch-size 2 --global-batch-size 16 --train-iters 20 --lr 3e-4
        --log-interval 1 --eval-iters 0 --no-progress --seed 1234 --device cuda)
llama=(--normalization RMSNorm --swiglu --position-embedding-type rope --disable-bias-linear
       --group-query-attention --num-query-groups 4 --untie-embeddings-and-output-weights)

launch() {  # ranks, then the train arguments
  local ranks=$1
  shift
  if ((ranks == 1)); then
    timeout 300 "$omnitron" train "$@"
  elif command -v torchrun >/dev/null 2>&1; then
    timeout 300 torchrun --no_python --nproc_per_node "$ranks" --master_port 29531 \
      "$omnitron" train "$@"
  else
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 300 \
      mpirun -np "$ranks" "$omnitron" train "$@"
  fi
}

losses() { grep -o 'lm loss: [0-9.E+-]*' "$1" | awk '{print $3}'; }

status=0
run_layout() {  # name, ranks, tolerance, baseline log, then the layout's arguments
  local name=$1 ranks=$2 tolerance=$3 baseline=$4
  shift 4
  local log="$logs/${name// /_}.log"
  if ((ranks > gpus)); then
    printf '%-34s skipped: needs %d GPUs\n' "$name" "$ranks"
    return
  fi
  launch "$ranks" "$@" >"$log" 2>&1
  local rc=$?
  local line
  line=$(paste <(losses "$baseline") <(losses "$log") | awk -v tol="$tolerance" '
    { d = $1 - $2; if (d < 0) d = -d; a = $1 < 0 ? -$1 : $1; r = d / a; if (r > worst) worst = r; n++ }
    END { printf "%d iterations, worst relative difference %.2e (tolerance %g)", n, worst, tol;
          exit !(n == 20 && worst <= tol) }')
  local same=$?
  if ((rc != 0)); then
    line="FAILED (exit $rc): $(grep -m1 -iE 'error' "$log")"
    status=1
  elif ((same != 0)); then
    line="DIFFERS: $line"
    status=1
  fi
  printf '%-34s %s\n' "$name" "$line"
}

one_gpu() {  # name, then the arguments: the baseline of the layouts after it
  local log="$logs/$1.log"
  shift
  if ! launch 1 "$@" >"$log" 2>&1 || (($(losses "$log" | wc -l) != 20)); then
    printf '%-34s FAILED: see %s\n' "one GPU baseline" "$log"
    status=1
  fi
}

one_gpu gpt2 "${common[@]}"
base="$logs/gpt2.log"
run_layout "gpt2 dp2" 2 $fp32_tolerance "$base" "${common[@]}"
run_layout "gpt2 dp2 distributed-optimizer" 2 $fp32_tolerance "$base" "${common[@]}" \
  --use-distributed-optimizer --overlap-grad-reduce
run_layout "gpt2 pp2" 2 $fp32_tolerance "$base" "${common[@]}" --pipeline-model-parallel-size 2
run_layout "gpt2 pp2 interleaved" 2 $fp32_tolerance "$base" "${common[@]}" \
  --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 1

# A sharded checkpoint written by two GPUs at iteration 10 and resumed there: the resumed
# iterations print the losses of the run that saved it, digit for digit.
ckpt="$logs/checkpoint"
rm -rf "$ckpt"
run_layout "gpt2 dp2 save at 10" 2 $fp32_tolerance "$base" "${common[@]}" \
  --use-distributed-optimizer --save "$ckpt" --save-interval 10
if ((gpus >= 2)); then
  resumed="$logs/gpt2_resumed_at_10.log"
  echo 10 >"$ckpt/latest_checkpointed_iteration.txt"  # it also saved at 20, the end
  if launch 2 "${common[@]}" --use-distributed-optimizer --load "$ckpt" >"$resumed" 2>&1 &&
     diff <(losses "$logs/gpt2_dp2_save_at_10.log" | tail -n 10) <(losses "$resumed") >/dev/null
  then
    printf '%-34s iterations 11-20 equal the straight run\n' "gpt2 dp2 resumed at 10"
  else
    printf '%-34s DIFFERS or FAILED: see %s\n' "gpt2 dp2 resumed at 10" "$resumed"
    status=1
  fi
fi

one_gpu llama "${common[@]}" "${llama[@]}"
base="$logs/llama.log"
run_layout "llama tp2 sp" 2 $fp32_tolerance "$base" "${common[@]}" "${llama[@]}" \
  --tensor-model-parallel-size 2 --sequence-parallel
run_layout "llama cp2" 2 $fp32_tolerance "$base" "${common[@]}" "${llama[@]}" \
  --context-parallel-size 2
run_layout "llama tp2 pp2" 4 $fp32_tolerance "$base" "${common[@]}" "${llama[@]}" \
  --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2
run_layout "llama tp2 dp2 distributed-optimizer" 4 $fp32_tolerance "$base" "${common[@]}" \
  "${llama[@]}" --tensor-model-parallel-size 2 --use-distributed-optimizer

one_gpu llama_bf16 "${common[@]}" "${llama[@]}" --bf16
base="$logs/llama_bf16.log"
run_layout "llama bf16 tp2 sp" 2 $bf16_tolerance "$base" "${common[@]}" "${llama[@]}" --bf16 \
  --tensor-model-parallel-size 2 --sequence-parallel
run_layout "llama bf16 dp2 pp2" 4 $bf16_tolerance "$base" "${common[@]}" "${llama[@]}" --bf16 \
  --pipeline-model-parallel-size 2

exit $status
