#!/usr/bin/env bash
# Launches omnitron the way Megatron-DeepSpeed's train scripts are launched: settings come
# from environment variables, flags after them still win.
#
#   TP=1 PP=1 NLAYERS=24 HIDDEN=1024 HEADS=16 NUM_KV_HEAD=4 FFN_HIDDEN_SIZE=2816 SEQ=2048 \
#   MICRO_BATCH=4 GRAD_ACC_STEPS=8 TRAIN_ITERS=1000 (or TRAIN_TOKENS=...) LR=3e-4 \
#   WEIGHT_DECAY=0.1 OPT=adamw DTYPE=fp32 ZERO_STAGE=0 USE_ACTIVATION_CHECKPOINTING=0 \
#   DATA_FILE_LIST=data/list.txt  bash scripts/launch.sh --tokenizer-type ... [--config F]
#
# Each variable becomes the Megatron flag it stands for (src/config/env_overrides.cpp);
# `bash scripts/launch.sh --print-config` shows what they resolved to.
#
# Ranks: NPROC=N starts N ranks with mpirun (MPIRUN names another launcher; MPIRUN_ARGS go
# before the program, e.g. "--hostfile hosts" or "--oversubscribe"), each running this
# script. Under mpirun or srun already, it just starts omnitron (docs/launching.md).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
launched="${OMPI_COMM_WORLD_SIZE:-}${PMI_SIZE:-}${PMIX_RANK:-}${SLURM_STEP_NUM_TASKS:-}"
if [[ "${NPROC:-1}" -gt 1 && -z "$launched" ]]; then
  # MPIRUN_ARGS is a list of words, split on purpose.
  # shellcheck disable=SC2086
  exec ${MPIRUN:-mpirun} -np "$NPROC" ${MPIRUN_ARGS:-} bash "${BASH_SOURCE[0]}" "$@"
fi
export OMNITRON_ENV_OVERRIDES=1
exec "${OMNITRON_BIN:-$root/build/omnitron}" train "$@"
