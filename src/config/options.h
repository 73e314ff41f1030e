// One table of options (DESIGN.md invariant 5). Each row names a flag in Megatron's
// spelling, its help text, and the field it sets; parsing, --help, printing and the
// "did you mean" hint all come from the table.
#pragma once

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "base/error.h"
#include "data/tokenizers/tokenizer.h"
#include "model/transformer_config.h"
#include "optim/batch_schedule.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer.h"

namespace omni {

struct Options {
  // Megatron's defaults where a config made in code differs: dropout 0.1 on the hidden states
  // and the attention probabilities.
  TransformerConfig model = [] {
    TransformerConfig c;
    c.hidden_dropout = c.attention_dropout = 0.1;
    return c;
  }();
  // The accepted options that have no effect here (Megatron's Python/NVIDIA plumbing), one
  // line per reason naming its flags; the command prints them.
  std::vector<std::string> notes;
  // Batching and length of training. Defaults are Megatron's where it has one.
  int micro_batch_size = 1;
  int global_batch_size = 0;  // 0: micro_batch_size
  int64_t train_iters = 1000;
  bool train_iters_given = false;  // --train-iters was named (it and --train-samples exclude)
  // Sample-based training, as Megatron's: --train-samples sets the length (finalize() turns
  // it into train_iters) and the schedule's --lr-*-samples; 0: iteration-based.
  int64_t train_samples_total = 0;
  int64_t lr_warmup_samples = 0, lr_decay_samples = 0, lr_wsd_decay_samples = 0;
  // --rampup-batch-size START INCR SAMPLES (start 0: none); finalize() fills batch_schedule.
  int rampup_start = 0, rampup_increment = 0;
  int64_t rampup_samples = 0;
  // Learning rate (the schedule's own config is filled in by finalize()).
  double lr = 1e-4, min_lr = 0.0;
  std::string lr_decay_style = "linear";
  int64_t lr_warmup_iters = 0;
  double lr_warmup_fraction = -1;  // < 0: unset; used when lr_warmup_iters is 0
  int64_t lr_decay_iters = 0;      // 0: train_iters
  int64_t lr_wsd_decay_iters = 0;
  std::string lr_wsd_decay_style = "exponential";
  double lr_warmup_init = 0.0;     // the warm-up starts from this learning rate
  std::string optimizer = "adam";  // Megatron's name for AdamW (optim/optimizer.h)
  bool muon_split_qkv = true;      // finalize() turns it into optim.zoo.qkv_split_shapes
  OptimizerConfig optim;
  int64_t seed = 1234;
  // Logging and evaluation.
  int log_interval = 100;
  int eval_interval = 1000;
  int eval_iters = 100;
  int64_t start_eval_at_iter = 0;  // no evaluation before this iteration
  // Megatron's separate evaluation batch sizes; 0: the training ones (the only ones built).
  int eval_global_batch_size = 0, eval_micro_batch_size = 0;
  // Downstream multiple-choice tasks (train/downstream_eval.h): FILE or NAME=FILE, comma
  // separated; every eval_task_interval iterations (0: every eval_interval).
  std::string eval_task, eval_task_samples;
  int eval_task_interval = 0;
  int64_t eval_task_limit = 0;  // the first N examples of each task (0: all)
  std::string metrics_file;
  bool progress = true;
  std::string tensorboard_dir;       // TensorBoard event files (train/tensorboard.h)
  int tensorboard_log_interval = 1;  // Megatron's default
  bool log_memory_to_tensorboard = false, log_throughput = false;
  bool log_loss_scale_to_tensorboard = true;
  // Primus's averaging of the throughput it logs: the first N iterations (start-up) are
  // left out, and the average restarts every M iterations (0: never).
  int log_avg_skip_iterations = 2, log_avg_reset_interval = 10;  // Primus's defaults
  // Megatron's logging extras: the parameters' norm, the gradient's zeros, the step phases'
  // times and validation perplexity in TensorBoard, and Python's logging level (10 debug, 20
  // info, 30 warning, 40 error; 0: unset, MEGATRON_LOGGING_LEVEL or info).
  bool log_params_norm = false, log_num_zeros_in_grad = false;
  bool log_timers_to_tensorboard = false, log_validation_ppl_to_tensorboard = false;
  int logging_level = 0;
  // --profile: a Chrome trace of the step phases of steps start+1 .. end (Megatron's range
  // of iterations) on profile_ranks (empty: every rank), written to profile_dir.
  bool profile = false, use_pytorch_profiler = false;
  int64_t profile_step_start = 10, profile_step_end = 12;
  std::vector<int> profile_ranks;
  std::string profile_dir;  // finalize(): beside --tensorboard-dir, as Megatron's, or here
  // Data.
  bool mock_data = false;
  std::string train_text;      // a plain-text file, tokenised byte-level
  std::string data_path;       // Megatron indexed data: "PREFIX" or "w1 p1 w2 p2 ..."
  std::string data_file_list;  // Megatron-DeepSpeed's "weight prefix corpus" lines
  std::string data_args_path;  // a file holding --data-path's value (finalize() reads it)
  // Megatron's per-split datasets (each "[W] PREFIX ..." like --data-path, each dataset used
  // whole), instead of --data-path and --split.
  std::string train_data_path, valid_data_path, test_data_path;
  std::string data_cache_path;  // where the sample indices are cached (empty: beside the data)
  bool per_split_data() const {
    return !train_data_path.empty() || !valid_data_path.empty() || !test_data_path.empty();
  }
  std::string split = "969,30,1";
  TokenizerOptions tokenizer;  // --tokenizer-type and its files
  bool pad_vocab_size = true;  // false: no padding of the embedding rows (finalize() applies it)
  bool eod_mask_loss = false, reset_position_ids = false, reset_attention_mask = false;
  // `omnitron preprocess` (Megatron's tools/preprocess_data.py flags).
  std::string input, output_prefix, json_keys = "text";
  bool append_eod = false;
  int workers = 0;         // 0: all cores
  int print_samples = 10;  // `omnitron data-samples`
  // Checkpoints (Megatron's flags; src/checkpoint/checkpoint.h has the layout).
  std::string save, load;
  int64_t save_interval = 0;  // 0: only at the end (and on an early exit)
  bool finetune = false;      // --load the model only: iteration 0, fresh optimizer
  bool no_load_optim = false, no_save_optim = false;
  bool async_save = false;  // --async-save: the step after a save does not wait for the disk
  // --load DIR's model options win over the command line's (Megatron's --use-checkpoint-args).
  bool use_checkpoint_args = false;
  bool exit_on_missing_checkpoint = false;
  int64_t exit_interval = 0;         // 0: off
  double exit_duration_in_mins = 0;  // 0: off
  bool exit_signal_handler = false;  // --exit-signal or SIGINT: save, then stop after the step
  int exit_signal = 15;              // SIGTERM, Megatron's default
  bool check_for_nan_in_loss_and_grad = true;  // a non-finite gradient norm stops the run
  // Primus's: no checkpoint at the end of training; resume from --save when it holds one.
  bool disable_last_saving = false, auto_continue_train = false;
  std::string device = "auto";
  // auto|flash|fused|unfused|local: which attention runs (backend/attention_backend.h).
  std::string attention_backend = "auto";
  // Mixed precision: bf16 or fp16 parameters (on the CPU: values rounded to them, fp32
  // arithmetic) with fp32 master weights and optimizer states; fp16 with a loss scaler.
  bool bf16 = false, fp16 = false;
  LossScaleConfig loss_scale;
  // Activation recompute, as Megatron's flags: granularity "" (none), "full" or
  // "selective"; full with method "uniform" (every layer) or "block" (the first
  // recompute_num_layers layers of each stage).
  std::string recompute_granularity, recompute_method;
  int recompute_num_layers = 0;
  bool no_position_embedding = false;  // Megatron's deprecated switch (finalize() checks it)
  // Megatron's --calculate-per-token-loss: the loss is the sum over every token of the
  // global batch divided by their count, not the mean of the micro-batches' means.
  bool calculate_per_token_loss = false;
  // Sampling: `omnitron generate`, and the text sample printed at the end of training.
  std::string prompt = "And it came to pass";
  double temperature = 0.8;
  int top_k = 40;
  int max_new_tokens = 300;

