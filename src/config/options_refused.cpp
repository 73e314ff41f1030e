// Megatron's flags for features omnitron has not built yet: refused, naming the feature,
// rather than training something else than asked. Some accept the value that means the
// feature is off (--sample-rate 1).
#include "config/option_rows.h"

namespace omni::option_rows {

namespace {

// Model and parallelism features: attention variants, precisions, architectures.
void add_refused_model_features(std::vector<OptionDef>& t) {
  add_refused(t, "GTP weight rematerialisation", {{"--tensor-parallel-num-weight-shards", "N"}});
  add_refused(t, "hybrid (dynamic) context parallelism",
              {{"--max-seqlen-per-dp-cp-rank", "N"}, {"--hybrid-context-parallel", ""}});
  add_refused(
      t, "an fp32 residual stream and post-layernorm residuals",
      {{"--fp32-residual-connection", ""}, {"--apply-residual-connection-post-layernorm", ""}});
  add_refused(
      t, "activation functions other than GELU and SwiGLU",
      {{"--activation-func-clamp-value", "X"}, {"--squared-relu", ""}, {"--quick-geglu", ""}});
  add_refused(
      t, "rotary variants (interleaved, mRoPE, layers without RoPE, sequence-length interpolation)",
      {{"--rotary-interleaved", ""}, {"--mrope-section", "N..."}, {"--no-rope-freq", "V"}});
  add_refused(t,
              "attention variants beyond qk-layernorm (qk L2 norm, qk-clip, output gates, "
              "off-by-one softmax)",
              {{"--qk-l2-norm", ""}, {"--qk-clip", ""}, {"--attention-output-gate", ""}});
  add_refused(t, "experimental attention variants (gated delta net, DeepSeek sparse attention)",
              {{"--experimental-attention-variant", "gdn|gdn2|dsa|gated_delta_net"},
               {"--linear-attention-freq", "V"}});
  add_refused(t, "other initialisation schemes (Xavier, per-rank random, a separate embedding std)",
              {{"--embedding-init-method-std", "X"},
               {"--data-parallel-random-init", ""},
               {"--init-method-xavier-uniform", ""}});
  add_refused(t, "maximal update parametrisation (muP)", {{"--use-mup", ""}});
  add_refused(t, "fp8 training", {{"--fp8-format", "e4m3|hybrid"}});
  add_refused(t, "Kitchen quantized attention", {{"--use-kitchen-attention", ""}});
  add_refused(t, "fp4 training", {{"--fp4-format", "e2m1"}});
  add_refused(
      t, "Megatron's inference engine and text-generation server",
      {{"--inference-cuda-graph-scope", "none|layer|block"},
       {"--flash-decode", ""},
       {"--symmetric-ar-type", "two_shot|one_shot|multimem_all_reduce"},
       {"--nccl-all-reduce-for-prefill", ""},
       {"--inference-fuse-tp-communication", ""},
       {"--inference-disable-triton-nvls-kernels", ""},
       {"--inference-grouped-gemm-backend", "flashinfer|torch|vllm"},
       {"--inference-moe-disable-fused-quant-kernels", ""},
       {"--inference-moe-token-dispatcher-type", "nccl|nvls"},
       {"--mlp-chunks-for-prefill", "N"},
       {"--inference-batch-times-seqlen-threshold", "N"},
       {"--max-tokens-to-oom", "N"},
       {"--output-bert-embeddings", ""},
       {"--bert-embedder-type", "megatron|huggingface"},
       {"--use-legacy-static-engine", ""},
       {"--inference-max-requests", "N"},
       {"--inference-max-seq-length", "N"},
       {"--inference-dynamic-batching", ""},
       {"--inference-dynamic-batching-buffer-size-gb", "X"},
       {"--inference-dynamic-batching-paused-buffer-size-gb", "X"},
       {"--inference-dynamic-batching-mamba-memory-ratio", "X"},
       {"--inference-dynamic-batching-block-size", "N"},
       {"--inference-dynamic-batching-max-requests", "N"},
       {"--inference-dynamic-batching-max-tokens", "N"},
       {"--inference-dynamic-batching-num-cuda-graphs", "N"},
       {"--inference-dynamic-batching-track-paused-request-events", ""},
       {"--inference-dynamic-batching-track-generated-token-events", ""},
       {"--decode-only-cuda-graphs", ""},
       {"--inference-cuda-graph-all-prefills", ""},
       {"--inference-cuda-graph-max-tokens", "N"},
       {"--inference-dynamic-batching-unified-memory-level", "0|1"},
       {"--enable-chunked-prefill", ""},
       {"--num-speculative-tokens", "N"},
       {"--inference-dynamic-batching-prefix-caching", ""},
       {"--no-inference-dynamic-batching-prefix-caching", ""},
       {"--inference-dynamic-batching-prefix-caching-eviction-policy", "ref_zero|lru"},
       {"--inference-dynamic-batching-prefix-caching-coordinator-policy", "V"},
       {"--inference-dynamic-batching-prefix-caching-routing-alpha", "X"},
       {"--inference-dynamic-batching-prefix-caching-mamba-gb", "X"},
       {"--inference-dynamic-batching-cuda-graph-mixed-prefill-count", "N"},
       {"--inference-dynamic-batching-cuda-graph-sizing-distribution", "exponential|linear"},
       {"--inference-dynamic-batching-sampling-backend", "torch|flashinfer"},
       {"--use-same-sampling-seed-across-dp-ranks", ""},
       {"--inference-dynamic-batching-async-sched-mode", "legacy|async"},
       {"--inference-dynamic-batching-logprobs-mode", "raw_logprobs|processed_logprobs"},
       {"--inference-logging-step-interval", "N"},
       {"--inference-text-gen-server-logging", ""},
       {"--no-inference-text-gen-server-logging", ""},
       {"--inference-wandb-logging", ""},
       {"--no-inference-wandb-logging", ""},
       {"--inference-coordinator-port", "N"},
       {"--mamba-inference-conv-states-dtype", "bf16|fp16|fp32"},
       {"--mamba-inference-ssm-states-dtype", "bf16|fp16|fp32"},
       {"--inference-use-synchronous-zmq-collectives", ""},
       {"--no-inference-use-synchronous-zmq-collectives", ""},
       {"--inference-disable-ep-consensus", ""},
       {"--no-inference-disable-ep-consensus", ""},
       {"--inference-shards", "V"}});
  add_refused(t, "manifold hyper-connections", {{"--enable-mhc-connections", ""}});
  add_refused(
      t, "batch-invariant kernels",
      {{"--batch-invariant-mode", ""}, {"--batch-invariant-backend", "te_native|deepgemm|triton"}});
  // Multi-token prediction (model/mtp.cpp) builds --mtp-num-layers depths of their own, each
  // fed by the one before, trained with the main model and run on the last pipeline stage.
  add_refused(t,
              "multi-token prediction in a pipeline stage of its own (the depths run on the "
              "last stage, after its decoder layers)",
              {{"--mtp-standalone", ""}});
  add_refused(t,
              "one multi-token prediction layer shared by every depth (each of the "
              "--mtp-num-layers depths has its own layer)",
              {{"--mtp-use-repeated-layer", ""}});
  add_refused(t,
              "detached multi-token prediction heads with their own gradient clipping (the "
              "depths' loss trains the main model too, one gradient norm over all)",
              {{"--mtp-detach-heads", ""}});
  add_refused(t,
              "hidden-state mixing across multi-token prediction depths (each depth reads the "
              "previous depth's output)",
              {{"--mtp-hsm", ""}});
  add_refused(t,
              "multi-token prediction patterns of Mamba and hybrid models (the depths repeat the "
              "decoder's last transformer layer)",
              {{"--mtp-hybrid-override-pattern", "V"}});
  add_refused(t, "Mamba and hybrid models",
              {{"--is-hybrid-model", ""},
               {"--hybrid-layer-pattern", "V"},
               {"--hybrid-override-pattern", "V"}});
  add_refused(t, "encoder-decoder models (T5)",
              {{"--decoder-num-layers", "N"}, {"--decoder-seq-length", "N"}});
  add_refused(t, "sliding-window attention", {{"--window-size", "V"}});
  add_refused(t, "BERT and T5 models",
              {{"--bert-no-binary-head", ""}, {"--mask-prob", "X"}, {"--short-seq-prob", "X"}});
  add_refused(t, "weight decay on the qk-layernorm weights",
              {{"--apply-wd-to-qk-layernorm", ""},
               {"--no-weight-decay-cond-type", "apply_wd_to_qk_layernorm"}});
}

// Training, checkpointing, evaluation and data features.
void add_refused_training_features(std::vector<OptionDef>& t) {
  add_refused(t, "batch-size schedules (--rampup-batch-size is the one built)",
              {{"--step-batch-size-schedule", "V"}});
  add_refused(t, "shrinking the global batch to fit the data-parallel size",
              {{"--decrease-batch-size-if-needed", ""}});
  add_refused(t, "skipping iterations", {{"--iterations-to-skip", "N..."}});
  add_refused(t, "reinforcement learning (GRPO)",
              {{"--perform-rl-step", ""},
               {"--rl-prompts-per-eval", "N"},
               {"--grpo-prompts-per-step", "N"},
               {"--grpo-group-size", "N"},
               {"--rl-generation-lag", "X"},
               {"--rl-max-inflight-requests", "N"},
               {"--rl-submission-granularity", "R|G|B"},
               {"--rl-consumption-granularity", "R|G|B"},
               {"--rl-durable-rollout-bank", ""},
               {"--rl-rollout-bank-dir", "V"},
               {"--rl-rollout-bank-max-bytes", "N"},
               {"--grpo-iterations", "N"},
               {"--grpo-clamp-eps-lower", "X"},
               {"--grpo-clamp-eps-upper", "X"},
               {"--grpo-kl-beta", "X"},
               {"--grpo-entropy-term-weight", "X"},
               {"--grpo-filter-groups-with-same-reward", ""},
               {"--langrl-env-config", "V"},
               {"--rl-default-temperature", "X"},
               {"--rl-default-top-p", "X"},
               {"--rl-default-top-k", "N"},
               {"--rl-offload-optimizer-during-inference", ""},
               {"--rl-kv-cache-management-mode", "persist|offload|recompute"},
               {"--rl-persist-cuda-graphs", ""},
               {"--no-rl-persist-cuda-graphs", ""},
               {"--rl-partial-rollouts", ""},
               {"--no-rl-partial-rollouts", ""},
               {"--rl-inference-logprobs-is-correction", ""},
               {"--no-rl-inference-logprobs-is-correction", ""},
               {"--rl-importance-sampling-truncation-coef", "X"},
               {"--rl-use-sequence-packing", ""},
               {"--no-rl-use-sequence-packing", ""},
               {"--rl-sequence-packing-max-sequences-per-bin", "N"},
               {"--rl-sequence-packing-algo", "fifo|round-robin"},
               {"--rl-training-cuda-graphs", ""},
               {"--no-rl-training-cuda-graphs", ""},
               {"--rl-inference-tensor-model-parallel-size", "N"},
               {"--rl-inference-pipeline-model-parallel-size", "N"},
               {"--rl-inference-expert-model-parallel-size", "N"},
               {"--rl-inference-expert-tensor-model-parallel-size", "N"},
               {"--rl-inference-model-unified-memory-level", "0|1"},
               {"--rl-offload-inference-model-weights-when-idle", ""},
               {"--no-rl-offload-inference-model-weights-when-idle", ""},
               {"--refit-method", "nccl|gloo|nvshmem"},
               {"--rl-verify-model-weights-swap", ""},
               {"--no-rl-verify-model-weights-swap", ""},
               {"--rl-skip-bos-token", ""},
               {"--no-rl-skip-bos-token", ""},
               {"--rl-profile", ""},
               {"--rl-profile-dir", "V"},
               {"--rl-inference-parsers", "V..."}});
  add_refused(
      t, "taking the learning-rate schedule from a checkpoint",
      {{"--use-checkpoint-opt_param-scheduler", ""}, {"--use-checkpoint-opt-param-scheduler", ""}});
  add_refused(t, "weight-decay schedules",
              {{"--start-weight-decay", "X"}, {"--end-weight-decay", "X"}});
  add_refused(t, "a separate learning rate for the embedding and output layers",
              {{"--decoupled-lr", "X"}, {"--decoupled-min-lr", "X"}});
  add_refused(t, "frozen layers", {{"--freeze-all-layers", ""}});
  add_refused(t, "--pretrained-checkpoint (use --load DIR --finetune)",
              {{"--pretrained-checkpoint", "V"}});
  add_refused(t, "loading an iteration other than the latest, or overriding it",
              {{"--ckpt-step", "N"}, {"--override-ckpt-iteration", "N"}});
  add_refused(t, "Megatron's checkpoint-format conversion",
              {{"--ckpt-convert-format", "torch|torch_dist"},
               {"--ckpt-convert-save", "V"},
               {"--ckpt-convert-update-legacy-dist-opt-format", ""}});
  add_refused(t, "lower-precision gradient reduction, cross-entropy and logits",
              {{"--grad-reduce-in-bf16", ""},
               {"--fp16-lm-cross-entropy", ""},
               {"--output-logit-dtype", "bf16|fp32"}});
  add_refused(t, "custom pipeline layouts (use --decoder-first/last-pipeline-num-layers)",
              {{"--pipeline-model-parallel-layout", "V"}});
  add_refused(t, "fake process groups", {{"--fake-process-group", ""}});
  add_refused(t, "evaluation-only runs", {{"--skip-train", ""}});
  add_refused(t, "several validation sets and full validation",
              {{"--full-validation", ""},
               {"--multiple-validation-sets", ""},
               {"--validation-set-names", "V..."}});
  add_refused(t, "phase transitions", {{"--phase-transition-iterations", "V"}});
  add_refused(t, "per-split data-args files", {{"--per-split-data-args-path", "V"}});
  add_refused(t, "fill-in-the-middle data", {{"--fim-data", ""}});
  add_refused(t, "an explicit padded vocabulary size (use --make-vocab-size-divisible-by)",
              {{"--padded-vocab-size", "N"}});
  add_refused(t, "extra vocabulary ids (T5) and tokenizer special-token files",
              {{"--tokenizer-metadata", "V"},
               {"--tokenizer-special-tokens", "V..."},
               {"--null-tokenizer-eod-id", "N"}});
}

// Other model families and training methods, and refused values of built flags.
void add_refused_other_models(std::vector<OptionDef>& t) {
  add_refused(t, "biencoder and retrieval (ICT) models",
              {{"--ict-head-size", "N"},
               {"--biencoder-projection-dim", "N"},
               {"--biencoder-shared-query-context-model", ""},
               {"--ict-load", "V"},
               {"--bert-load", "V"},
               {"--titles-data-path", "V"},
               {"--query-in-block-prob", "X"},
               {"--use-one-sent-docs", ""},
               {"--evidence-data-path", "V"},
               {"--retriever-report-topk-accuracies", "N..."},
               {"--retriever-score-scaling", ""},
               {"--block-data-path", "V"},
               {"--embedding-path", "V"},
               {"--indexer-batch-size", "N"},
               {"--indexer-log-interval", "N"}});
  add_refused(t, "vision models",
              {{"--num-classes", "N"},
               {"--img-h", "N"},
               {"--img-w", "N"},
               {"--num-channels", "N"},
               {"--patch-dim", "N"},
               {"--classes-fraction", "X"},
               {"--data-per-class-fraction", "X"},
               {"--no-data-sharding", ""},
               {"--head-lr-mult", "X"},
               {"--vision-pretraining", ""},
               {"--vision-pretraining-type", "classify|inpaint|dino"},
               {"--vision-backbone-type", "vit|mit|swin"},
               {"--swin-backbone-type", "tiny|base|h3"},
               {"--mask-type", "random|row"},
               {"--mask-factor", "X"},
               {"--iter-per-epoch", "N"},
               {"--dino-local-img-size", "N"},
               {"--dino-local-crops-number", "N"},
               {"--dino-head-hidden-size", "N"},
               {"--dino-bottleneck-size", "N"},
               {"--dino-freeze-last-layer", "X"},
               {"--dino-norm-last-layer", ""},
               {"--dino-warmup-teacher-temp", "X"},
               {"--dino-teacher-temp", "X"},
               {"--dino-warmup-teacher-temp-epochs", "N"}});
  add_refused(t, "heterogeneous layer configurations",
              {{"--heterogeneous-layers-config-path", "V"},
               {"--heterogeneous-layers-config-encoded-json", "V"}});
  add_refused(t, "logits distillation",
              {{"--logits-save-top-k", "N"},
               {"--logits-save-top-p", "X"},
               {"--logits-save-top-p-min-k", "N"},
               {"--logits-save-dir", "V"},
               {"--logits-save-dtype", "fp16|bf16|fp32"},
               {"--logits-load-dir", "V"},
               {"--logits-load-decode-threads", "N"},
               {"--logits-load-prefetch-factor", "N"},
               {"--logits-load-msc-prefetch-depth", "N"},
               {"--logits-load-kd-loss-alpha", "X"},
               {"--logits-load-ignore-errors", ""}});
  add_refused(t,
              "custom module specs and Megatron's --yaml-cfg files (omnitron reads Primus-style "
              "YAML with --config)",
              {{"--spec", "V..."}, {"--yaml-cfg", "V"}});
  add_refused(t, "supervised fine-tuning (SFT)",
              {{"--sft", ""}, {"--sft-tokenizer-prompt-format", "V"}});
  t.push_back(not_built("--softmax-type", "vanilla|off-by-one|learnable", "vanilla",
                        "attention variants beyond qk-layernorm (qk L2 norm, qk-clip, output "
                        "gates, off-by-one softmax)"));
  t.push_back(not_built("--glu-linear-offset", "X", "0",
                        "activation functions other than GELU and SwiGLU"));
  t.push_back(not_built(
      "--rotary-seq-len-interpolation-factor", "N", "1",
      "rotary variants (interleaved, mRoPE, layers without RoPE, sequence-length interpolation)"));
  t.push_back(not_built("--sample-rate", "X", "1", "sub-sampling the training data"));
  t.push_back(not_built("--vocab-extra-ids", "N", "0",
                        "extra vocabulary ids (T5) and tokenizer special-token files"));
  t.push_back(not_built("--tiktoken-num-special-tokens", "N", "1000",
                        "extra vocabulary ids (T5) and tokenizer special-token files"));
  t.push_back(not_built("--null-tokenizer-pad-id", "N", "-1",
                        "extra vocabulary ids (T5) and tokenizer special-token files"));
}

}  // namespace

void add_refused_options(std::vector<OptionDef>& t) {
  add_refused_model_features(t);
  add_refused_training_features(t);
  add_refused_other_models(t);
}

}  // namespace omni::option_rows
