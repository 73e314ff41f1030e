#!/bin/bash
# Launching under torchrun on a GPU machine (docs/launching.md, "torchrun"): the ranks are
# started as torchrun starts its workers (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
# MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RUN_ID), and by torchrun itself when it is installed
# and works. Needs a CUDA build with NCCL:
#   bash tests/comm/torchrun_check.sh [BUILD_DIR]     (default: build)
# Prints one PASS/FAIL line per check and the outputs of the failures; exits 1 if any failed.
set -u
build=${1:-build}
omnitron=$build/omnitron
check=$build/tests/omnitron_nccl_check
logs=$(mktemp -d)
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
failed=0
port=$((29700 + RANDOM % 200))

# as_torchrun N [VAR=value ...] -- command...: N ranks at once; rank r's output in $logs/r<r>.
as_torchrun() {
  local n=$1
  shift
  local envs=()
  while [[ $1 != -- ]]; do envs+=("$1"); shift; done
  shift
  port=$((port + 2))
  for ((r = 0; r < n; r++)); do
    (env "${envs[@]}" RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r LOCAL_WORLD_SIZE=$n \
      MASTER_ADDR=127.0.0.1 MASTER_PORT=$port TORCHELASTIC_RUN_ID=check \
      OMNITRON_RENDEZVOUS_TIMEOUT=60 timeout 150 "$@" >"$logs/r$r" 2>&1
     echo "[exit $?]" >>"$logs/r$r") &
  done
  wait
}

# expect NAME RANK TEXT: rank RANK's output holds TEXT.
expect() {
  if grep -qF -- "$3" "$logs/r$2"; then
    echo "PASS $1 (rank $2)"
  else
    echo "FAIL $1 (rank $2): expected: $3"
    sed 's/^/    /' "$logs/r$2" | tail -n 20
    failed=1
  fi
}

tiny="train --mock-data --vocab-size 64 --num-layers 2 --hidden-size 64 --num-attention-heads 4 \
--seq-length 32 --micro-batch-size 2 --global-batch-size 4 --train-iters 5 --eval-iters 0 \
--no-progress"
echo "torchrun check: $gpus GPU(s), $omnitron"

# The NCCL unique id travels through the rendezvous; NCCL then checks every call.
ranks=$((gpus >= 2 ? 2 : 1))
as_torchrun $ranks -- "$check"
expect "nccl check over the torchrun world" 0 "all passed on $ranks ranks"

as_torchrun 1 -- "$omnitron" $tiny --device cuda
expect "one rank under torchrun trains on the GPU" 0 "done: 5 iterations"

if ((gpus == 1)); then
  as_torchrun 2 -- "$omnitron" $tiny --device cuda
  expect "two ranks, one GPU" 0 "2 ranks run on this node (LOCAL_WORLD_SIZE=2) and 1 CUDA GPU is"
fi

as_torchrun 2 CUDA_VISIBLE_DEVICES=-1 -- "$omnitron" $tiny --device cuda
for r in 0 1; do expect "no visible GPU" $r "--device cuda: no CUDA GPU is visible"; done

as_torchrun 2 -- "$omnitron" $tiny --device cpu
expect "CPU ranks get the mpirun command" 0 "run them with \`mpirun -np 2 $omnitron train"
if [[ $(cat "$logs/r1") == "[exit 2]" ]]; then
  echo "PASS CPU ranks: the others stop quietly with the same code (rank 1)"
else
  echo "FAIL CPU ranks: rank 1 should print nothing and exit 2:"
  sed 's/^/    /' "$logs/r1"
  failed=1
fi

# The real torchrun, where it is installed and starts (its agent keeps MASTER_PORT: the
# rendezvous takes the next port).
if torchrun --help >/dev/null 2>&1 && ((gpus >= 2)); then
  timeout 300 torchrun --no-python --nproc-per-node 2 --master-port $((port + 10)) "$check" \
    >"$logs/r0" 2>&1
  expect "nccl check under torchrun" 0 "all passed on 2 ranks"
else
  echo "skip: the real torchrun (not installed or not working, or fewer than 2 GPUs)"
fi
rm -rf "$logs"
exit $failed
