// Megatron's flags that only tune its Python/CUDA machinery (fusions, CUDA graphs, the
// allocator, checkpoint I/O strategies, resilience and telemetry services, ...), or that tune
// a feature which is off here (its switch is refused in options_refused.cpp): accepted, each
// with a one-line note saying why it changes nothing. Megatron's list of flags at d98e8a64,
// grouped by reason.
#include "config/option_rows.h"

namespace omni::option_rows {

namespace {

// Process groups, fused kernels, CUDA graphs and the allocator.
void add_noted_communication_and_kernels(std::vector<OptionDef>& t) {
  add_noted(t,
            "it tunes NCCL or process-group set-up (SHARP, flight recorder, gloo groups, stream "
            "priorities, user buffers, JIT fuser); omnitron's communicator needs no such setting",
            {{"--pipeline-model-parallel-comm-backend", "nccl|ucc"},
             {"--tp-comm-bootstrap-backend", "nccl|mpi|gloo"},
             {"--high-priority-a2a-comm-stream", ""},
             {"--distributed-backend", "nccl|gloo"},
             {"--lazy-mpu-init", ""},
             {"--nccl-communicator-config-path", "V"},
             {"--disable-gloo-process-groups", ""},
             {"--use-sharp", ""},
             {"--sharp-enabled-group", "dp|dp_replica"},
             {"--high-priority-stream-groups", "V..."},
             {"--flight-recorder-dump-path", "V"},
             {"--flight-recorder-trace-buffer-size", "N"},
             {"--no-flight-recorder-dump-on-timeout", ""},
             {"--disable-flight-recorder-dump-on-timeout", ""},
             {"--flight-recorder-include-stack-trace", ""},
             {"--no-flight-recorder-include-only-active", ""},
             {"--disable-flight-recorder-include-only-active", ""},
             {"--no-flight-recorder-extra-dump-on-exec", ""},
             {"--disable-flight-recorder-extra-dump-on-exec", ""},
             {"--use-nccl-ub", ""},
             {"--disable-symmetric-registration", ""},
             {"--gtp-remat-nccl-ub", ""},
             {"--gtp-expert-remat-nccl-ub", ""}});
  add_noted(t,
            "it selects how context-parallel ranks exchange keys and values, which does not change "
            "the result",
            {{"--hierarchical-context-parallel-sizes", "N..."}});
  add_noted(t,
            "initialisation here is a counter-based function of --seed, the parameter's name and "
            "the element's index, identical on every device and layout",
            {{"--no-initialization", ""},
             {"--use-cpu-initialization", ""},
             {"--init-model-with-meta-device", ""},
             {"--te-rng-tracker", ""},
             {"--inference-rng-tracker", ""}});
  add_noted(t,
            "CPU runs are already bit-reproducible; the GPU backend has no deterministic mode yet "
            "(its embedding gradient adds atomically)",
            {{"--deterministic-mode", ""}});
  add_noted(t,
            "it tunes Transformer Engine's overlap of tensor-parallel communication with GEMMs "
            "(userbuffers), which omnitron does not use",
            {{"--tp-comm-overlap", ""},
             {"--no-tp-comm-bulk-wgrad", ""},
             {"--disable-tp-comm-bulk-wgrad", ""},
             {"--no-tp-comm-bulk-dgrad", ""},
             {"--disable-tp-comm-bulk-dgrad", ""},
             {"--no-tp-comm-overlap-ag", ""},
             {"--disable-tp-comm-overlap-ag", ""},
             {"--no-tp-comm-overlap-rs", ""},
             {"--disable-tp-comm-overlap-rs", ""},
             {"--tp-comm-overlap-rs-dgrad", ""},
             {"--no-tp-comm-split-ag", ""},
             {"--disable-tp-comm-split-ag", ""},
             {"--no-tp-comm-split-rs", ""},
             {"--disable-tp-comm-split-rs", ""},
             {"--tp-comm-overlap-cfg", "V"}});
  add_noted(t,
            "a fusion or kernel choice of Megatron's PyTorch/Transformer Engine code; omnitron has "
            "one implementation of each operation",
            {{"--cross-entropy-loss-fusion", ""},
             {"--cross-entropy-fusion-impl", "native|te"},
             {"--flash-attention-version", "2|3|4"},
             {"--disable-bf16-reduced-precision-matmul", ""},
             {"--use-fused-weighted-squared-relu", ""},
             {"--fused-residual-rmsnorm", ""},
             {"--use-transformer-engine-op-fuser", ""},
             {"--use-te-activation-func", ""},
             {"--transformer-impl", "V"},
             {"--no-masked-softmax-fusion", ""},
             {"--no-bias-gelu-fusion", ""},
             {"--no-bias-swiglu-fusion", ""},
             {"--no-bias-dropout-fusion", ""},
             {"--no-rope-fusion", ""},
             {"--use-flash-attn", ""},
             {"--no-persist-layer-norm", ""},
             {"--no-gradient-accumulation-fusion", ""},
             {"--use-mcore-models", ""},
             {"--disable-jit-fuser", ""},
             {"--no-gradient-reduce-div-fusion", ""}});
  add_noted(t,
            "it tunes how Megatron overlaps or schedules communication and computation; the "
            "arithmetic is the same without it",
            {{"--delay-wgrad-compute", ""},
             {"--use-ring-exchange-p2p", ""},
             {"--defer-embedding-wgrad-compute", ""},
             {"--wgrad-deferral-limit", "N"},
             {"--overlap-p2p-communication-warmup-flush", ""},
             {"--microbatch-group-size-per-virtual-pipeline-stage", "N"},
             {"--mlp-chunks-for-training", "N"},
             {"--train-sync-interval", "N"},
             {"--no-align-grad-reduce", ""},
             {"--disable-align-grad-reduce", ""},
             {"--no-overlap-p2p-communication", ""},
             {"--ddp-pad-buckets-for-high-nccl-busbw", ""},
             {"--ddp-reduce-scatter-with-fp32-accumulation", ""},
             {"--gtp-remat-reduce-scatter-with-fp32-accumulation", ""},
             {"--ddp-param-name-patterns-for-fp32-local-accumulation", "V..."},
             {"--ddp-average-in-collective", ""},
             {"--overlap-param-gather-with-optimizer-step", ""},
             {"--no-align-param-gather", ""},
             {"--create-all-gather-group", ""}});
  add_noted(t,
            "it tunes PyTorch's memory (caching allocator, CPU offloading, pinned buffers); "
            "omnitron allocates its own buffers",
            {{"--cpu-offloading-num-layers", "N"},
             {"--distribute-saved-activations", ""},
             {"--no-clone-scatter-output-in-embedding", ""},
             {"--disable-clone-scatter-output-in-embedding", ""},
             {"--fine-grained-activation-offloading", ""},
             {"--empty-unused-memory-level", "0|1|2"},
             {"--optimizer-cpu-offload", ""},
             {"--optimizer-offload-fraction", "X"},
             {"--use-torch-optimizer-for-cpu-offload", ""},
             {"--overlap-cpu-optimizer-d2h-h2d", ""},
             {"--no-pin-cpu-grads", ""},
             {"--no-pin-cpu-params", ""}});
  add_noted(t,
            "the pipeline split here counts transformer layers only (balance it with "
            "--decoder-first/last-pipeline-num-layers)",
            {{"--account-for-embedding-in-pipeline-split", ""},
             {"--account-for-loss-in-pipeline-split", ""}});
  add_noted(
      t, "omnitron computes attention scores and their softmax in fp32, where this changes nothing",
      {{"--apply-query-key-layer-scaling", ""}, {"--attention-softmax-in-fp32", ""}});
  add_noted(t,
            "CUDA graphs are PyTorch's cure for kernel-launch overhead; omnitron launches its "
            "kernels itself",
            {{"--enable-cuda-graph", ""},
             {"--cuda-graph-warmup-steps", "N"},
             {"--external-cuda-graph", ""},
             {"--cuda-graph-impl", "V"},
             {"--optimizer-cuda-graph", ""},
             {"--cuda-graph-scope", "V..."},
             {"--cuda-graph-modules", "V..."}});
}

// Exports, garbage collection, resilience services and debugging dumps.
void add_noted_exports_and_services(std::vector<OptionDef>& t) {
  add_noted(t, "it affects exporting to ONNX or dumping configuration files only",
            {{"--config-logger-dir", "V"},
             {"--onnx-safe", "V"},
             {"--dump-param-to-param-group-map", "V"}});
  add_noted(t,
            "it tunes PyTorch's profiler, NVTX ranges or CUDA memory history; --profile writes "
            "omnitron's own trace",
            {{"--pytorch-profiler-collect-shapes", ""},
             {"--pytorch-profiler-collect-callstack", ""},
             {"--pytorch-profiler-collect-chakra", ""},
             {"--record-memory-history", ""},
             {"--memory-snapshot-path", "V"},
             {"--record-shapes", ""},
             {"--nvtx-ranges", ""}});
  add_noted(t,
            "Megatron's extra consistency checks (weight hashes across replicas, large gradients, "
            "GPU sniff tests, real-time tests) are not run here",
            {{"--check-weight-hash-across-dp-replicas-interval", "N"},
             {"--gpu-sniff-test-interval", "N"},
             {"--check-for-large-grads", ""},
             {"--test-mode", ""}});
  add_noted(
      t,
      "a signal ends omnitron without a Python traceback anyway; --exit-signal-handler saves "
      "before stopping",
      {{"--exit-signal-handler-for-dataloader", ""}, {"--exit-signal-handler-for-training", ""}});
  add_noted(t, "there is no Python garbage collector to drive",
            {{"--manual-gc", ""},
             {"--manual-gc-interval", "N"},
             {"--no-manual-gc-eval", ""},
             {"--disable-manual-gc-eval", ""}});
  add_noted(t,
            "NVIDIA Resiliency Extension machinery (in-process restart, fault-tolerance package, "
            "rerun engine, fault injector, ADLR autoresume) is not part of omnitron; "
            "--exit-signal-handler and --save handle restarts",
            {{"--result-rejected-tracker-filename", "V"},
             {"--adlr-autoresume", ""},
             {"--adlr-autoresume-interval", "N"},
             {"--inprocess-restart", ""},
             {"--inprocess-max-iterations", "N"},
             {"--inprocess-monitor-thread-interval", "X"},
             {"--inprocess-monitor-process-interval", "X"},
             {"--inprocess-progress-watchdog-interval", "X"},
             {"--inprocess-heartbeat-interval", "X"},
             {"--inprocess-soft-timeout", "X"},
             {"--inprocess-hard-timeout", "X"},
             {"--inprocess-heartbeat-timeout", "X"},
             {"--inprocess-barrier-timeout", "X"},
             {"--inprocess-completion-timeout", "X"},
             {"--inprocess-last-call-wait", "X"},
             {"--inprocess-termination-grace-time", "X"},
             {"--inprocess-granularity", "node|rank"},
             {"--inprocess-active-world-size", "N"},
             {"--inprocess-empty-cuda-cache", ""},
             {"--enable-ft-package", ""},
             {"--calc-ft-timeouts", ""},
             {"--ft-num-warmup-iters", "N"},
             {"--error-injection-rate", "N"},
             {"--error-injection-type", "V"},
             {"--rerun-mode", "disabled|validate_results|report_stats"},
             {"--check-for-spiky-loss", ""},
             {"--fault-injector-ranks", "V"},
             {"--fault-injector-num-ranks", "N"},
             {"--fault-injector-fault-types", "V"},
             {"--fault-injector-fault-probabilities", "V"},
             {"--fault-injector-fault-delay", "X"},
             {"--fault-injector-delay-start-iteration", "N"},
             {"--fault-injector-mtti-seconds", "X"},
             {"--fault-injector-offset-seconds", "X"},
             {"--fault-injector-seed", "N"}});
  add_noted(t,
            "Megatron's debugging dumps and extra checkpoint kinds are not written; "
            "--save-interval checkpoints are",
            {{"--save-params-interval", "N"},
             {"--save-activations-interval", "N"},
             {"--save-tokens-per-expert-interval", "N"},
             {"--save-wgrads-interval", "N"},
             {"--save-dgrads-interval", "N"},
             {"--non-persistent-save-interval", "N"},
             {"--non-persistent-ckpt-type", "global|local|in_memory"},
             {"--non-persistent-global-ckpt-dir", "V"},
             {"--non-persistent-local-ckpt-dir", "V"},
             {"--non-persistent-local-ckpt-algo", "fully_parallel|atomic"}});
}

// Checkpoint I/O, mixed-precision plumbing and data loading.
void add_noted_checkpointing_precision_and_data(std::vector<OptionDef>& t) {
  add_noted(t, "omnitron keeps every checkpoint it saves", {{"--save-retain-interval", "N"}});
  add_noted(t, "checkpoints here hold the fp32 main parameters, which every load restores",
            {{"--load-main-params-from-ckpt", ""}});
  add_noted(
      t,
      "checkpoints here load at any parallel layout, and the tokenizer comes from the command line",
      {{"--use-mp-args-from-checkpoint-args", ""},
       {"--no-use-tokenizer-model-from-checkpoint-args", ""},
       {"--disable-use-tokenizer-model-from-checkpoint-args", ""}});
  add_noted(t,
            "it tunes Megatron's checkpoint I/O (formats, asynchronous and parallel strategies, "
            "strictness); omnitron writes its own self-describing, reshardable checkpoints with "
            "checksums",
            {{"--ckpt-format", "torch|torch_dist|torch_dcp|fsdp_dtensor"},
             {"--auto-detect-ckpt-format", ""},
             {"--no-ckpt-fully-parallel-save", ""},
             {"--async-strategy", "nvrx|mcore"},
             {"--use-persistent-ckpt-worker", ""},
             {"--async-ckpt-cpu-priority", "N"},
             {"--async-ckpt-io-priority", "N"},
             {"--async-ckpt-use-cpu-shm", ""},
             {"--ckpt-fully-parallel-load", ""},
             {"--ckpt-fully-parallel-load-exchange-algo", "broadcast|gather_rounds|gather_object"},
             {"--ckpt-fully-parallel-load-per-rank-objects", ""},
             {"--ckpt-fully-parallel-save-process-group", "dp|ep_dp"},
             {"--ckpt-fully-parallel-load-process-group", "dp|ep_dp"},
             {"--ckpt-assume-constant-structure", ""},
             {"--ckpt-pg-tensors-cache-path", "V"},
             {"--ckpt-pg-tensors-cache-create", ""},
             {"--no-ckpt-load-validate-sharding-integrity", ""},
             {"--disable-ckpt-load-validate-sharding-integrity", ""},
             {"--no-strict-fsdp-dtensor-load", ""},
             {"--disable-strict-fsdp-dtensor-load", ""},
             {"--dist-ckpt-strictness", "V"},
             {"--dist-ckpt-save-pre-mcore-014", ""},
             {"--dist-ckpt-optim-fully-reshardable", ""},
             {"--distrib-optim-fully-reshardable-mem-efficient", ""},
             {"--no-save-tokenizer-assets", ""},
             {"--disable-save-tokenizer-assets", ""},
             {"--replication", ""},
             {"--replication-jump", "N"},
             {"--replication-factor", "N"},
             {"--use-dist-ckpt", ""},
             {"--dist-ckpt-format", "V"},
             {"--dist-ckpt-workers", "N"},
             {"--ckpt-fully-parallel-save", ""},
             {"--ckpt-drop-redundant-extra-state", ""}});
  add_noted(t, "every checkpoint file here carries a CRC32C that each load checks",
            {{"--verify-integrity", ""}});
  add_noted(t,
            "a checkpoint holds no random-number state: initialisation and data order are "
            "functions of --seed and the consumed samples",
            {{"--no-save-rng", ""}, {"--no-load-rng", ""}});
  add_noted(t, "gradients are accumulated and reduced across data-parallel ranks in fp32 here",
            {{"--accumulate-allreduce-grads-in-fp32", ""}});
  add_noted(t,
            "the local rank is read from the launcher's environment (OMPI_COMM_WORLD_LOCAL_RANK, "
            "SLURM_LOCALID, MPI_LOCALRANKID, LOCAL_RANK)",
            {{"--local-rank", "N"}});
  add_noted(
      t,
      "the collective timeout here is --distributed-timeout-minutes's, the same from start to end",
      {{"--distributed-timeout-seconds-after-init", "N"}});
  add_noted(t,
            "data-parallel buckets here are sized by --ddp-bucket-size; bucketing does not change "
            "the sums",
            {{"--ddp-num-buckets", "N"}});
  add_noted(t,
            "it tunes how the distributed optimizer's copies and communication are laid out; the "
            "update is the same",
            {{"--num-distributed-optimizer-instances", "N"}});
  add_noted(t,
            "it tunes PyTorch's data loader or dataset-building workers; omnitron reads data with "
            "one background thread from memory-mapped files",
            {{"--per-dataset-sequences-path", "V"},
             {"--dataloader-fast-cache-load", ""},
             {"--dataloader-defer-npy-index-mmap", ""},
             {"--no-mmap-bin-files", ""},
             {"--num-workers", "N"},
             {"--no-create-attention-mask-in-dataloader", ""},
             {"--num-dataset-builder-threads", "N"}});
  add_noted(t,
            "object storage (Multi-Storage Client) is not built in; data and checkpoints are paths "
            "in a file system",
            {{"--object-storage-cache-path", "V"}, {"--enable-msc", ""}, {"--disable-msc", ""}});
  add_noted(t, "pad tokens are never masked out of the loss here",
            {{"--allow-ambiguous-pad-tokens", ""}});
  add_noted(t,
            "it selects between implementations of the same tokenizer, or a tokenizer feature used "
            "only for chat and remote-code models",
            {{"--tokenizer-sentencepiece-legacy", ""},
             {"--no-tokenizer-sentencepiece-ignore-extra-whitespaces", ""},
             {"--disable-tokenizer-sentencepiece-ignore-extra-whitespaces", ""},
             {"--tokenizer-hf-no-use-fast", ""},
             {"--tokenizer-hf-no-include-special-tokens", ""},
             {"--trust-remote-code", ""},
             {"--chat-template", "V"},
             {"--use-gigatoken", ""}});
}

// Progress, timers and logging services.
void add_noted_logging(std::vector<OptionDef>& t) {
  add_noted(t,
            "omnitron shows its own progress and throughput lines; Megatron's progress.txt is not "
            "written",
            {{"--log-progress", ""}});
  add_noted(t, "it tunes Megatron's timers; omnitron logs its own step timings",
            {{"--timing-log-level", "0|1|2"},
             {"--timing-log-option", "max|minmax|all"},
             {"--no-barrier-with-level-1-timing", ""}});
  add_noted(t, "TensorBoard events are written directly, without a queue",
            {{"--tensorboard-queue-size", "N"}});
  add_noted(
      t, "memory use is written with the other TensorBoard scalars (--log-memory-to-tensorboard)",
      {{"--log-memory-interval", "N"}});
  add_noted(
      t,
      "NVIDIA's telemetry and monitoring services (one-logger, OpenTelemetry, straggler detector, "
      "workload inspector, energy and nvidia-smi readings) are not part of omnitron",
      {{"--log-device-memory-used", ""},
       {"--log-energy", ""},
       {"--otel-enabled", ""},
       {"--otel-service-name", "V"},
       {"--otel-span-groups", "V"},
       {"--log-straggler", ""},
       {"--straggler-ctrlr-port", "N"},
       {"--straggler-minmax-count", "N"},
       {"--disable-straggler-on-startup", ""},
       {"--run-workload-inspector-server", ""},
       {"--no-one-logger", ""},
       {"--one-logger-project", "V"},
       {"--one-logger-run-name", "V"},
       {"--one-logger-async", ""},
       {"--app-tag-run-name", "V"},
       {"--app-tag-run-version", "V"}});
  add_noted(t, "this scalar (the world size, the largest attention logit) is not logged here",
            {{"--log-max-attention-logit", ""}, {"--log-world-size-to-tensorboard", ""}});
  add_noted(t, "Weights & Biases logging is not built in; use --tensorboard-dir or --metrics-file",
            {{"--wandb-project", "V"},
             {"--wandb-exp-name", "V"},
             {"--wandb-save-dir", "V"},
             {"--wandb-entity", "V"}});
  add_noted(t, "it only unlocks Megatron features marked experimental",
            {{"--enable-experimental", ""}});
  add_noted(t,
            "main parameters and optimizer states are fp32 here, the precision-aware optimizer's "
            "default dtypes (--main-params-dtype and its siblings refuse others)",
            {{"--use-precision-aware-optimizer", ""}});
}

// The tuning flags of refused model features (experts, multi-token prediction, ...).
void add_tuning_of_model_features(std::vector<OptionDef>& t) {
  // Megatron's MoE kernels, fusions, overlap and communication back ends: the CPU MoE layer
  // (model/moe_layer.h) has one path, and these change no number.
  add_noted(t,
            "it tunes Megatron's MoE kernels, fusions or communication; omnitron's MoE layer has "
            "one path and the same numbers",
            {{"--overlap-moe-expert-parallel-comm", ""},
             {"--overlap-dispatch-backward-with-experts-wgrad", ""},
             {"--ep-overlap-early-attn-memory-release", ""},
             {"--moe-shared-expert-overlap", ""},
             {"--use-grouped-gemm-for-shared-expert", ""},
             {"--moe-router-padding-for-quantization", ""},
             {"--moe-router-padding-for-fp8", ""},
             {"--use-grouped-gemm-for-dense-mlp", ""},
             {"--moe-use-grouped-tensor", ""},
             {"--moe-single-grouped-weight", ""},
             {"--moe-single-grouped-bias", ""},
             {"--moe-enable-deepep", ""},
             {"--moe-flex-dispatcher-backend", "deepep|hybridep|ncclep"},
             {"--moe-permute-fusion-into-hybridep", ""},
             {"--moe-hybridep-pad-uneven-dispatch-inputs", ""},
             {"--moe-per-layer-logging", ""},
             {"--moe-pad-experts-for-cuda-graph-inference", ""},
             {"--moe-layer-recompute", ""},
             {"--moe-permute-fusion", ""},
             {"--moe-router-fusion", ""},
             {"--moe-flex-dispatcher-num-sms", "N"},
             {"--moe-deepep-num-sms", "N"},
             {"--moe-hybridep-num-sms", "N"},
             {"--moe-hybridep-num-blocks-permute", "N"},
             {"--moe-hybridep-num-blocks-unpermute", "N"},
             {"--moe-hybridep-num-sms-preprocessing", "N"},
             {"--moe-ncclep-zero-copy", ""},
             {"--moe-dispatch-fwd-dtype", "bf16|mxfp8"},
             {"--moe-combine-bwd-dtype", "bf16|mxfp8"},
             {"--moe-paged-stash", ""},
             {"--moe-paged-stash-page-size", "N"},
             {"--moe-paged-stash-buffer-size-factor-cuda", "X"},
             {"--moe-paged-stash-buffer-size-factor-cpu", "X"},
             {"--moe-routing-trace-path", "V"},
             {"--moe-routing-trace-max-training-iters", "N"},
             {"--moe-routing-trace-capture-logits", ""},
             {"--moe-routing-trace-capture-hidden-states", ""},
             {"--moe-routing-trace-dump-weights", ""}});
  add_tuning(t, "GTP weight rematerialisation", "--tensor-parallel-num-weight-shards",
             {{"--expert-tensor-parallel-num-weight-shards", "N"},
              {"--gtp-remat-opt-in-modules", "V..."}});
  add_tuning(t, "activation offloading to the CPU",
             "--cpu-offloading-num-layers / --fine-grained-activation-offloading",
             {{"--cpu-offloading-retain-pinned-cpu-buffers", ""},
              {"--offload-modules", "V..."},
              {"--min-offloaded-tensor-size", "N"},
              {"--delay-offload-until-cuda-graph", ""},
              {"--delta-offload-bytes-across-pp-ranks", "N"},
              {"--activation-offload-fraction", "X"},
              {"--fine-grained-offloading-max-inflight-offloads", "N"}});
  add_tuning(t, "QK-clip", "--qk-clip", {{"--qk-clip-alpha", "X"}, {"--qk-clip-threshold", "X"}});
  add_tuning(t, "experimental attention variants (gated delta net, DeepSeek sparse attention)",
             "--experimental-attention-variant",
             {{"--dsa-indexer-n-heads", "N"},
              {"--dsa-indexer-head-dim", "N"},
              {"--dsa-indexer-topk", "N"},
              {"--dsa-indexer-topk-freq", "N"},
              {"--dsa-indexer-skip-topk-offset", "N"},
              {"--dsa-indexer-loss-coeff", "X"},
              {"--dsa-indexer-use-sparse-loss", ""},
              {"--dsa-kernel-backend", "none|tilelang|cudnn"},
              {"--dsa-indexer-rope-interleaved", ""},
              {"--no-dsa-indexer-rotate-activation", ""},
              {"--disable-dsa-indexer-rotate-activation", ""},
              {"--no-dsa-indexer-scoring-relu", ""},
              {"--disable-dsa-indexer-scoring-relu", ""},
              {"--dsa-indexer-k-norm-epsilon", "X"},
              {"--dsa-indexer-k-norm-fp32", ""},
              {"--linear-conv-kernel-dim", "N"},
              {"--linear-key-head-dim", "N"},
              {"--linear-value-head-dim", "N"},
              {"--linear-num-key-heads", "N"},
              {"--linear-num-value-heads", "N"}});
  add_tuning(t, "maximal update parametrisation (muP)", "--use-mup",
             {{"--mup-width-mult", "X"},
              {"--mup-base-hidden-size", "N"},
              {"--mup-embedding-mult", "X"},
              {"--mup-output-mult", "X"},
              {"--mup-base-head-dim", "X"},
              {"--mup-attn-scale-power", "X"}});
}

// The tuning flags of refused precision, architecture, optimizer and data features.
void add_tuning_of_precision_and_other_features(std::vector<OptionDef>& t) {
  add_tuning(t, "fp8 training", "--fp8-format",
             {{"--fp8-recipe", "V"},
              {"--fp8-quantizer-factory", "V"},
              {"--fp8-margin", "N"},
              {"--fp8-interval", "N"},
              {"--fp8-amax-history-len", "N"},
              {"--fp8-amax-compute-algo", "most_recent|max"},
              {"--no-fp8-wgrad", ""},
              {"--disable-fp8-wgrad", ""},
              {"--fp8-output-proj", ""},
              {"--first-last-layers-bf16", ""},
              {"--num-layers-at-start-in-bf16", "N"},
              {"--num-layers-at-end-in-bf16", "N"},
              {"--reuse-grad-buf-for-mxfp8-param-ag", ""},
              {"--keep-fp8-transpose-cache", ""},
              {"--fp8-param-gather", ""},
              {"--te-precision-config-file", "V"}});
  add_tuning(t, "Kitchen quantized attention", "--use-kitchen-attention",
             {{"--kitchen-attention-backend", "sdpa|fa"}});
  add_tuning(t, "fp4 training", "--fp4-format",
             {{"--fp4-recipe", "nvfp4|custom"},
              {"--fp4-quantizer-factory", "V"},
              {"--fp4-param-gather", ""}});
  add_tuning(t, "manifold hyper-connections", "--enable-mhc-connections",
             {{"--mhc-num-residual-streams", "N"},
              {"--mhc-sinkhorn-iterations", "N"},
              {"--mhc-init-gating-factor", "X"},
              {"--mhc-recompute-layer-num", "N"}});
  add_tuning(t, "Mamba and hybrid models", "--is-hybrid-model",
             {{"--mamba-state-dim", "N"},
              {"--mamba-head-dim", "N"},
              {"--mamba-num-groups", "N"},
              {"--mamba-num-heads", "N"},
              {"--gdp-num-householder", "N"},
              {"--disable-mamba-mem-eff-path", ""},
              {"--gdp-cutedsl-kernel", ""},
              {"--gdp-num-chunk-states-to-recompute", "N"},
              {"--mamba-training-ssm-states-dtype", "fp32|bf16"}});
  add_tuning(t, "sliding-window attention", "--window-size", {{"--window-attn-skip-freq", "V"}});
  add_tuning(t, "YaRN rotary scaling", "--position-embedding-type yarn",
             {{"--yarn-original-max-position-embeddings", "N"},
              {"--yarn-beta-fast", "X"},
              {"--yarn-beta-slow", "X"},
              {"--yarn-correction-range-round-to-int", ""},
              {"--no-yarn-correction-range-round-to-int", ""}});
  add_tuning(
      t, "relative position buckets (T5)", "--position-embedding-type relative",
      {{"--relative-attention-num-buckets", "N"}, {"--relative-attention-max-distance", "N"}});
  add_tuning(t, "the layer-wise distributed optimizer of SOAP and Muon", "--optimizer dist_muon",
             {{"--no-use-layer-wise-param-layout", ""}});
  add_tuning(t, "fully sharded data parallelism (FSDP)", "--use-megatron-fsdp",
             {{"--megatron-fsdp-version", "1|2"},
              {"--fsdp-manual-registration", ""},
              {"--outer-dp-sharding-strategy", "no_shard|optim"},
              {"--fsdp-double-buffer", ""},
              {"--suggested-communication-unit-size", "N"},
              {"--enable-full-sharding-in-hsdp", ""},
              {"--torch-fsdp2-no-reshard-after-forward", ""},
              {"--megatron-fsdp-main-params-dtype", "fp32|bf16|fp16|auto"},
              {"--megatron-fsdp-main-grads-dtype", "fp32|bf16|fp16|auto"},
              {"--megatron-fsdp-grad-comm-dtype", "fp32|fp16|bf16|auto"},
              {"--megatron-fsdp-enable-fine-grained-param-gather", ""},
              {"--megatron-fsdp-max-pool-double-buffer", ""},
              {"--fsdp-db-use-persist-buf-on-alloc-fail", ""}});
  add_tuning(t, "fill-in-the-middle data", "--fim-data",
             {{"--fim-rate", "X"},
              {"--fim-spm-rate", "X"},
              {"--fim-split-sample", "V"},
              {"--fim-fragment-rate", "X"},
              {"--fim-no-prefix", "V"},
              {"--fim-prefix-token", "V"},
              {"--fim-middle-token", "V"},
              {"--fim-suffix-token", "V"},
              {"--fim-pad-token", "V"},
              {"--fim-eod-token", "V"}});
}

}  // namespace

void add_noted_options(std::vector<OptionDef>& t) {
  add_noted_communication_and_kernels(t);
  add_noted_exports_and_services(t);
  add_noted_checkpointing_precision_and_data(t);
  add_noted_logging(t);
  add_tuning_of_model_features(t);
  add_tuning_of_precision_and_other_features(t);
}

}  // namespace omni::option_rows
