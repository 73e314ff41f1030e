// AMD Primus's own keys (its primus/configs/modules/megatron/*.yaml and
// models/megatron/primus_megatron_model.yaml at 2d42400), and the names of the Megatron that
// Primus pins which current Megatron dropped but Primus's files still set: each is a row,
// spelled as a flag (--disable-last-saving), so a Primus key works in any YAML and on the
// command line. The experiment's run folder (save, tensorboard) is primus_experiment.cpp's.
#include <map>

#include "config/option_rows.h"
#include "config/primus_keys.h"

namespace omni {

namespace {

// Primus's defaults: the values its module and model configs give (a file that repeats one
// asks for nothing).
const std::map<std::string, const char*>& primus_defaults() {
  static const std::map<std::string, const char*> d = {
      {"auto_continue_train", "false"},
      {"disable_last_saving", "false"},
      {"disable_wandb", "true"},
      {"disable_compile_dependencies", "true"},
      {"disable_profiler_activity_cpu", "false"},
      {"use_rocm_mem_info", "false"},
      {"use_rocm_mem_info_iters", "1 2"},
      {"no_fp8_weight_transpose_cache", "false"},
      {"pp_warmup", "false"},
      {"dump_pp_data", "false"},
      {"trainable", "true"},
      {"sink_level", nullptr},
      {"file_sink_level", "DEBUG"},
      {"stderr_sink_level", "INFO"},
      {"parallel_output", "false"},
      {"log_batch_size_to_tensorboard", "true"},
      {"log_learning_rate_to_tensorboard", "true"},
      {"enable_primus_turbo", "false"},
      {"use_turbo_attention", "false"},
      {"use_turbo_row_parallel_linear", "false"},
      {"use_turbo_layer_norm_column_parallel_linear", "false"},
      {"use_turbo_column_parallel_linear", "false"},
      {"use_turbo_column_parallel_linear_torch", "false"},
      {"use_turbo_grouped_mlp", "false"},
      {"moe_use_fused_router_with_aux_score", "false"},
      {"enable_turbo_attention_float8", "false"},
      {"enable_turbo_gemm_float8", "false"},
      {"disable_primus_topk_router", "false"},
      {"use_deprecated_20241209_moe_layer", "false"},
      {"fused_padded_mla_attention", "false"},
      {"standalone_embedding_stage", "false"},
      {"moe_use_legacy_grouped_gemm", "false"},
  };
  return d;
}

}  // namespace

const char* primus_key_default(const std::string& key) {
  const auto it = primus_defaults().find(key);
  return it == primus_defaults().end() ? nullptr : it->second;
}

namespace option_rows {

void add_primus_options(std::vector<OptionDef>& t) {
  const std::string P = "Primus";
  // Keys whose Primus default is true take the value, so that false reaches the row.
  const char* B = "true|false";
  t.push_back(toggle("--disable-last-saving", P,
                     "no checkpoint at the end of training (the --save-interval ones and an early "
                     "exit's still are written)",
                     [](Options& o) -> bool& { return o.disable_last_saving; }));
  t.push_back(toggle("--auto-continue-train", P,
                     "when --save holds a checkpoint, resume from it (--load it, with its "
                     "optimizer and options); else start afresh",
                     [](Options& o) -> bool& { return o.auto_continue_train; }));
  t.push_back(OptionDef{"--disable-tensorboard", "", P,
                        "no TensorBoard event files (clears a --tensorboard-dir given before it)",
                        [](Options& o, const std::string&) { o.tensorboard_dir.clear(); },
                        nullptr});
  const char* levels[] = {"DEBUG", "INFO", "WARNING", "ERROR"};
  OptionDef stderr_level =
      plumbing("--stderr-sink-level", "DEBUG|INFO|WARNING|ERROR",
               "omnitron prints progress, notes and warnings to the console at one level");
  stderr_level.set = [levels, noted = stderr_level.set](Options& o, const std::string& v) {
    bool known = false;
    for (const char* l : levels) known = known || v == l;
    if (!known)
      throw UsageError("--stderr-sink-level: '" + v +
                       "' is not one of DEBUG, INFO, WARNING, ERROR");
    noted(o, v);
  };
  t.push_back(std::move(stderr_level));
  add_noted(t, "Primus's log files; omnitron logs to the console (and --metrics-file, JSONL)",
            {{"--file-sink-level", "LEVEL"}, {"--sink-level", "LEVEL"}});
  add_noted(t, "the learning rate and the batch size are always logged to TensorBoard",
            {{"--log-batch-size-to-tensorboard", B}, {"--log-learning-rate-to-tensorboard", B}});
  add_noted(t, "Weights & Biases logging is not built in; use --tensorboard-dir or --metrics-file",
            {{"--disable-wandb", B}});
  add_noted(t, "omnitron has no Python extensions to compile at start-up",
            {{"--disable-compile-dependencies", B}});
  add_noted(t, "it tunes PyTorch's profiler; --profile writes omnitron's own trace",
            {{"--disable-profiler-activity-cpu", ""}});
  add_noted(t, "ROCm memory is not sampled with rocm-smi; --log-memory-to-tensorboard logs memory",
            {{"--use-rocm-mem-info", ""}, {"--use-rocm-mem-info-iters", "N..."}});
  add_noted(t, "Primus's pipeline warm-up and dump tools patch Megatron's Python schedule",
            {{"--pp-warmup", ""}, {"--dump-pp-data", ""}});
  add_noted(t, "a Primus module flag: the pre_trainer module always trains", {{"--trainable", B}});
  add_noted(t, "logits are gathered across tensor-parallel ranks by the loss itself",
            {{"--parallel-output", ""}});
  add_noted(t,
            "Primus Turbo is AMD's kernel library for PyTorch; omnitron runs its own kernels "
            "(one source for CUDA and HIP)",
            {{"--enable-primus-turbo", ""},
             {"--use-turbo-attention", ""},
             {"--use-turbo-row-parallel-linear", ""},
             {"--use-turbo-layer-norm-column-parallel-linear", ""},
             {"--use-turbo-column-parallel-linear", ""},
             {"--use-turbo-column-parallel-linear-torch", ""}});
  add_tuning(t, "mixture of experts", "--num-experts",
             {{"--use-turbo-grouped-mlp", ""},
              {"--moe-use-fused-router-with-aux-score", ""},
              {"--disable-primus-topk-router", ""},
              {"--use-deprecated-20241209-moe-layer", ""},
              {"--moe-use-legacy-grouped-gemm", ""}});
  add_noted(t, "a fused kernel choice for MLA's attention; the attention computed is the same",
            {{"--fused-padded-mla-attention", ""}});
  add_tuning(t, "fp8 training", "--fp8-format", {{"--no-fp8-weight-transpose-cache", ""}});
  add_refused(t, "fp8 training",
              {{"--enable-turbo-attention-float8", ""}, {"--enable-turbo-gemm-float8", ""}});
  add_refused(t, "a pipeline stage holding only the embedding",
              {{"--standalone-embedding-stage", ""}});
  add_refused(t,
              "a manual layer split of every pipeline stage (--decoder-first-pipeline-num-layers "
              "and --decoder-last-pipeline-num-layers are built)",
              {{"--decoder-pipeline-manual-split-list", "N..."}});
}

}  // namespace option_rows
}  // namespace omni
