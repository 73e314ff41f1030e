#!/usr/bin/env bash
# Launches omnitron the way Megatron-DeepSpeed's train scripts are launched (its
# ALCF/helpers.sh): settings come from environment variables, flags after them still win.
#
#   TP=1 PP=1 NLAYERS=24 HIDDEN=1024 HEADS=16 NUM_KV_HEAD=4 FFN_HIDDEN_SIZE=2816 SEQ=2048 \
#   MICRO_BATCH=4 GRAD_ACC_STEPS=8 TRAIN_ITERS=1000 (or TRAIN_TOKENS=...) LR=3e-4 \
#   WEIGHT_DECAY=0.1 OPT=adamw DTYPE=bf16 ZERO_STAGE=1 CKPT_DIR=ck \
#   DATA_FILE_LIST=data/list.txt  bash scripts/launch.sh --tokenizer-type ... [--config F]
#
# Each variable becomes the Megatron flag it stands for (src/config/env_overrides.cpp; the
# table is in docs/launching.md); `bash scripts/launch.sh --print-config` shows what they
# resolved to.
#
# Ranks, as helpers.sh counts them: hosts are the lines of HOSTFILE (else PBS_NODEFILE), else
# SLURM_NNODES; ranks per host are GPUS_PER_NODE (else NGPU_PER_HOST, else 1); NPROC, when
# set, is the number of ranks instead. More than one rank starts them with mpirun/mpiexec
# (MPIRUN names another; MPI_FLAVOR=openmpi|mpich when its --version does not say), or with
# srun in a Slurm allocation without a hostfile; MPIRUN_ARGS go before the program. Each rank
# runs this script again, which then just starts omnitron (docs/launching.md).
# LAUNCH_DRY_RUN=1 prints the command instead of running it.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
self="$root/scripts/$(basename "${BASH_SOURCE[0]}")"  # absolute: ranks on other hosts run it too

fail() {
  echo "scripts/launch.sh: $*" >&2
  exit 2
}

positive() {  # NAME VALUE
  [[ "$2" =~ ^[1-9][0-9]*$ ]] || fail "$1=$2: expected a positive integer"
}

run() {  # the command, or with LAUNCH_DRY_RUN=1 the command printed
  if [[ "${LAUNCH_DRY_RUN:-0}" == 1 ]]; then
    printf '%q ' "$@" | sed 's/ $//'
    echo
    exit 0
  fi
  exec "$@"
}

launched="${OMPI_COMM_WORLD_SIZE:-}${PMI_SIZE:-}${PMIX_RANK:-}${SLURM_STEP_NUM_TASKS:-}"
if [[ -z "$launched" ]]; then
  hostfile="${HOSTFILE:-${PBS_NODEFILE:-}}"
  hosts=1
  if [[ -n "$hostfile" ]]; then
    [[ -r "$hostfile" ]] || fail "HOSTFILE/PBS_NODEFILE: cannot read '$hostfile'"
    hosts=$(wc -l <"$hostfile")  # helpers.sh: NHOSTS=$(wc -l <"${HOSTFILE}")
    [[ "$hosts" -gt 0 ]] || fail "HOSTFILE/PBS_NODEFILE '$hostfile' lists no hosts"
  elif [[ -n "${SLURM_NNODES:-}" ]]; then
    positive SLURM_NNODES "$SLURM_NNODES"
    hosts="$SLURM_NNODES"
  fi
  per_host="${GPUS_PER_NODE:-${NGPU_PER_HOST:-1}}"
  positive "GPUS_PER_NODE/NGPU_PER_HOST" "$per_host"
  ranks=$((hosts * per_host))
  if [[ -n "${NPROC:-}" ]]; then
    positive NPROC "$NPROC"
    ranks="$NPROC"
  fi
  if [[ "$ranks" -gt 1 ]]; then
    # MPIRUN_ARGS is a list of words, split on purpose.
    read -r -a extra <<<"${MPIRUN_ARGS:-}"
    if [[ -z "${MPIRUN:-}" && -z "$hostfile" && -n "${SLURM_NNODES:-}" ]]; then
      run srun -N "$hosts" -n "$ranks" --ntasks-per-node "$per_host" ${extra[@]+"${extra[@]}"} \
        bash "$self" "$@"
    fi
    mpirun="${MPIRUN:-$(command -v mpirun || command -v mpiexec || echo mpirun)}"
    flavor="${MPI_FLAVOR:-}"
    if [[ -z "$flavor" ]]; then
      flavor=mpich  # MPICH, Intel MPI, Cray PALS (ALCF's mpiexec) take its options
      if "$mpirun" --version 2>&1 | grep -q "Open MPI\|OpenRTE"; then flavor=openmpi; fi
    fi
    placement=()
    case "$flavor" in
      openmpi)
        placement=(-np "$ranks")
        if [[ -n "$hostfile" ]]; then placement+=(--hostfile "$hostfile"); fi
        if [[ -n "$hostfile" || "$per_host" -gt 1 ]]; then
          placement+=(--map-by "ppr:$per_host:node")
        fi
        ;;
      mpich)
        placement=(-n "$ranks" --ppn "$per_host")
        if [[ -n "$hostfile" ]]; then placement+=(--hostfile "$hostfile"); fi
        ;;
      *) fail "MPI_FLAVOR=$flavor: expected openmpi or mpich" ;;
    esac
    run "$mpirun" "${placement[@]}" ${extra[@]+"${extra[@]}"} bash "$self" "$@"
  fi
fi
run env OMNITRON_ENV_OVERRIDES=1 "${OMNITRON_BIN:-$root/build/omnitron}" train "$@"
