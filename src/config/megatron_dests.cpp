// Megatron's argument names (argparse dests) and the flag that sets each, with Megatron's
// default: facts read from Megatron-LM's argument parser by scripts/megatron_dests.py
// (current Megatron at d98e8a64, and 5a676b36, the one Primus 2d42400 pins). Generated: edit
// the script, not this file. Dests the rule "key k is --k, a value or a store_true switch,
// default None or false" gives are listed by name only, at the end.
// clang-format off
#include "config/megatron_dests.h"

#include <algorithm>
#include <deque>
#include <sstream>
#include <unordered_map>

namespace omni {

const std::vector<MegatronDest>& megatron_dest_rows() {
  using enum DestAction;
  using enum MegatronVersion;
  static const std::vector<MegatronDest> rows = {
    {"activation_offload_fraction", "--activation-offload-fraction", Value, "1.0", Current},
    {"adam_beta1", "--adam-beta1", Value, "0.9", Current},
    {"adam_beta2", "--adam-beta2", Value, "0.999", Current},
    {"adam_eps", "--adam-eps", Value, "1e-08", Current},
    {"add_bias_linear", "--disable-bias-linear", StoreFalse, "true", Current},
    {"add_position_embedding", "--no-position-embedding", StoreFalse, "true", Current},
    {"adlr_autoresume_interval", "--adlr-autoresume-interval", Value, "1000", Current},
    {"align_grad_reduce", "--no-align-grad-reduce", StoreFalse, "true", Current},
    {"align_param_gather", "--no-align-param-gather", StoreFalse, "true", Current},
    {"app_tag_run_version", "--app-tag-run-version", Value, "0.0.0", Current},
    {"apply_rope_fusion", "--no-rope-fusion", StoreFalse, "true", Current},
    {"async_ckpt_cpu_priority", "--async-ckpt-cpu-priority", Value, "10", Current},
    {"async_ckpt_io_priority", "--async-ckpt-io-priority", Value, "3", Current},
    {"async_strategy", "--async-strategy", Value, "nvrx", Current},
    {"attention_backend", "--attention-backend", Value, "auto", Current},
    {"attention_dropout", "--attention-dropout", Value, "0.1", Current},
    {"barrier_with_L1_time", "--no-barrier-with-level-1-timing", StoreFalse, "true", Current},
    {"batch_invariant_backend", "--batch-invariant-backend", Value, "te_native", Current},
    {"bert_binary_head", "--bert-no-binary-head", StoreFalse, "true", Current},
    {"bert_embedder_type", "--bert-embedder-type", Value, "megatron", Current},
    {"bias_dropout_fusion", "--no-bias-dropout-fusion", StoreFalse, "true", Current},
    {"bias_gelu_fusion", "--no-bias-gelu-fusion", StoreFalse, "true", Current},
    {"bias_swiglu_fusion", "--no-bias-swiglu-fusion", StoreFalse, "true", Current},
    {"biencoder_projection_dim", "--biencoder-projection-dim", Value, "0", Current},
    {"check_for_nan_in_loss_and_grad", "--no-check-for-nan-in-loss-and-grad", StoreFalse, "true", Current},
    {"ckpt_format", "--ckpt-format", Value, "torch_dist", Current},
    {"ckpt_fully_parallel_load_exchange_algo", "--ckpt-fully-parallel-load-exchange-algo", Value, "broadcast", Current},
    {"ckpt_fully_parallel_load_process_group", "--ckpt-fully-parallel-load-process-group", Value, "dp", Current},
    {"ckpt_fully_parallel_save", "--no-ckpt-fully-parallel-save", StoreFalse, "true", Current},
    {"ckpt_fully_parallel_save_deprecated", "--ckpt-fully-parallel-save", StoreTrue, "false", Current},
    {"ckpt_fully_parallel_save_process_group", "--ckpt-fully-parallel-save-process-group", Value, "dp", Current},
    {"ckpt_load_validate_sharding_integrity", "--no-ckpt-load-validate-sharding-integrity", StoreFalse, "true", Current},
    {"classes_fraction", "--classes-fraction", Value, "1.0", Current},
    {"clip_grad", "--clip-grad", Value, "1.0", Current},
    {"clone_scatter_output_in_embedding", "--no-clone-scatter-output-in-embedding", StoreFalse, "true", Current},
    {"config_logger_dir", "--config-logger-dir", Value, "", Current},
    {"context_parallel_size", "--context-parallel-size", Value, "1", Current},
    {"cp_comm_type", "--cp-comm-type", Value, "p2p", Current},
    {"cpu_offloading_num_layers", "--cpu-offloading-num-layers", Value, "0", Current},
    {"create_attention_mask_in_dataloader", "--no-create-attention-mask-in-dataloader", StoreFalse, "true", Current},
    {"cross_entropy_fusion_impl", "--cross-entropy-fusion-impl", Value, "native", Current},
    {"cuda_graph_impl", "--cuda-graph-impl", Value, "none", Current},
    {"cuda_graph_modules", "--cuda-graph-modules", Value, "", Current},
    {"cuda_graph_scope_deprecated", "--cuda-graph-scope", Value, nullptr, Current},
    {"cuda_graph_warmup_steps", "--cuda-graph-warmup-steps", Value, "3", Current},
    {"data_parallel_sharding_strategy", "--data-parallel-sharding-strategy", Value, "optim_grads_params", Current},
    {"data_per_class_fraction", "--data-per-class-fraction", Value, "1.0", Current},
    {"data_sharding", "--no-data-sharding", StoreFalse, "true", Current},
    {"ddp_param_name_patterns_for_fp32_local_accumulation", "--ddp-param-name-patterns-for-fp32-local-accumulation", Value, "", Current},
    {"delta_offload_bytes_across_pp_ranks", "--delta-offload-bytes-across-pp-ranks", Value, "0", Current},
    {"deprecated_use_mcore_models", "--use-mcore-models", StoreTrue, "false", Current},
    {"dino_bottleneck_size", "--dino-bottleneck-size", Value, "256", Current},
    {"dino_freeze_last_layer", "--dino-freeze-last-layer", Value, "1", Current},
    {"dino_head_hidden_size", "--dino-head-hidden-size", Value, "2048", Current},
    {"dino_local_crops_number", "--dino-local-crops-number", Value, "10", Current},
    {"dino_local_img_size", "--dino-local-img-size", Value, "96", Current},
    {"dino_teacher_temp", "--dino-teacher-temp", Value, "0.07", Current},
    {"dino_warmup_teacher_temp", "--dino-warmup-teacher-temp", Value, "0.04", Current},
    {"dino_warmup_teacher_temp_epochs", "--dino-warmup-teacher-temp-epochs", Value, "30", Current},
    {"disable_msc_deprecated", "--disable-msc", StoreTrue, "false", Current},
    {"dist_ckpt_format_deprecated", "--dist-ckpt-format", Value, nullptr, Current},
    {"dist_ckpt_strictness", "--dist-ckpt-strictness", Value, "assume_ok_unexpected", Current},
    {"dist_ckpt_workers", "--dist-ckpt-workers", Value, "1", Current},
    {"distributed_backend", "--distributed-backend", Value, "nccl", Current},
    {"distributed_timeout_minutes", "--distributed-timeout-minutes", Value, "10", Current},
    {"dsa_indexer_rotate_activation", "--no-dsa-indexer-rotate-activation", StoreFalse, "true", Current},
    {"dsa_indexer_scoring_relu", "--no-dsa-indexer-scoring-relu", StoreFalse, "true", Current},
    {"dsa_indexer_skip_topk_offset", "--dsa-indexer-skip-topk-offset", Value, "0", Current},
    {"dsa_indexer_topk_freq", "--dsa-indexer-topk-freq", Value, "1", Current},
    {"dsa_kernel_backend", "--dsa-kernel-backend", Value, "none", Current},
    {"empty_unused_memory_level", "--empty-unused-memory-level", Value, "0", Current},
    {"enable_one_logger", "--no-one-logger", StoreFalse, "true", Current},
    {"error_injection_rate", "--error-injection-rate", Value, "0", Current},
    {"error_injection_type", "--error-injection-type", Value, "transient_error", Current},
    {"eval_iters", "--eval-iters", Value, "100", Current},
    {"exit_signal", "--exit-signal", Value, "SIGTERM", Current},
    {"exp_avg_dtype", "--exp-avg-dtype", Value, "fp32", Current},
    {"exp_avg_sq_dtype", "--exp-avg-sq-dtype", Value, "fp32", Current},
    {"expert_model_parallel_size", "--expert-model-parallel-size", Value, "1", Current},
    {"fim_eod_token", "--fim-eod-token", Value, "<|endoftext|>", Current},
    {"fim_middle_token", "--fim-middle-token", Value, "<fim_middle>", Current},
    {"fim_pad_token", "--fim-pad-token", Value, "<fim_pad>", Current},
    {"fim_prefix_token", "--fim-prefix-token", Value, "<fim_prefix>", Current},
    {"fim_rate", "--fim-rate", Value, "0.5", Current},
    {"fim_spm_rate", "--fim-spm-rate", Value, "0.5", Current},
    {"fim_suffix_token", "--fim-suffix-token", Value, "<fim_suffix>", Current},
    {"flight_recorder_dump_on_timeout", "--no-flight-recorder-dump-on-timeout", StoreFalse, "true", Current},
    {"flight_recorder_extra_dump_on_exec", "--no-flight-recorder-extra-dump-on-exec", StoreFalse, "true", Current},
    {"flight_recorder_include_only_active", "--no-flight-recorder-include-only-active", StoreFalse, "true", Current},
    {"flight_recorder_trace_buffer_size", "--flight-recorder-trace-buffer-size", Value, "2000", Current},
    {"fp4", "--fp4-format", Value, nullptr, Current},
    {"fp4_recipe", "--fp4-recipe", Value, "nvfp4", Current},
    {"fp8", "--fp8-format", Value, nullptr, Current},
    {"fp8_amax_compute_algo", "--fp8-amax-compute-algo", Value, "most_recent", Current},
    {"fp8_amax_history_len", "--fp8-amax-history-len", Value, "1", Current},
    {"fp8_interval", "--fp8-interval", Value, "1", Current},
    {"fp8_margin", "--fp8-margin", Value, "0", Current},
    {"fp8_recipe", "--fp8-recipe", Value, "delayed", Current},
    {"fp8_wgrad", "--no-fp8-wgrad", StoreFalse, "true", Current},
    {"ft_num_warmup_iters", "--ft-num-warmup-iters", Value, "5", Current},
    {"gdp_num_chunk_states_to_recompute", "--gdp-num-chunk-states-to-recompute", Value, "2", Current},
    {"gdp_num_householder", "--gdp-num-householder", Value, "3", Current},
    {"glu_linear_offset", "--glu-linear-offset", Value, "0.0", Current},
    {"gradient_accumulation_fusion", "--no-gradient-accumulation-fusion", StoreFalse, "true", Current},
    {"gradient_reduce_div_fusion", "--no-gradient-reduce-div-fusion", StoreFalse, "true", Current},
    {"grpo_clamp_eps_lower", "--grpo-clamp-eps-lower", Value, "0.01", Current},
    {"grpo_clamp_eps_upper", "--grpo-clamp-eps-upper", Value, "0.01", Current},
    {"grpo_entropy_term_weight", "--grpo-entropy-term-weight", Value, "0.0", Current},
    {"grpo_group_size", "--grpo-group-size", Value, "2", Current},
    {"grpo_iterations", "--grpo-iterations", Value, "2", Current},
    {"grpo_kl_beta", "--grpo-kl-beta", Value, "0.001", Current},
    {"grpo_prompts_per_step", "--grpo-prompts-per-step", Value, "32", Current},
    {"gtp_remat_opt_in_modules", "--gtp-remat-opt-in-modules", Value, "", Current},
    {"head_lr_mult", "--head-lr-mult", Value, "1.0", Current},
    {"hidden_dropout", "--hidden-dropout", Value, "0.1", Current},
    {"high_priority_stream_groups", "--high-priority-stream-groups", Value, "", Current},
    {"hysteresis", "--hysteresis", Value, "2", Current},
    {"img_h", "--img-h", Value, "224", Current},
    {"img_w", "--img-w", Value, "224", Current},
    {"indexer_batch_size", "--indexer-batch-size", Value, "128", Current},
    {"indexer_log_interval", "--indexer-log-interval", Value, "1000", Current},
    {"inference_batch_times_seqlen_threshold", "--inference-batch-times-seqlen-threshold", Value, "-1", Current},
    {"inference_cuda_graph_max_tokens", "--inference-cuda-graph-max-tokens", Value, "512", Current},
    {"inference_disable_ep_consensus", "--inference-disable-ep-consensus", Both, "false", Current},
    {"inference_dynamic_batching_async_sched_mode", "--inference-dynamic-batching-async-sched-mode", Value, "legacy", Current},
    {"inference_dynamic_batching_block_size", "--inference-dynamic-batching-block-size", Value, "256", Current},
    {"inference_dynamic_batching_buffer_size_gb", "--inference-dynamic-batching-buffer-size-gb", Value, "40.0", Current},
    {"inference_dynamic_batching_cuda_graph_mixed_prefill_count", "--inference-dynamic-batching-cuda-graph-mixed-prefill-count", Value, "16", Current},
    {"inference_dynamic_batching_cuda_graph_sizing_distribution", "--inference-dynamic-batching-cuda-graph-sizing-distribution", Value, "exponential", Current},
    {"inference_dynamic_batching_enable_prefix_caching", "--inference-dynamic-batching-prefix-caching", Both, "false", Current},
    {"inference_dynamic_batching_logprobs_mode", "--inference-dynamic-batching-logprobs-mode", Value, "raw_logprobs", Current},
    {"inference_dynamic_batching_num_cuda_graphs", "--inference-dynamic-batching-num-cuda-graphs", Value, "16", Current},
    {"inference_dynamic_batching_prefix_caching_coordinator_policy", "--inference-dynamic-batching-prefix-caching-coordinator-policy", Value, "load_balanced", Current},
    {"inference_dynamic_batching_prefix_caching_eviction_policy", "--inference-dynamic-batching-prefix-caching-eviction-policy", Value, "ref_zero", Current},
    {"inference_dynamic_batching_prefix_caching_routing_alpha", "--inference-dynamic-batching-prefix-caching-routing-alpha", Value, "0.5", Current},
    {"inference_dynamic_batching_sampling_backend", "--inference-dynamic-batching-sampling-backend", Value, "torch", Current},
    {"inference_dynamic_batching_unified_memory_level", "--inference-dynamic-batching-unified-memory-level", Value, "0", Current},
    {"inference_grouped_gemm_backend", "--inference-grouped-gemm-backend", Value, "vllm", Current},
    {"inference_logging_step_interval", "--inference-logging-step-interval", Value, "0", Current},
    {"inference_max_requests", "--inference-max-requests", Value, "8", Current},
    {"inference_max_seq_length", "--inference-max-seq-length", Value, "2560", Current},
    {"inference_moe_token_dispatcher_type", "--inference-moe-token-dispatcher-type", Value, "nvls", Current},
    {"inference_text_gen_server_logging", "--inference-text-gen-server-logging", Both, "false", Current},
    {"inference_use_synchronous_zmq_collectives", "--inference-use-synchronous-zmq-collectives", Both, "false", Current},
    {"inference_wandb_logging", "--inference-wandb-logging", Both, "false", Current},
    {"init_method_std", "--init-method-std", Value, "0.02", Current},
    {"initial_loss_scale", "--initial-loss-scale", Value, "4294967296", Current},
    {"inprocess_active_world_size", "--inprocess-active-world-size", Value, "1", Current},
    {"inprocess_barrier_timeout", "--inprocess-barrier-timeout", Value, "120", Current},
    {"inprocess_completion_timeout", "--inprocess-completion-timeout", Value, "120", Current},
    {"inprocess_granularity", "--inprocess-granularity", Value, "node", Current},
    {"inprocess_hard_timeout", "--inprocess-hard-timeout", Value, "90", Current},
    {"inprocess_heartbeat_interval", "--inprocess-heartbeat-interval", Value, "30", Current},
    {"inprocess_heartbeat_timeout", "--inprocess-heartbeat-timeout", Value, "60", Current},
    {"inprocess_last_call_wait", "--inprocess-last-call-wait", Value, "1", Current},
    {"inprocess_monitor_process_interval", "--inprocess-monitor-process-interval", Value, "1.0", Current},
    {"inprocess_monitor_thread_interval", "--inprocess-monitor-thread-interval", Value, "1.0", Current},
    {"inprocess_progress_watchdog_interval", "--inprocess-progress-watchdog-interval", Value, "1.0", Current},
    {"inprocess_soft_timeout", "--inprocess-soft-timeout", Value, "60", Current},
    {"inprocess_termination_grace_time", "--inprocess-termination-grace-time", Value, "1", Current},
    {"iter_per_epoch", "--iter-per-epoch", Value, "1250", Current},
    {"iterations_to_skip", "--iterations-to-skip", Value, "", Current},
    {"kitchen_attention_backend", "--kitchen-attention-backend", Value, "sdpa", Current},
    {"kv_lora_rank", "--kv-lora-rank", Value, "32", Current},
    {"layernorm_epsilon", "--norm-epsilon", Value, "1e-05", Current},
    {"layernorm_zero_centered_gamma", "--apply-layernorm-1p", StoreTrue, "false", Current},
    {"linear_conv_kernel_dim", "--linear-conv-kernel-dim", Value, "4", Current},
    {"linear_key_head_dim", "--linear-key-head-dim", Value, "128", Current},
    {"linear_num_key_heads", "--linear-num-key-heads", Value, "16", Current},
    {"linear_num_value_heads", "--linear-num-value-heads", Value, "32", Current},
    {"linear_value_head_dim", "--linear-value-head-dim", Value, "128", Current},
    {"lion_beta1", "--lion-beta1", Value, "0.95", Current},
    {"lion_beta2", "--lion-beta2", Value, "0.98", Current},
    {"local_rank", "--local-rank", Value, "0", Current},
    {"log_interval", "--log-interval", Value, "100", Current},
    {"log_loss_scale_to_tensorboard", "--no-log-loss-scale-to-tensorboard", StoreFalse, "true", Current},
    {"logit_dtype", "--output-logit-dtype", Value, nullptr, Current},
    {"logits_load_decode_threads", "--logits-load-decode-threads", Value, "4", Current},
    {"logits_load_kd_loss_alpha", "--logits-load-kd-loss-alpha", Value, "1.0", Current},
    {"logits_load_msc_prefetch_depth", "--logits-load-msc-prefetch-depth", Value, "2", Current},
    {"logits_load_prefetch_factor", "--logits-load-prefetch-factor", Value, "3", Current},
    {"logits_save_dtype", "--logits-save-dtype", Value, "fp16", Current},
    {"logits_save_top_p_min_k", "--logits-save-top-p-min-k", Value, "1", Current},
    {"loss_scale_window", "--loss-scale-window", Value, "1000", Current},
    {"lr_decay_style", "--lr-decay-style", Value, "linear", Current},
    {"lr_warmup_init", "--lr-warmup-init", Value, "0.0", Current},
    {"lr_warmup_iters", "--lr-warmup-iters", Value, "0", Current},
    {"lr_warmup_samples", "--lr-warmup-samples", Value, "0", Current},
    {"lr_wsd_decay_style", "--lr-wsd-decay-style", Value, "exponential", Current},
    {"main_grads_dtype", "--main-grads-dtype", Value, "fp32", Current},
    {"main_params_dtype", "--main-params-dtype", Value, "fp32", Current},
    {"make_vocab_size_divisible_by", "--make-vocab-size-divisible-by", Value, "128", Current},
    {"mamba_head_dim", "--mamba-head-dim", Value, "64", Current},
    {"mamba_inference_conv_states_dtype", "--mamba-inference-conv-states-dtype", Value, "bf16", Current},
    {"mamba_inference_ssm_states_dtype", "--mamba-inference-ssm-states-dtype", Value, "bf16", Current},
    {"mamba_num_groups", "--mamba-num-groups", Value, "8", Current},
    {"mamba_state_dim", "--mamba-state-dim", Value, "128", Current},
    {"manual_gc_eval", "--no-manual-gc-eval", StoreFalse, "true", Current},
    {"manual_gc_interval", "--manual-gc-interval", Value, "0", Current},
    {"mask_factor", "--mask-factor", Value, "1.0", Current},
    {"mask_prob", "--mask-prob", Value, "0.15", Current},
    {"mask_type", "--mask-type", Value, "random", Current},
    {"masked_softmax_fusion", "--no-masked-softmax-fusion", StoreFalse, "true", Current},
    {"max_tokens_to_oom", "--max-tokens-to-oom", Value, "12000", Current},
    {"megatron_fsdp_grad_comm_dtype", "--megatron-fsdp-grad-comm-dtype", Value, "auto", Current},
    {"megatron_fsdp_main_grads_dtype", "--megatron-fsdp-main-grads-dtype", Value, "auto", Current},
    {"megatron_fsdp_main_params_dtype", "--megatron-fsdp-main-params-dtype", Value, "fp32", Current},
    {"megatron_fsdp_version", "--megatron-fsdp-version", Value, "1", Current},
    {"memory_snapshot_path", "--memory-snapshot-path", Value, "snapshot.pickle", Current},
    {"metadata_path", "--tokenizer-metadata", Value, nullptr, Current},
    {"mhc_init_gating_factor", "--mhc-init-gating-factor", Value, "0.01", Current},
    {"mhc_num_residual_streams", "--mhc-num-residual-streams", Value, "4", Current},
    {"mhc_sinkhorn_iterations", "--mhc-sinkhorn-iterations", Value, "20", Current},
    {"microbatch_group_size_per_vp_stage", "--microbatch-group-size-per-virtual-pipeline-stage", Value, nullptr, Current},
    {"mid_level_dataset_surplus", "--mid-level-dataset-surplus", Value, "0.005", Current},
    {"min_loss_scale", "--min-loss-scale", Value, "1.0", Current},
    {"min_lr", "--min-lr", Value, "0.0", Current},
    {"min_offloaded_tensor_size", "--min-offloaded-tensor-size", Value, "1048576", Current},
    {"mlp_chunks_for_prefill", "--mlp-chunks-for-prefill", Value, "1", Current},
    {"mlp_chunks_for_training", "--mlp-chunks-for-training", Value, "1", Current},
    {"mmap_bin_files", "--no-mmap-bin-files", StoreFalse, "true", Current},
    {"moe_aux_loss_coeff", "--moe-aux-loss-coeff", Value, "0.0", Current},
    {"moe_combine_bwd_dtype", "--moe-combine-bwd-dtype", Value, "bf16", Current},
    {"moe_dispatch_fwd_dtype", "--moe-dispatch-fwd-dtype", Value, "bf16", Current},
    {"moe_flex_dispatcher_backend", "--moe-flex-dispatcher-backend", Value, "deepep", Current},
    {"moe_hybridep_num_sms_preprocessing", "--moe-hybridep-num-sms-preprocessing", Value, "108", Current},
    {"moe_layer_freq", "--moe-layer-freq", Value, "1", Current},
    {"moe_paged_stash_buffer_size_factor_cpu", "--moe-paged-stash-buffer-size-factor-cpu", Value, "0.0", Current},
    {"moe_paged_stash_buffer_size_factor_cuda", "--moe-paged-stash-buffer-size-factor-cuda", Value, "1.1", Current},
    {"moe_paged_stash_page_size", "--moe-paged-stash-page-size", Value, "64", Current},
    {"moe_router_bias_update_rate", "--moe-router-bias-update-rate", Value, "0.001", Current},
    {"moe_router_load_balancing_type", "--moe-router-load-balancing-type", Value, "aux_loss", Current},
    {"moe_router_quantile_balancing_ema", "--moe-router-quantile-balancing-ema", Value, "0.0", Current},
    {"moe_router_score_function", "--moe-router-score-function", Value, "softmax", Current},
    {"moe_router_topk", "--moe-router-topk", Value, "2", Current},
    {"moe_token_dispatcher_type", "--moe-token-dispatcher-type", Value, "allgather", Current},
    {"moe_token_drop_policy", "--moe-token-drop-policy", Value, "probs", Current},
    {"moe_upcycling_granularity", "--moe-upcycling-granularity", Value, "1", Current},
    {"mscale", "--mscale", Value, "1.0", Current},
    {"mscale_all_dim", "--mscale-all-dim", Value, "0.0", Current},
    {"mtp_loss_scaling_factor", "--mtp-loss-scaling-factor", Value, "0.1", Current},
    {"muon_coefficient_type", "--muon-coefficient-type", Value, "quintic", Current},
    {"muon_extra_scale_factor", "--muon-extra-scale-factor", Value, "1.0", Current},
    {"muon_fp32_matmul_prec", "--muon-fp32-matmul-prec", Value, "medium", Current},
    {"muon_momentum", "--muon-momentum", Value, "0.9", Current},
    {"muon_num_ns_steps", "--muon-num-ns-steps", Value, "5", Current},
    {"muon_scalar_optimizer", "--muon-scalar-optimizer", Value, "adam", Current},
    {"muon_scale_mode", "--muon-scale-mode", Value, "spectral", Current},
    {"muon_split_qkv", "--muon-no-split-qkv", StoreFalse, "true", Current},
    {"muon_tp_mode", "--muon-tp-mode", Value, "duplicated", Current},
    {"mup_attn_scale_power", "--mup-attn-scale-power", Value, "1.0", Current},
    {"mup_embedding_mult", "--mup-embedding-mult", Value, "1.0", Current},
    {"mup_output_mult", "--mup-output-mult", Value, "1.0", Current},
    {"mup_width_mult", "--mup-width-mult", Value, "1.0", Current},
    {"nccl_ub", "--use-nccl-ub", StoreTrue, "false", Current},
    {"no_load_optim", "--no-load-optim", StoreTrue, nullptr, Current},
    {"no_load_rng", "--no-load-rng", StoreTrue, nullptr, Current},
    {"no_save_optim", "--no-save-optim", StoreTrue, nullptr, Current},
    {"no_save_rng", "--no-save-rng", StoreTrue, nullptr, Current},
    {"non_persistent_local_ckpt_algo", "--non-persistent-local-ckpt-algo", Value, "fully_parallel", Current},
    {"normalization", "--normalization", Value, "LayerNorm", Current},
    {"null_tokenizer_pad_id", "--null-tokenizer-pad-id", Value, "-1", Current},
    {"num_channels", "--num-channels", Value, "3", Current},
    {"num_classes", "--num-classes", Value, "1000", Current},
    {"num_dataset_builder_threads", "--num-dataset-builder-threads", Value, "1", Current},
    {"num_distributed_optimizer_instances", "--num-distributed-optimizer-instances", Value, "1", Current},
    {"num_layers_at_end_in_bf16", "--num-layers-at-end-in-bf16", Value, "1", Current},
    {"num_layers_at_start_in_bf16", "--num-layers-at-start-in-bf16", Value, "1", Current},
    {"num_query_groups", "--num-query-groups", Value, "1", Current},
    {"num_speculative_tokens", "--num-speculative-tokens", Value, "0", Current},
    {"num_workers", "--num-workers", Value, "2", Current},
    {"offload_modules", "--offload-modules", Value, "", Current},
    {"offset_sampling_seed_by_dp_rank", "--use-same-sampling-seed-across-dp-ranks", StoreFalse, "true", Current},
    {"one_logger_project", "--one-logger-project", Value, "megatron-lm", Current},
    {"optimizer", "--optimizer", Value, "adam", Current},
    {"optimizer_offload_fraction", "--optimizer-offload-fraction", Value, "1.0", Current},
    {"outer_dp_sharding_strategy", "--outer-dp-sharding-strategy", Value, "no_shard", Current},
    {"overlap_p2p_comm", "--no-overlap-p2p-communication", StoreFalse, "true", Current},
    {"overlap_p2p_comm_warmup_flush", "--overlap-p2p-communication-warmup-flush", StoreTrue, "false", Current},
    {"override_opt_param_scheduler", "--override-opt_param-scheduler", StoreTrue, "false", Current},
    {"pad_vocab_size", "--no-pad-vocab-size", StoreFalse, "true", Current},
    {"patch_dim", "--patch-dim", Value, "16", Current},
    {"perform_initialization", "--no-initialization", StoreFalse, "true", Current},
    {"pin_cpu_grads", "--no-pin-cpu-grads", StoreFalse, "true", Current},
    {"pin_cpu_params", "--no-pin-cpu-params", StoreFalse, "true", Current},
    {"pipeline_model_parallel_size", "--pipeline-model-parallel-size", Value, "1", Current},
    {"position_embedding_type", "--position-embedding-type", Value, "learned_absolute", Current},
    {"profile_ranks", "--profile-ranks", Value, "", Current},
    {"profile_step_end", "--profile-step-end", Value, "12", Current},
    {"profile_step_start", "--profile-step-start", Value, "10", Current},
    {"qk_clip_alpha", "--qk-clip-alpha", Value, "0.5", Current},
    {"qk_clip_threshold", "--qk-clip-threshold", Value, "100", Current},
    {"qk_head_dim", "--qk-head-dim", Value, "128", Current},
    {"qk_pos_emb_head_dim", "--qk-pos-emb-head-dim", Value, "64", Current},
    {"query_in_block_prob", "--query-in-block-prob", Value, "0.1", Current},
    {"refit_method", "--refit-method", Value, "gloo", Current},
    {"relative_attention_max_distance", "--relative-attention-max-distance", Value, "128", Current},
    {"relative_attention_num_buckets", "--relative-attention-num-buckets", Value, "32", Current},
    {"replication_factor", "--replication-factor", Value, "2", Current},
    {"rerun_mode", "--rerun-mode", Value, "validate_results", Current},
    {"retriever_report_topk_accuracies", "--retriever-report-topk-accuracies", Value, "", Current},
    {"rl_consumption_granularity", "--rl-consumption-granularity", Value, "B", Current},
    {"rl_default_temperature", "--rl-default-temperature", Value, "1.0", Current},
    {"rl_default_top_k", "--rl-default-top-k", Value, "-1", Current},
    {"rl_default_top_p", "--rl-default-top-p", Value, "0", Current},
    {"rl_inference_logprobs_is_correction", "--rl-inference-logprobs-is-correction", Both, "false", Current},
    {"rl_inference_model_unified_memory_level", "--rl-inference-model-unified-memory-level", Value, "0", Current},
    {"rl_inference_parsers", "--rl-inference-parsers", Value, "", Current},
    {"rl_kv_cache_management_mode", "--rl-kv-cache-management-mode", Value, "persist", Current},
    {"rl_offload_inference_model_weights_when_idle", "--rl-offload-inference-model-weights-when-idle", Both, "false", Current},
    {"rl_partial_rollouts", "--rl-partial-rollouts", Both, "false", Current},
    {"rl_persist_cuda_graphs", "--rl-persist-cuda-graphs", Both, "false", Current},
    {"rl_prompts_per_eval", "--rl-prompts-per-eval", Value, "32", Current},
    {"rl_rollout_bank_max_bytes", "--rl-rollout-bank-max-bytes", Value, "0", Current},
    {"rl_sequence_packing_algo", "--rl-sequence-packing-algo", Value, "fifo", Current},
    {"rl_sequence_packing_max_sequences_per_bin", "--rl-sequence-packing-max-sequences-per-bin", Value, "50", Current},
    {"rl_skip_bos_token", "--rl-skip-bos-token", Both, "false", Current},
    {"rl_submission_granularity", "--rl-submission-granularity", Value, "B", Current},
    {"rl_training_cuda_graphs", "--rl-training-cuda-graphs", Both, "false", Current},
    {"rl_use_sequence_packing", "--rl-use-sequence-packing", Both, "false", Current},
    {"rl_verify_model_weights_swap", "--rl-verify-model-weights-swap", Both, "false", Current},
    {"rope_scaling_factor", "--rope-scaling-factor", Value, "8.0", Current},
    {"rotary_base", "--rotary-base", Value, "10000", Current},
    {"rotary_percent", "--rotary-percent", Value, "1.0", Current},
    {"rotary_scaling_factor", "--rotary-scaling-factor", Value, "1.0", Current},
    {"sample_rate", "--sample-rate", Value, "1.0", Current},
    {"save_tokenizer_assets", "--no-save-tokenizer-assets", StoreFalse, "true", Current},
    {"seed", "--seed", Value, "1234", Current},
    {"sft_tokenizer_prompt_format", "--sft-tokenizer-prompt-format", Value, "nemotron-h-aligned", Current},
    {"sgd_momentum", "--sgd-momentum", Value, "0.9", Current},
    {"short_seq_prob", "--short-seq-prob", Value, "0.1", Current},
    {"softmax_type", "--softmax-type", Value, "vanilla", Current},
    {"special_tokens", "--tokenizer-special-tokens", Value, nullptr, Current},
    {"straggler_ctrlr_port", "--straggler-ctrlr-port", Value, "65535", Current},
    {"straggler_minmax_count", "--straggler-minmax-count", Value, "1", Current},
    {"strict_fsdp_dtensor_load", "--no-strict-fsdp-dtensor-load", StoreFalse, "true", Current},
    {"swin_backbone_type", "--swin-backbone-type", Value, "tiny", Current},
    {"tensor_model_parallel_size", "--tensor-model-parallel-size", Value, "1", Current},
    {"tensorboard_log_interval", "--tensorboard-log-interval", Value, "1", Current},
    {"tensorboard_queue_size", "--tensorboard-queue-size", Value, "1000", Current},
    {"tiktoken_num_special_tokens", "--tiktoken-num-special-tokens", Value, "1000", Current},
    {"timing_log_level", "--timing-log-level", Value, "0", Current},
    {"timing_log_option", "--timing-log-option", Value, "minmax", Current},
    {"tokenizer_sentencepiece_ignore_extra_whitespaces", "--no-tokenizer-sentencepiece-ignore-extra-whitespaces", StoreFalse, "true", Current},
    {"torch_fsdp2_reshard_after_forward", "--torch-fsdp2-no-reshard-after-forward", StoreFalse, "true", Current},
    {"tp_comm_bootstrap_backend", "--tp-comm-bootstrap-backend", Value, "nccl", Current},
    {"tp_comm_bulk_dgrad", "--no-tp-comm-bulk-dgrad", StoreFalse, "true", Current},
    {"tp_comm_bulk_wgrad", "--no-tp-comm-bulk-wgrad", StoreFalse, "true", Current},
    {"tp_comm_overlap_ag", "--no-tp-comm-overlap-ag", StoreFalse, "true", Current},
    {"tp_comm_overlap_rs", "--no-tp-comm-overlap-rs", StoreFalse, "true", Current},
    {"tp_comm_split_ag", "--no-tp-comm-split-ag", StoreFalse, "true", Current},
    {"tp_comm_split_rs", "--no-tp-comm-split-rs", StoreFalse, "true", Current},
    {"transformer_impl", "--transformer-impl", Value, "transformer_engine", Current},
    {"use_checkpoint_opt_param_scheduler", "--use-checkpoint-opt_param-scheduler", StoreTrue, "false", Current},
    {"use_cpu_initialization", "--use-cpu-initialization", StoreTrue, nullptr, Current},
    {"use_dist_ckpt_deprecated", "--use-dist-ckpt", StoreTrue, "false", Current},
    {"use_gloo_process_groups", "--disable-gloo-process-groups", StoreFalse, "true", Current},
    {"use_layer_wise_param_layout", "--no-use-layer-wise-param-layout", StoreFalse, "true", Current},
    {"use_mamba_mem_eff_path", "--disable-mamba-mem-eff-path", StoreFalse, "true", Current},
    {"use_tokenizer_model_from_checkpoint_args", "--no-use-tokenizer-model-from-checkpoint-args", StoreFalse, "true", Current},
    {"v_head_dim", "--v-head-dim", Value, "128", Current},
    {"vision_backbone_type", "--vision-backbone-type", Value, "vit", Current},
    {"vision_pretraining_type", "--vision-pretraining-type", Value, "classify", Current},
    {"vocab_extra_ids", "--vocab-extra-ids", Value, "0", Current},
    {"weight_decay", "--weight-decay", Value, "0.01", Current},
    {"weight_decay_incr_style", "--weight-decay-incr-style", Value, "constant", Current},
    {"wgrad_deferral_limit", "--wgrad-deferral-limit", Value, "0", Current},
    {"yarn_correction_range_round_to_int", "--yarn-correction-range-round-to-int", StoreTrue, nullptr, Current},
    {"apply_layernorm_1p", "--apply-layernorm-1p", StoreTrue, "false", Primus},
    {"async_tensor_model_parallel_allreduce", "--no-async-tensor-model-parallel-allreduce", StoreFalse, "true", Primus},
    {"cuda_graph_scope", "--cuda-graph-scope", Value, "full", Primus},
    {"disable_mamba_mem_eff_path", "--disable-mamba-mem-eff-path", StoreTrue, "false", Primus},
    {"enable_gloo_process_groups", "--disable-gloo-process-groups", StoreFalse, "true", Primus},
    {"encoder_pipeline_model_parallel_size", "--encoder-pipeline-model-parallel-size", Value, "0", Primus},
    {"encoder_tensor_model_parallel_size", "--encoder-tensor-model-parallel-size", Value, "0", Primus},
    {"hybrid_attention_ratio", "--hybrid-attention-ratio", Value, "0.0", Primus},
    {"hybrid_mlp_ratio", "--hybrid-mlp-ratio", Value, "0.0", Primus},
    {"inference_dynamic_batching_buffer_guaranteed_fraction", "--inference-dynamic-batching-buffer-guaranteed-fraction", Value, "0.2", Primus},
    {"inference_dynamic_batching_buffer_overflow_factor", "--inference-dynamic-batching-buffer-overflow-factor", Value, nullptr, Primus},
    {"inference_dynamic_batching_chunk_size", "--inference-dynamic-batching-chunk-size", Value, "256", Primus},
    {"inference_dynamic_batching_max_requests_override", "--inference-dynamic-batching-max-requests-override", Value, nullptr, Primus},
    {"inference_dynamic_batching_max_tokens_override", "--inference-dynamic-batching-max-tokens-override", Value, nullptr, Primus},
    {"inference_max_batch_size", "--inference-max-requests", Value, "8", Primus},
    {"keep_fp8_transpose_cache_when_using_custom_fsdp", "--keep-fp8-transpose-cache-when-using-custom-fsdp", StoreTrue, "false", Primus},
    {"moe_extended_tp", "--moe-extended-tp", StoreTrue, "false", Primus},
    {"moe_use_legacy_grouped_gemm", "--moe-use-legacy-grouped-gemm", StoreTrue, "false", Primus},
    {"norm_epsilon", "--norm-epsilon", Value, "1e-05", Primus},
    {"pipeline_model_parallel_split_rank", "--pipeline-model-parallel-split-rank", Value, nullptr, Primus},
    {"retriever_seq_length", "--retriever-seq-length", Value, "256", Primus},
    {"retro_add_retriever", "--retro-add-retriever", StoreTrue, "false", Primus},
    {"retro_attention_gate", "--retro-attention-gate", Value, "1", Primus},
    {"retro_cyclic_train_iters", "--retro-cyclic-train-iters", Value, nullptr, Primus},
    {"retro_encoder_attention_dropout", "--retro-encoder-attention-dropout", Value, "0.1", Primus},
    {"retro_encoder_hidden_dropout", "--retro-encoder-hidden-dropout", Value, "0.1", Primus},
    {"retro_encoder_layers", "--retro-encoder-layers", Value, "2", Primus},
    {"retro_num_neighbors", "--retro-num-neighbors", Value, "2", Primus},
    {"retro_num_retrieved_chunks", "--retro-num-retrieved-chunks", Value, "2", Primus},
    {"retro_project_dir", "--retro-project-dir", Value, nullptr, Primus},
    {"retro_verify_neighbor_count", "--retro-no-verify-neighbor-count", StoreFalse, "true", Primus},
    {"scatter_gather_tensors_in_pipeline", "--no-scatter-gather-tensors-in-pipeline", StoreFalse, "true", Primus},
    {"tiktoken_special_tokens", "--tiktoken-special-tokens", Value, nullptr, Primus},
    {"use_custom_fsdp", "--use-custom-fsdp", StoreTrue, "false", Primus},
    {"use_legacy_models", "--use-legacy-models", StoreTrue, "false", Primus},
  };
  return rows;
}

namespace {

// Current Megatron's dests that the plain rule gives, space-separated: values, then switches.
const char* const kPlainValueDests =
    "activation_func_clamp_value app_tag_run_name batch_size bert_load block_data_path "
    "chat_template check_weight_hash_across_dp_replicas_interval ckpt_convert_format "
    "ckpt_convert_save ckpt_pg_tensors_cache_path ckpt_step data_args_path data_cache_path "
    "data_path dataloader_type ddp_bucket_size ddp_num_buckets "
    "decoder_first_pipeline_num_layers decoder_last_pipeline_num_layers decoder_num_layers "
    "decoder_seq_length decoupled_lr decoupled_min_lr distributed_timeout_seconds_after_init "
    "dsa_indexer_head_dim dsa_indexer_k_norm_epsilon dsa_indexer_loss_coeff "
    "dsa_indexer_n_heads dsa_indexer_topk dump_param_to_param_group_map "
    "embedding_init_method_std embedding_path encoder_num_layers encoder_seq_length "
    "end_weight_decay eval_global_batch_size eval_interval eval_micro_batch_size "
    "evidence_data_path exit_duration_in_mins exit_interval experimental_attention_variant "
    "expert_tensor_parallel_num_weight_shards expert_tensor_parallel_size "
    "fault_injector_delay_start_iteration fault_injector_fault_delay "
    "fault_injector_fault_probabilities fault_injector_fault_types fault_injector_mtti_seconds "
    "fault_injector_num_ranks fault_injector_offset_seconds fault_injector_ranks "
    "fault_injector_seed ffn_hidden_size fim_fragment_rate fim_no_prefix fim_split_sample "
    "fine_grained_offloading_max_inflight_offloads flash_attention_version "
    "flight_recorder_dump_path fp4_quantizer_factory fp8_quantizer_factory global_batch_size "
    "gpu_sniff_test_interval heterogeneous_layers_config_encoded_json "
    "heterogeneous_layers_config_path hidden_size hierarchical_context_parallel_sizes "
    "hybrid_layer_pattern hybrid_override_pattern ict_head_size ict_load "
    "inference_coordinator_port inference_cuda_graph_scope "
    "inference_dynamic_batching_mamba_memory_ratio inference_dynamic_batching_max_requests "
    "inference_dynamic_batching_max_tokens inference_dynamic_batching_paused_buffer_size_gb "
    "inference_dynamic_batching_prefix_caching_mamba_gb inference_shards "
    "inprocess_max_iterations kv_channels langrl_env_config linear_attention_freq load "
    "log_memory_interval logging_level logits_load_dir logits_save_dir logits_save_top_k "
    "logits_save_top_p loss_scale lr lr_decay_iters lr_decay_samples lr_warmup_fraction "
    "lr_wsd_decay_iters lr_wsd_decay_samples mamba_num_heads mamba_training_ssm_states_dtype "
    "max_position_embeddings max_seqlen_per_dp_cp_rank merge_file mhc_recompute_layer_num "
    "micro_batch_size model_parallel_size moe_deepep_num_sms moe_expert_capacity_factor "
    "moe_expert_rank_capacity_factor moe_ffn_hidden_size moe_flex_dispatcher_num_sms "
    "moe_hybridep_num_blocks_permute moe_hybridep_num_blocks_unpermute moe_hybridep_num_sms "
    "moe_input_jitter_eps moe_latent_size moe_mlp_glu_interleave_size moe_router_dtype "
    "moe_router_force_biased moe_router_group_topk moe_router_num_groups "
    "moe_router_topk_scaling_factor moe_routing_trace_max_training_iters "
    "moe_routing_trace_path moe_shared_expert_glu_interleave_size "
    "moe_shared_expert_intermediate_size moe_z_loss_coeff mrope_section "
    "mtp_hybrid_override_pattern mtp_num_layers mup_base_head_dim mup_base_hidden_size "
    "nccl_communicator_config_path no_rope_freq no_weight_decay_cond_type "
    "non_persistent_ckpt_type non_persistent_global_ckpt_dir non_persistent_local_ckpt_dir "
    "non_persistent_save_interval null_tokenizer_eod_id num_attention_heads num_experts "
    "num_layers num_layers_per_virtual_pipeline_stage num_virtual_stages_per_pipeline_rank "
    "object_storage_cache_path one_logger_run_name onnx_safe otel_service_name "
    "otel_span_groups override_ckpt_iteration padded_vocab_size per_dataset_sequences_path "
    "per_split_data_args_path phase_transition_iterations pipeline_model_parallel_comm_backend "
    "pipeline_model_parallel_layout pretrained_checkpoint q_lora_rank rampup_batch_size "
    "recompute_granularity recompute_method recompute_modules recompute_num_layers "
    "replication_jump result_rejected_tracker_filename rl_generation_lag "
    "rl_importance_sampling_truncation_coef rl_inference_expert_model_parallel_size "
    "rl_inference_expert_tensor_model_parallel_size rl_inference_pipeline_model_parallel_size "
    "rl_inference_tensor_model_parallel_size rl_max_inflight_requests rl_profile_dir "
    "rl_rollout_bank_dir rope_type rotary_seq_len_interpolation_factor save "
    "save_activations_interval save_dgrads_interval save_interval save_params_interval "
    "save_retain_interval save_tokens_per_expert_interval save_wgrads_interval seq_length "
    "sharp_enabled_group spec split start_eval_at_iter start_weight_decay "
    "step_batch_size_schedule suggested_communication_unit_size symmetric_ar_type "
    "te_precision_config_file tensor_parallel_num_weight_shards tensorboard_dir test_data_path "
    "tiktoken_pattern titles_data_path tokenizer_model tokenizer_type tp_comm_overlap_cfg "
    "train_data_path train_iters train_samples train_sync_interval valid_data_path "
    "validation_set_names vocab_file vocab_size wandb_entity wandb_exp_name wandb_project "
    "wandb_save_dir warmup window_attn_skip_freq window_size yaml_cfg yarn_beta_fast "
    "yarn_beta_slow yarn_original_max_position_embeddings";
const char* const kPlainSwitchDests =
    "account_for_embedding_in_pipeline_split account_for_loss_in_pipeline_split "
    "accumulate_allreduce_grads_in_fp32 add_qkv_bias adlr_autoresume "
    "allow_ambiguous_pad_tokens apply_query_key_layer_scaling "
    "apply_residual_connection_post_layernorm apply_wd_to_qk_layernorm async_ckpt_use_cpu_shm "
    "async_save attention_output_gate attention_softmax_in_fp32 auto_detect_ckpt_format "
    "batch_invariant_mode bf16 biencoder_shared_query_context_model cache_mla_latents "
    "calc_ft_timeouts calculate_per_token_loss check_for_large_grads check_for_spiky_loss "
    "checkpoint_activations ckpt_assume_constant_structure "
    "ckpt_convert_update_legacy_dist_opt_format ckpt_drop_redundant_extra_state "
    "ckpt_fully_parallel_load ckpt_fully_parallel_load_per_rank_objects "
    "ckpt_pg_tensors_cache_create cpu_offloading_retain_pinned_cpu_buffers "
    "create_all_gather_group cross_entropy_loss_fusion data_parallel_random_init "
    "dataloader_defer_npy_index_mmap dataloader_fast_cache_load "
    "dataloader_inter_document_masking ddp_average_in_collective "
    "ddp_pad_buckets_for_high_nccl_busbw ddp_reduce_scatter_with_fp32_accumulation "
    "decode_only_cuda_graphs decrease_batch_size_if_needed defer_embedding_wgrad_compute "
    "delay_offload_until_cuda_graph delay_wgrad_compute deterministic_mode "
    "dino_norm_last_layer disable_bf16_reduced_precision_matmul disable_jit_fuser "
    "disable_straggler_on_startup disable_symmetric_registration "
    "dist_ckpt_optim_fully_reshardable dist_ckpt_save_pre_mcore_014 "
    "distrib_optim_fully_reshardable_mem_efficient distribute_saved_activations "
    "dsa_indexer_k_norm_fp32 dsa_indexer_rope_interleaved dsa_indexer_use_sparse_loss "
    "enable_chunked_prefill enable_cuda_graph enable_experimental enable_ft_package "
    "enable_full_sharding_in_hsdp enable_mhc_connections enable_msc eod_mask_loss "
    "ep_overlap_early_attn_memory_release exit_on_missing_checkpoint exit_signal_handler "
    "exit_signal_handler_for_dataloader exit_signal_handler_for_training external_cuda_graph "
    "fake_process_group fim_data fine_grained_activation_offloading finetune "
    "first_last_layers_bf16 flash_decode flight_recorder_include_stack_trace fp16 "
    "fp16_lm_cross_entropy fp32_residual_connection fp4_param_gather fp8_output_proj "
    "fp8_param_gather freeze_all_layers fsdp_db_use_persist_buf_on_alloc_fail "
    "fsdp_double_buffer fsdp_manual_registration full_validation fused_residual_rmsnorm "
    "gdp_cutedsl_kernel grad_reduce_in_bf16 group_query_attention "
    "grpo_filter_groups_with_same_reward gtp_expert_remat_nccl_ub gtp_remat_nccl_ub "
    "gtp_remat_reduce_scatter_with_fp32_accumulation high_priority_a2a_comm_stream "
    "hybrid_context_parallel inference_cuda_graph_all_prefills "
    "inference_disable_triton_nvls_kernels inference_dynamic_batching "
    "inference_dynamic_batching_track_generated_token_events "
    "inference_dynamic_batching_track_paused_request_events inference_fuse_tp_communication "
    "inference_moe_disable_fused_quant_kernels inference_rng_tracker "
    "init_method_xavier_uniform init_model_with_meta_device inprocess_empty_cuda_cache "
    "inprocess_restart is_hybrid_model keep_fp8_transpose_cache lazy_mpu_init "
    "load_main_params_from_ckpt log_device_memory_used log_energy log_max_attention_logit "
    "log_memory_to_tensorboard log_num_zeros_in_grad log_params_norm log_progress "
    "log_straggler log_throughput log_timers_to_tensorboard log_validation_ppl_to_tensorboard "
    "log_world_size_to_tensorboard logits_load_ignore_errors manual_gc "
    "megatron_fsdp_enable_fine_grained_param_gather megatron_fsdp_max_pool_double_buffer "
    "mla_down_proj_fusion mock_data moe_apply_probs_on_input moe_enable_deepep "
    "moe_enable_routing_replay moe_grouped_gemm moe_hybridep_pad_uneven_dispatch_inputs "
    "moe_layer_recompute moe_ncclep_zero_copy moe_pad_expert_input_to_capacity "
    "moe_pad_experts_for_cuda_graph_inference moe_paged_stash moe_per_layer_logging "
    "moe_permute_fusion moe_permute_fusion_into_hybridep moe_router_enable_expert_bias "
    "moe_router_force_load_balancing moe_router_fusion moe_router_padding_for_fp8 "
    "moe_router_padding_for_quantization moe_router_pre_softmax "
    "moe_routing_trace_capture_hidden_states moe_routing_trace_capture_logits "
    "moe_routing_trace_dump_weights moe_shared_expert_gate moe_shared_expert_overlap "
    "moe_single_grouped_bias moe_single_grouped_weight moe_use_grouped_tensor "
    "moe_use_upcycling mtp_detach_heads mtp_hsm mtp_standalone mtp_use_repeated_layer "
    "multi_latent_attention multiple_validation_sets muon_nesterov muon_use_syrk "
    "nccl_all_reduce_for_prefill no_persist_layer_norm nvtx_ranges one_logger_async "
    "openai_gelu optimizer_cpu_offload optimizer_cuda_graph otel_enabled "
    "output_bert_embeddings overlap_cpu_optimizer_d2h_h2d "
    "overlap_dispatch_backward_with_experts_wgrad overlap_grad_reduce "
    "overlap_moe_expert_parallel_comm overlap_param_gather "
    "overlap_param_gather_with_optimizer_step perform_rl_step profile "
    "pytorch_profiler_collect_callstack pytorch_profiler_collect_chakra "
    "pytorch_profiler_collect_shapes qk_clip qk_l2_norm qk_layernorm quick_geglu "
    "recompute_activations record_memory_history record_shapes replication "
    "reset_attention_mask reset_position_ids retriever_score_scaling "
    "reuse_grad_buf_for_mxfp8_param_ag rl_durable_rollout_bank "
    "rl_offload_optimizer_during_inference rl_profile rotary_interleaved "
    "run_workload_inspector_server sequence_parallel sft skip_train squared_relu swiglu "
    "te_rng_tracker test_mode tokenizer_hf_no_include_special_tokens tokenizer_hf_no_use_fast "
    "tokenizer_sentencepiece_legacy tp_comm_overlap tp_comm_overlap_rs_dgrad trust_remote_code "
    "untie_embeddings_and_output_weights use_checkpoint_args use_distributed_optimizer "
    "use_flash_attn use_fused_weighted_squared_relu use_gigatoken "
    "use_grouped_gemm_for_dense_mlp use_grouped_gemm_for_shared_expert use_kitchen_attention "
    "use_legacy_static_engine use_megatron_fsdp use_mp_args_from_checkpoint_args use_mup "
    "use_one_sent_docs use_persistent_ckpt_worker use_precision_aware_optimizer "
    "use_pytorch_profiler use_ring_exchange_p2p use_rope_scaling "
    "use_rotary_position_embeddings use_sharp use_te_activation_func use_torch_fsdp2 "
    "use_torch_optimizer_for_cpu_offload use_tp_pp_dp_mapping use_transformer_engine_op_fuser "
    "verify_integrity vision_pretraining";

}  // namespace

const MegatronDest* find_megatron_dest(const std::string& dest) {
  static const std::unordered_map<std::string, MegatronDest> index = [] {
    static std::deque<std::string> names;  // the plain rows' dests and flags
    std::unordered_map<std::string, MegatronDest> m;
    for (const MegatronDest& row : megatron_dest_rows()) m.emplace(row.dest, row);
    for (auto [list, action] : {std::pair{kPlainValueDests, DestAction::Value},
                                std::pair{kPlainSwitchDests, DestAction::StoreTrue}}) {
      std::istringstream in(list);
      for (std::string d; in >> d;) {
        const char* name = names.emplace_back(d).c_str();
        std::string flag = "--" + d;
        std::replace(flag.begin(), flag.end(), '_', '-');
        m.emplace(d, MegatronDest{name, names.emplace_back(flag).c_str(), action,
                                  action == DestAction::StoreTrue ? "false" : nullptr,
                                  MegatronVersion::Current});
      }
    }
    return m;
  }();
  const auto it = index.find(dest);
  return it == index.end() ? nullptr : &it->second;
}

}  // namespace omni