  // Parallel layout (Megatron's flags); data parallel is the world divided by the rest.
  int tensor_model_parallel_size = 1, pipeline_model_parallel_size = 1;
  int context_parallel_size = 1;
  // How context-parallel ranks attend (Megatron's --cp-comm-type): "p2p", the ring, or "a2a",
  // DeepSpeed-Ulysses' all-to-all over heads.
  std::string cp_comm_type = "p2p";
  int expert_model_parallel_size = 1;  // splits each MoE layer's experts (model/moe_layer.h)
  // Splits each expert's width (0: Megatron's default, --tensor-model-parallel-size).
  int expert_tensor_parallel_size = 0;
  int num_layers_per_virtual_pipeline_stage = 0;  // 0: no interleaving
  int num_virtual_stages_per_pipeline_rank = 0;   // the same, as a count (finalize() converts)
  // Uneven pipeline split: the first (last) stage's layers; 0: an even split.
  int decoder_first_pipeline_num_layers = 0, decoder_last_pipeline_num_layers = 0;
  bool sequence_parallel = false, use_distributed_optimizer = false;
  int zero_stage = 0;           // --zero-stage: 1..3 imply use_distributed_optimizer
  std::string fsdp_flag;        // --use-torch-fsdp2 or --use-megatron-fsdp: stage 3 where built
  int fsdp_sharding_stage = 3;  // --data-parallel-sharding-strategy (Megatron-FSDP's)
  bool use_tp_pp_dp_mapping = false;  // rank order tp-cp-ep-pp-dp instead of tp-cp-ep-dp-pp
  double ddp_bucket_size = 0;         // elements per gradient bucket; 0: Megatron's default
  // Megatron's defaults: a rank blocked longer than this in one collective ends the job
  // (comm/watchdog.h; 0: never); gradient buckets reduced after the backward pass unless
  // --overlap-grad-reduce starts each as soon as its gradients are final.
  double distributed_timeout_minutes = 10;
  double hang_report_seconds = 0;  // a first hang report before the timeout (0: none)
  bool overlap_grad_reduce = false, overlap_param_gather = false;
  // This process's data-parallel rank and the number of them (set from the process grid).
  int data_parallel_rank = 0, data_parallel_size = 1;

  // Derived by finalize().
  LRScheduleConfig lr_schedule;
  BatchSchedule batch_schedule;  // the global batch of each step
  int grad_accumulation_steps() const {
    return global_batch_size / (micro_batch_size * data_parallel_size);
  }
  // Megatron's sample counts: what the train and validation datasets must hold.
  int64_t train_samples() const {
    return train_samples_total > 0 ? train_samples_total : train_iters * global_batch_size;
  }
  int64_t valid_samples() const {
    if (!eval_interval) return int64_t(eval_iters) * global_batch_size;
    const int64_t points = train_iters / eval_interval + 1 - start_eval_at_iter / eval_interval;
    return std::max<int64_t>(points, 0) * eval_iters * global_batch_size;
  }
};

// What a Megatron flag does here: what Megatron does (Built), nothing but a one-line note
// because it only tunes Megatron's Python/CUDA machinery (Noted), or a refusal naming the
// feature that is not built yet (NotBuilt; some accept the value that means "off").
enum class Support { Built, Noted, NotBuilt };

struct OptionDef {
  std::string flag;     // "--num-layers"
  std::string metavar;  // "N"; empty for a switch that takes no value
  std::string group;
  std::string help;  // Noted: why it has no effect; NotBuilt: the feature
  std::function<void(Options&, const std::string&)> set;
  // The value as a command-line value; empty for rows that hold no value of their own
  // (aliases, notes, refusals), which options_as_args() leaves out.
  std::function<std::string(const Options&)> get;
  bool many = false;  // takes every following value up to the next --flag (space-joined)
  Support support = Support::Built;
};

// Thrown by a row whose feature is not built yet; parse_options() collects these and throws
// one UsageError that names every refused flag and feature.
class NotBuiltError : public UsageError {
 public:
  NotBuiltError(const std::string& flag_and_value, const std::string& feature)
      : UsageError(flag_and_value + ": not built yet: " + feature),
        flag_and_value(flag_and_value),
        feature(feature) {}
  std::string flag_and_value, feature;
};

const std::vector<OptionDef>& option_table();
// The row for "--flag", or null.
const OptionDef* find_option(const std::string& flag);
// The row whose flag is nearest to `flag` by edit distance (for "did you mean").
const OptionDef& closest_option(const std::string& flag);

// Parses `--flag value`, `--flag=value` and switches onto `opts`. Unknown flags raise
// UsageError naming the closest known flag; flags of features not built yet raise one
// UsageError after the whole line is read, naming each ("--num-experts 8: not built yet:
// mixture of experts"). Does not finalize.
void parse_options(const std::vector<std::string>& args, Options& opts);
// Fills in derived values and validates everything, naming the offending flag.
void finalize(Options& opts);
// The checks of --expert-tensor-parallel-size `etp` (0: `tp`'s) beside
// --tensor-model-parallel-size `tp` for the MoE model `m` (UsageError or NotBuiltError naming
// the flags: ETP must divide TP or be a multiple of it, and divide the experts' width; other
// than TP under TP > 1 it needs --sequence-parallel): finalize() makes them, and `omnitron
// plan` on each layout it plans (options_moe.cpp; the plan then refuses ETP > TP itself).
void check_expert_tensor_parallel(const TransformerConfig& m, int tp, int etp,
                                  bool sequence_parallel);
// --expert-tensor-parallel-size when it is a built size (a divisor or a multiple of
// --tensor-model-parallel-size), else 0: the layout the ranks are counted for before finalize(),
// which refuses another size as not built rather than for the world's size.
int built_expert_tensor_parallel_size(const Options& o);
// `--help` text, grouped, generated from the table.
std::string options_help();
// The options of `group` as a command line ("--num-layers 4 --hidden-size 256 ..."), to
// store a model's architecture with its weights and read it back with parse_options.
std::vector<std::string> options_as_args(const Options& opts, const std::string& group);

}  // namespace omni
