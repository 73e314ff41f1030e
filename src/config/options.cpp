#include "config/options.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <sstream>
#include <tuple>

#include "base/error.h"

namespace omni {

namespace {

template <typename T>
T parse_number(const std::string& flag, const std::string& text) {
  T value{};
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end) {
    throw UsageError(flag + " expects " + (std::is_integral_v<T> ? "an integer" : "a number") +
                     ", got '" + text + "'");
  }
  return value;
}

// Shortest text that parses back to the same value.
template <typename T>
std::string format_number(T v) {
  char buf[64];
  auto [ptr, ec] = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, ptr);
}

template <typename T, typename Access>
OptionDef number(std::string flag, std::string metavar, std::string group, std::string help,
                 Access access) {
  return OptionDef{
      flag,
      std::move(metavar),
      std::move(group),
      std::move(help),
      [flag, access](Options& o, const std::string& v) { access(o) = parse_number<T>(flag, v); },
      [access](const Options& o) { return format_number(access(const_cast<Options&>(o))); }};
}

template <typename Access>
OptionDef text(std::string flag, std::string metavar, std::string group, std::string help,
               Access access) {
  return OptionDef{flag,
                   std::move(metavar),
                   std::move(group),
                   std::move(help),
                   [access](Options& o, const std::string& v) { access(o) = v; },
                   [access](const Options& o) { return access(const_cast<Options&>(o)); }};
}

// A switch: present means `value`.
template <typename Access>
OptionDef toggle(std::string flag, std::string group, std::string help, Access access,
                 bool value = true) {
  return OptionDef{flag,
                   "",
                   std::move(group),
                   std::move(help),
                   [access, value](Options& o, const std::string&) { access(o) = value; },
                   [access, value](const Options& o) {
                     return access(const_cast<Options&>(o)) == value ? "true" : "";
                   }};
}

// Accepted because Megatron launch scripts pass it, but meaningful only where it equals
// `supported`; anything else is refused with a message saying it is not built yet.
OptionDef not_built(std::string flag, std::string metavar, std::string supported,
                    std::string what) {
  std::string help = what + (metavar.empty() ? "" : " (" + supported + " works)");
  return OptionDef{flag,
                   metavar,
                   "not built yet",
                   std::move(help),
                   [flag, supported, what, metavar](Options&, const std::string& v) {
                     if (metavar.empty() || v != supported)
                       throw UsageError(flag + ": " + what + " is not built yet in omnitron");
                   },
                   [](const Options&) { return std::string(); }};
}

// Accepted because Megatron launch scripts pass it, with no effect here: `why` becomes a
// one-line note.
OptionDef plumbing(std::string flag, std::string metavar, std::string why) {
  return OptionDef{flag, metavar, "accepted, no effect", why,
                   [flag, why](Options& o, const std::string&) {
                     // Commands parse some arguments twice (a preset, then a checkpoint's
                     // options under the command line): note each flag once.
                     std::string note = "note: " + flag + " has no effect here: " + why;
                     if (std::find(o.notes.begin(), o.notes.end(), note) == o.notes.end())
                       o.notes.push_back(std::move(note));
                   },
                   [](const Options&) { return std::string(); }};
}

std::vector<OptionDef> build_table() {
  const std::string M = "model", T = "training", L = "learning rate", O = "optimizer";
  const std::string D = "data", G = "logging", W = "weights and device";
  std::vector<OptionDef> t;
  t.push_back(number<int>("--num-layers", "N", M, "transformer layers",
                          [](Options& o) -> int& { return o.model.num_layers; }));
  t.push_back(number<int>("--hidden-size", "N", M, "model width",
                          [](Options& o) -> int& { return o.model.hidden_size; }));
  t.push_back(number<int>("--ffn-hidden-size", "N", M, "MLP width (0: 4 x hidden size)",
                          [](Options& o) -> int& { return o.model.ffn_hidden_size; }));
  t.push_back(number<int>("--num-attention-heads", "N", M, "query heads",
                          [](Options& o) -> int& { return o.model.num_attention_heads; }));
  t.push_back(toggle("--group-query-attention", M,
                     "grouped-query attention (with --num-query-groups)",
                     [](Options& o) -> bool& { return o.model.group_query_attention; }));
  t.push_back(number<int>("--num-query-groups", "N", M,
                          "key/value heads under grouped-query attention",
                          [](Options& o) -> int& { return o.model.num_query_groups; }));
  t.push_back(number<int>("--kv-channels", "N", M, "head dimension (0: hidden size / heads)",
                          [](Options& o) -> int& { return o.model.kv_channels; }));
  t.push_back(number<int>("--seq-length", "N", M, "tokens per sample",
                          [](Options& o) -> int& { return o.model.seq_length; }));
  t.push_back(number<int>("--max-position-embeddings", "N", M,
                          "rows of the learned position table (0: --seq-length)",
                          [](Options& o) -> int& { return o.model.max_position_embeddings; }));
  t.push_back(number<int>("--vocab-size", "N", M,
                          "vocabulary size (mock data; byte-level text is 256)",
                          [](Options& o) -> int& { return o.model.vocab_size; }));
  t.push_back(number<int>(
      "--make-vocab-size-divisible-by", "N", M,
      "pad the embedding rows to a multiple of N; padded logits are excluded from the loss",
      [](Options& o) -> int& { return o.model.make_vocab_size_divisible_by; }));
  t.push_back(OptionDef{
      "--normalization", "LayerNorm|RMSNorm", M, "normalisation layers",
      [](Options& o, const std::string& v) {
        if (v == "LayerNorm")
          o.model.normalization = Normalization::LayerNorm;
        else if (v == "RMSNorm")
          o.model.normalization = Normalization::RMSNorm;
        else
          throw UsageError("--normalization: '" + v + "' is not one of LayerNorm, RMSNorm");
      },
      [](const Options& o) { return std::string(to_string(o.model.normalization)); }});
  t.push_back(number<double>("--norm-epsilon", "X", M, "epsilon of the norms",
                             [](Options& o) -> double& { return o.model.norm_epsilon; }));
  t.push_back(toggle("--swiglu", M, "SwiGLU MLP (gate and up projections)",
                     [](Options& o) -> bool& { return o.model.swiglu; }));
  t.push_back(OptionDef{
      "--position-embedding-type", "learned_absolute|rope", M, "position encoding",
      [](Options& o, const std::string& v) {
        if (v == "learned_absolute")
          o.model.position_embedding_type = PositionEmbedding::LearnedAbsolute;
        else if (v == "rope")
          o.model.position_embedding_type = PositionEmbedding::Rope;
        else
          throw UsageError("--position-embedding-type: '" + v +
                           "' is not one of learned_absolute, rope");
      },
      [](const Options& o) { return std::string(to_string(o.model.position_embedding_type)); }});
  t.push_back(number<double>("--rotary-base", "X", M, "RoPE base (Llama 2: 10000, Llama 3: 500000)",
                             [](Options& o) -> double& { return o.model.rotary_base; }));
  t.push_back(toggle(
      "--disable-bias-linear", M, "no biases on the linear layers",
      [](Options& o) -> bool& { return o.model.add_bias_linear; }, false));
  t.push_back(toggle("--add-qkv-bias", M,
                     "bias on the QKV projection even without linear biases (Qwen2.5)",
                     [](Options& o) -> bool& { return o.model.add_qkv_bias; }));
  t.push_back(toggle("--qk-layernorm", M, "normalise queries and keys per head",
                     [](Options& o) -> bool& { return o.model.qk_layernorm; }));
  t.push_back(
      toggle("--untie-embeddings-and-output-weights", M, "separate output layer",
             [](Options& o) -> bool& { return o.model.untie_embeddings_and_output_weights; }));
  t.push_back(number<double>("--init-method-std", "X", M, "std of the normal initialisation",
                             [](Options& o) -> double& { return o.model.init_method_std; }));
  t.push_back(number<double>("--hidden-dropout", "P", M,
                             "dropout after attention and MLP (0 only for now)",
                             [](Options& o) -> double& { return o.hidden_dropout; }));
  t.push_back(number<double>("--attention-dropout", "P", M,
                             "dropout on attention probabilities (0 only for now)",
                             [](Options& o) -> double& { return o.attention_dropout; }));

  t.push_back(number<int>("--micro-batch-size", "N", T, "samples per forward/backward",
                          [](Options& o) -> int& { return o.micro_batch_size; }));
  t.push_back(number<int>(
      "--global-batch-size", "N", T,
      "samples per optimizer step (a multiple of the micro batch: gradient accumulation)",
      [](Options& o) -> int& { return o.global_batch_size; }));
  t.push_back(number<int64_t>("--train-iters", "N", T, "optimizer steps",
                              [](Options& o) -> int64_t& { return o.train_iters; }));
  t.push_back(number<int64_t>("--seed", "N", T, "seed of initialisation and data order",
                              [](Options& o) -> int64_t& { return o.seed; }));

  t.push_back(number<double>("--lr", "X", L, "peak learning rate",
                             [](Options& o) -> double& { return o.lr; }));
  t.push_back(number<double>("--min-lr", "X", L, "learning rate at the end of the decay",
                             [](Options& o) -> double& { return o.min_lr; }));
  t.push_back(text("--lr-decay-style", "STYLE", L,
                   "constant, linear, cosine, inverse-square-root or WSD",
                   [](Options& o) -> std::string& { return o.lr_decay_style; }));
  t.push_back(number<int64_t>("--lr-warmup-iters", "N", L, "linear warm-up steps",
                              [](Options& o) -> int64_t& { return o.lr_warmup_iters; }));
  t.push_back(number<double>("--lr-warmup-fraction", "X", L,
                             "warm-up as a fraction of --lr-decay-iters",
                             [](Options& o) -> double& { return o.lr_warmup_fraction; }));
  t.push_back(number<int64_t>("--lr-decay-iters", "N", L,
                              "iteration where the decay ends (0: --train-iters)",
                              [](Options& o) -> int64_t& { return o.lr_decay_iters; }));
  t.push_back(number<int64_t>("--lr-wsd-decay-iters", "N", L, "WSD: length of the final decay",
                              [](Options& o) -> int64_t& { return o.lr_wsd_decay_iters; }));
  t.push_back(text("--lr-wsd-decay-style", "STYLE", L,
                   "WSD decay: linear, cosine, exponential, minus_sqrt",
                   [](Options& o) -> std::string& { return o.lr_wsd_decay_style; }));

  t.push_back(text("--optimizer", "NAME", O, "adamw, adam or sgd",
                   [](Options& o) -> std::string& { return o.optimizer; }));
  t.push_back(number<double>("--weight-decay", "X", O,
                             "decoupled weight decay (not on biases and norms)",
                             [](Options& o) -> double& { return o.optim.weight_decay; }));
  t.push_back(number<double>("--adam-beta1", "X", O, "Adam beta1",
                             [](Options& o) -> double& { return o.optim.adam_beta1; }));
  t.push_back(number<double>("--adam-beta2", "X", O, "Adam beta2",
                             [](Options& o) -> double& { return o.optim.adam_beta2; }));
  t.push_back(number<double>("--adam-eps", "X", O, "Adam epsilon",
                             [](Options& o) -> double& { return o.optim.adam_eps; }));
  t.push_back(number<double>("--sgd-momentum", "X", O, "SGD momentum",
                             [](Options& o) -> double& { return o.optim.sgd_momentum; }));
  t.push_back(number<double>("--clip-grad", "X", O, "clip the global gradient norm to X (0: off)",
                             [](Options& o) -> double& { return o.optim.clip_grad; }));

  t.push_back(toggle("--mock-data", D, "random tokens (with --vocab-size) instead of a corpus",
                     [](Options& o) -> bool& { return o.mock_data; }));
  t.push_back(
      text("--train-text", "FILE", D,
           "plain-text corpus, tokenised byte-level (default: the King James Bible demo corpus)",
           [](Options& o) -> std::string& { return o.train_text; }));
  OptionDef data_path = text("--data-path", "[W] PREFIX ...", D,
                             "Megatron indexed data: PREFIX, or weights and prefixes to blend",
                             [](Options& o) -> std::string& { return o.data_path; });
  data_path.many = true;
  t.push_back(std::move(data_path));
  t.push_back(text("--data-file-list", "FILE", D,
                   "Megatron-DeepSpeed data list: one 'weight prefix corpus' line per dataset",
                   [](Options& o) -> std::string& { return o.data_file_list; }));
  t.push_back(text("--tokenizer-type", "NAME", D,
                   "GPT2BPETokenizer, TikTokenizer, HuggingFaceTokenizer, SentencePieceTokenizer, "
                   "Llama2Tokenizer, NullTokenizer or ByteLevelTokenizer",
                   [](Options& o) -> std::string& { return o.tokenizer.type; }));
  t.push_back(text("--vocab-file", "FILE", D, "GPT-2 vocab.json",
                   [](Options& o) -> std::string& { return o.tokenizer.vocab_file; }));
  t.push_back(text("--merge-file", "FILE", D, "GPT-2 merges.txt",
                   [](Options& o) -> std::string& { return o.tokenizer.merge_file; }));
  t.push_back(text("--tokenizer-model", "FILE", D,
                   "*.tiktoken ranks, Hugging Face tokenizer.json or SentencePiece .model",
                   [](Options& o) -> std::string& { return o.tokenizer.tokenizer_model; }));
  t.push_back(text("--tiktoken-pattern", "v1|v2", D, "TikTokenizer pre-tokenisation pattern",
                   [](Options& o) -> std::string& { return o.tokenizer.tiktoken_pattern; }));
  t.push_back(toggle("--eod-mask-loss", D, "no loss on end-of-document tokens",
                     [](Options& o) -> bool& { return o.eod_mask_loss; }));
  t.push_back(toggle("--reset-position-ids", D, "positions restart after each end-of-document token",
                     [](Options& o) -> bool& { return o.reset_position_ids; }));
  t.push_back(toggle("--reset-attention-mask", D,
                     "tokens attend only within their document (packed samples)",
                     [](Options& o) -> bool& { return o.reset_attention_mask; }));
  t.push_back(text("--split", "A,B,C", D, "train, validation, test weights of the corpus",
                   [](Options& o) -> std::string& { return o.split; }));

  t.push_back(number<int>("--log-interval", "N", G, "console and metrics line every N steps",
                          [](Options& o) -> int& { return o.log_interval; }));
  t.push_back(number<int>("--eval-interval", "N", G,
                          "validation every N steps (0: only at the end)",
                          [](Options& o) -> int& { return o.eval_interval; }));
  t.push_back(number<int>("--eval-iters", "N", G, "validation micro-batches per evaluation",
                          [](Options& o) -> int& { return o.eval_iters; }));
  t.push_back(text("--tensorboard-dir", "DIR", G, "write TensorBoard event files here",
                   [](Options& o) -> std::string& { return o.tensorboard_dir; }));
  t.push_back(number<int>("--tensorboard-log-interval", "N", G,
                          "TensorBoard scalars every N steps",
                          [](Options& o) -> int& { return o.tensorboard_log_interval; }));
  t.push_back(toggle("--log-memory-to-tensorboard", G, "memory use in TensorBoard",
                     [](Options& o) -> bool& { return o.log_memory_to_tensorboard; }));
  t.push_back(toggle("--log-throughput", G, "TFLOP/s per GPU in TensorBoard",
                     [](Options& o) -> bool& { return o.log_throughput; }));
  t.push_back(number<int>("--log-avg-skip-iterations", "N", G,
                          "leave the first N iterations out of averaged throughput (Primus)",
                          [](Options& o) -> int& { return o.log_avg_skip_iterations; }));
  t.push_back(number<int>("--log-avg-reset-interval", "N", G,
                          "restart the throughput average every N iterations (Primus; 0: never)",
                          [](Options& o) -> int& { return o.log_avg_reset_interval; }));
  t.push_back(text("--metrics-file", "PATH", G, "write one JSON object per logged step",
                   [](Options& o) -> std::string& { return o.metrics_file; }));
  t.push_back(toggle(
      "--no-progress", G, "no live progress line on a terminal",
      [](Options& o) -> bool& { return o.progress; }, false));
  const std::string P = "preprocess (omnitron preprocess, as Megatron's preprocess_data.py)";
  t.push_back(text("--input", "FILE", P, "jsonl, .jsonl.zst or plain text (one document per line)",
                   [](Options& o) -> std::string& { return o.input; }));
  t.push_back(text("--json-keys", "K[,K]", P, "jsonl fields to tokenise, one output each",
                   [](Options& o) -> std::string& { return o.json_keys; }));
  t.push_back(text("--output-prefix", "PREFIX", P, "writes PREFIX_{key}_document.bin/.idx",
                   [](Options& o) -> std::string& { return o.output_prefix; }));
  t.push_back(toggle("--append-eod", P, "end every document with the tokenizer's eod",
                     [](Options& o) -> bool& { return o.append_eod; }));
  t.push_back(number<int>("--workers", "N", P, "tokenising threads (0: all cores)",
                          [](Options& o) -> int& { return o.workers; }));
  t.push_back(number<int>("--print-samples", "N", D,
                          "omnitron data-samples: how many training samples to print",
                          [](Options& o) -> int& { return o.print_samples; }));
  const std::string Y = "configuration files (train, data-samples)";
  for (auto [flag, metavar, help] :
       {std::tuple{"--config", "FILE", "Primus-style YAML (bases:/extends:, model: + overrides:, "
                                       "${VAR:default}); command-line flags win"},
        std::tuple{"--print-config", "", "print the resolved YAML options with their files, stop"}}) {
    const std::string f = flag;
    t.push_back(OptionDef{f, metavar, Y, help,
                          [f](Options&, const std::string&) {
                            throw UsageError(f + " is read by train and data-samples only");
                          },
                          [](const Options&) { return std::string(); }});
  }
  const std::string S = "sampling (generate, and the sample after training)";
  t.push_back(text("--prompt", "TEXT", S, "text to continue",
                   [](Options& o) -> std::string& { return o.prompt; }));
  t.push_back(number<double>("--temperature", "X", S, "softmax temperature (0: greedy)",
                             [](Options& o) -> double& { return o.temperature; }));
  t.push_back(number<int>("--top-k", "N", S, "sample among the N likeliest tokens (0: all)",
                          [](Options& o) -> int& { return o.top_k; }));
  t.push_back(number<int>("--max-new-tokens", "N", S,
                          "tokens to generate (0: no sample after training)",
                          [](Options& o) -> int& { return o.max_new_tokens; }));

  const std::string C = "checkpoints";
  t.push_back(text("--save", "DIR", C,
                   "write checkpoints to DIR/iter_NNNNNNN (every --save-interval, and at the end)",
                   [](Options& o) -> std::string& { return o.save; }));
  t.push_back(number<int64_t>("--save-interval", "N", C, "checkpoint every N steps (0: at the end)",
                              [](Options& o) -> int64_t& { return o.save_interval; }));
  t.push_back(text("--load", "DIR", C,
                   "resume from DIR's latest checkpoint (latest_checkpointed_iteration.txt)",
                   [](Options& o) -> std::string& { return o.load; }));
  t.push_back(toggle("--finetune", C,
                     "--load the model only: start at iteration 0 with a fresh optimizer",
                     [](Options& o) -> bool& { return o.finetune; }));
  t.push_back(toggle("--no-load-optim", C, "--load without the optimizer state",
                     [](Options& o) -> bool& { return o.no_load_optim; }));
  t.push_back(toggle("--no-load-rng", C,
                     "accepted: there is no RNG state to skip (initialisation and data order "
                     "are functions of --seed and the consumed samples)",
                     [](Options& o) -> bool& { return o.no_load_rng; }));
  t.push_back(number<int64_t>("--exit-interval", "N", C,
                              "save and stop when the iteration is a multiple of N",
                              [](Options& o) -> int64_t& { return o.exit_interval; }));
  t.push_back(number<double>("--exit-duration-in-mins", "X", C,
                             "save and stop after the step that passes X minutes of training",
                             [](Options& o) -> double& { return o.exit_duration_in_mins; }));
  t.push_back(toggle("--exit-signal-handler", C,
                     "on SIGTERM or SIGINT, finish the step, save and stop",
                     [](Options& o) -> bool& { return o.exit_signal_handler; }));
  t.push_back(text("--device", "auto|cpu|cuda|hip", W, "where to train (auto: a GPU when present)",
                   [](Options& o) -> std::string& { return o.device; }));

  const std::string MP = "mixed precision";
  t.push_back(toggle("--bf16", MP, "bf16 parameters, fp32 master weights and optimizer states",
                     [](Options& o) -> bool& { return o.bf16; }));
  t.push_back(toggle("--fp16", MP, "fp16 parameters and gradients with a loss scaler",
                     [](Options& o) -> bool& { return o.fp16; }));
  t.push_back(number<double>("--loss-scale", "X", MP, "a constant loss scale (0: dynamic with --fp16)",
                             [](Options& o) -> double& { return o.loss_scale.loss_scale; }));
  t.push_back(number<double>("--initial-loss-scale", "X", MP, "the dynamic scale's start (2^32)",
                             [](Options& o) -> double& { return o.loss_scale.initial_loss_scale; }));
  t.push_back(number<double>("--min-loss-scale", "X", MP, "the dynamic scale's floor",
                             [](Options& o) -> double& { return o.loss_scale.min_loss_scale; }));
  t.push_back(number<int64_t>("--loss-scale-window", "N", MP,
                              "clean steps before the dynamic scale doubles",
                              [](Options& o) -> int64_t& { return o.loss_scale.loss_scale_window; }));
  t.push_back(number<int64_t>("--hysteresis", "N", MP,
                              "overflows before the dynamic scale halves",
                              [](Options& o) -> int64_t& { return o.loss_scale.hysteresis; }));
  const std::string RC = "activation recompute";
  t.push_back(OptionDef{"--checkpoint-activations", "", RC,
                        "old name of --recompute-granularity full --recompute-method uniform",
                        [](Options& o, const std::string&) {
                          o.recompute_granularity = "full", o.recompute_method = "uniform";
                          o.recompute_num_layers = 1;
                        },
                        [](const Options&) { return std::string(); }});
  t.push_back(OptionDef{"--recompute-activations", "", RC,
                        "recompute the attention probabilities (--recompute-granularity selective)",
                        [](Options& o, const std::string&) { o.recompute_granularity = "selective"; },
                        [](const Options&) { return std::string(); }});
  t.push_back(text("--recompute-granularity", "full|selective", RC,
                   "full: keep only layer inputs; selective: no attention probabilities",
                   [](Options& o) -> std::string& { return o.recompute_granularity; }));
  t.push_back(text("--recompute-method", "uniform|block", RC,
                   "with full: every layer (uniform 1), or the first N of each stage (block N)",
                   [](Options& o) -> std::string& { return o.recompute_method; }));
  t.push_back(number<int>("--recompute-num-layers", "N", RC, "N for --recompute-method",
                          [](Options& o) -> int& { return o.recompute_num_layers; }));
  const std::string PAR = "parallelism";
  t.push_back(number<int>("--tensor-model-parallel-size", "N", PAR,
                          "ranks that split each layer's matmuls (Megatron's TP)",
                          [](Options& o) -> int& { return o.tensor_model_parallel_size; }));
  t.push_back(number<int>("--pipeline-model-parallel-size", "N", PAR,
                          "pipeline stages, each holding a slice of the layers",
                          [](Options& o) -> int& { return o.pipeline_model_parallel_size; }));
  t.push_back(number<int>("--num-layers-per-virtual-pipeline-stage", "N", PAR,
                          "interleaved schedule: each stage holds chunks of N layers",
                          [](Options& o) -> int& {
                            return o.num_layers_per_virtual_pipeline_stage;
                          }));
  t.push_back(number<int>("--decoder-first-pipeline-num-layers", "N", PAR,
                          "layers of the first pipeline stage (uneven split)",
                          [](Options& o) -> int& { return o.decoder_first_pipeline_num_layers; }));
  t.push_back(number<int>("--decoder-last-pipeline-num-layers", "N", PAR,
                          "layers of the last pipeline stage (uneven split)",
                          [](Options& o) -> int& { return o.decoder_last_pipeline_num_layers; }));
  t.push_back(number<int>("--context-parallel-size", "N", PAR,
                          "ranks that split each sequence (causal, load-balanced chunks)",
                          [](Options& o) -> int& { return o.context_parallel_size; }));
  t.push_back(toggle("--sequence-parallel", PAR,
                     "shard norm regions along the sequence across tensor-parallel ranks",
                     [](Options& o) -> bool& { return o.sequence_parallel; }));
  t.push_back(toggle("--use-distributed-optimizer", PAR,
                     "shard optimizer states and master weights across data-parallel ranks",
                     [](Options& o) -> bool& { return o.use_distributed_optimizer; }));
  t.push_back(toggle("--use-tp-pp-dp-mapping", PAR, "rank order tp-cp-ep-pp-dp (default tp-cp-ep-dp-pp)",
                     [](Options& o) -> bool& { return o.use_tp_pp_dp_mapping; }));
  t.push_back(number<double>("--ddp-bucket-size", "N", PAR,
                             "gradient elements per data-parallel all-reduce bucket (0: default)",
                             [](Options& o) -> double& { return o.ddp_bucket_size; }));

  t.push_back(not_built("--expert-model-parallel-size", "N", "1", "expert parallelism"));
  t.push_back(not_built("--num-experts", "N", "", "mixture of experts"));
  for (const char* flag : {"--no-masked-softmax-fusion", "--no-gradient-accumulation-fusion",
                           "--no-bias-gelu-fusion", "--no-bias-swiglu-fusion",
                           "--no-bias-dropout-fusion", "--no-rope-fusion",
                           "--no-async-tensor-model-parallel-allreduce",
                           "--use-mcore-models", "--attention-softmax-in-fp32",
                           "--accumulate-allreduce-grads-in-fp32"})
    t.push_back(plumbing(flag, "", "omnitron has no Python fusion or kernel switch to turn"));
  t.push_back(plumbing("--use-flash-attn", "", "attention already never stores more than it needs on "
                       "this backend; flash attention comes with the GPU backend"));
  t.push_back(plumbing("--transformer-impl", "NAME", "there is one transformer implementation"));
  t.push_back(plumbing("--distributed-backend", "nccl|gloo", "the communicator follows --device"));
  t.push_back(plumbing("--dataloader-type", "single|cyclic", "samples are read in Megatron's single order"));
  t.push_back(plumbing("--num-workers", "N", "data is read by one background thread"));
  return t;
}

}  // namespace

const std::vector<OptionDef>& option_table() {
  static const std::vector<OptionDef> table = build_table();
  return table;
}

namespace {
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1])});
      diag = up;
    }
  }
  return row[b.size()];
}

}  // namespace

const OptionDef* find_option(const std::string& flag) {
  for (const OptionDef& d : option_table())
    if (d.flag == flag) return &d;
  return nullptr;
}

const OptionDef& closest_option(const std::string& flag) {
  const OptionDef* best = &option_table().front();
  size_t best_d = SIZE_MAX;
  for (const OptionDef& d : option_table()) {
    const size_t dist = edit_distance(flag, d.flag);
    if (dist < best_d) best_d = dist, best = &d;
  }
  return *best;
}

void parse_options(const std::vector<std::string>& args, Options& opts) {
  for (size_t i = 0; i < args.size(); ++i) {
    std::string flag = args[i], value;
    const bool has_inline = flag.rfind("--", 0) == 0 && flag.find('=') != std::string::npos;
    if (has_inline) {
      value = flag.substr(flag.find('=') + 1);
      flag = flag.substr(0, flag.find('='));
    }
    if (flag.rfind("--", 0) != 0)
      throw UsageError("unexpected argument '" + flag + "' (options start with --)");
    const OptionDef* def = find_option(flag);
    if (!def)
      throw UsageError("unknown option " + flag + "; did you mean " + closest_option(flag).flag +
                       "?");
    if (def->metavar.empty()) {
      if (has_inline) throw UsageError(flag + " takes no value (got '" + value + "')");
    } else if (!has_inline) {
      if (i + 1 >= args.size()) throw UsageError(flag + " needs a value (" + def->metavar + ")");
      value = args[++i];
      while (def->many && i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0)
        value += " " + args[++i];
    }
    def->set(opts, value);
  }
}

void finalize(Options& o) {
  const bool indexed = !o.data_path.empty() || !o.data_file_list.empty();
  OMNI_REQUIRE(int(o.mock_data) + int(!o.data_path.empty()) + int(!o.data_file_list.empty()) +
                       int(!o.train_text.empty()) <= 1,
               "choose one data source: --mock-data, --data-path, --data-file-list or --train-text");
  if (o.mock_data || indexed) {
    OMNI_REQUIRE(o.model.vocab_size > 0, o.mock_data ? "--mock-data" : "--data-path",
                 " needs --vocab-size or --tokenizer-type");
  } else {
    OMNI_REQUIRE(o.model.vocab_size == 0 || o.model.vocab_size == 256,
                 "--vocab-size applies to --mock-data and --data-path; byte-level text has 256 "
                 "tokens");
    o.model.vocab_size = 256;
  }
  o.model.validate();
  OMNI_REQUIRE(!(o.bf16 && o.fp16), "choose one of --bf16 and --fp16");
  const std::string& rg = o.recompute_granularity;
  OMNI_REQUIRE(rg.empty() || rg == "full" || rg == "selective",
               "--recompute-granularity: expected full or selective, got '", rg, "'");
  if (rg == "full") {
    if (o.recompute_method.empty()) o.recompute_method = "uniform";
    if (o.recompute_num_layers == 0) o.recompute_num_layers = 1;
    OMNI_REQUIRE(o.recompute_method == "uniform" || o.recompute_method == "block",
                 "--recompute-method: expected uniform or block, got '", o.recompute_method, "'");
    OMNI_REQUIRE(o.recompute_num_layers > 0, "--recompute-num-layers must be positive");
    OMNI_REQUIRE(o.recompute_method == "block" || o.recompute_num_layers == 1,
                 "--recompute-method uniform with --recompute-num-layers ",
                 o.recompute_num_layers,
                 " (groups of layers recomputed together) is not built yet; uniform 1 and "
                 "block N are");
  }
  OMNI_REQUIRE(o.tensor_model_parallel_size >= 1, "--tensor-model-parallel-size must be at least 1");
  OMNI_REQUIRE(o.pipeline_model_parallel_size >= 1,
               "--pipeline-model-parallel-size must be at least 1");
  OMNI_REQUIRE(o.context_parallel_size >= 1, "--context-parallel-size must be at least 1");
  OMNI_REQUIRE(o.num_layers_per_virtual_pipeline_stage >= 0,
               "--num-layers-per-virtual-pipeline-stage must be 0 (off) or positive");
  OMNI_REQUIRE(o.ddp_bucket_size >= 0, "--ddp-bucket-size must be 0 (default) or positive");
  OMNI_REQUIRE(o.tensorboard_log_interval > 0, "--tensorboard-log-interval must be positive");
  OMNI_REQUIRE(o.log_avg_skip_iterations >= 0 && o.log_avg_reset_interval >= 0,
               "--log-avg-skip-iterations and --log-avg-reset-interval must be 0 or positive");
  // Megatron turns sequence parallelism off without tensor parallelism.
  if (o.tensor_model_parallel_size == 1) o.sequence_parallel = false;
  OMNI_REQUIRE(o.micro_batch_size > 0, "--micro-batch-size must be positive (got ",
               o.micro_batch_size, ")");
  const int per_step = o.micro_batch_size * o.data_parallel_size;
  if (o.global_batch_size == 0) o.global_batch_size = per_step;
  OMNI_REQUIRE(o.global_batch_size > 0 && o.global_batch_size % per_step == 0,
               "--global-batch-size (", o.global_batch_size,
               ") must be a positive multiple of --micro-batch-size (", o.micro_batch_size,
               ") x data-parallel size (", o.data_parallel_size, ")");
  OMNI_REQUIRE(o.train_iters > 0, "--train-iters must be positive (got ", o.train_iters, ")");
  OMNI_REQUIRE(o.lr >= 0 && o.min_lr >= 0 && o.min_lr <= o.lr, "--min-lr (", o.min_lr,
               ") must be between 0 and --lr (", o.lr, ")");
  OMNI_REQUIRE(o.log_interval > 0, "--log-interval must be positive (got ", o.log_interval, ")");
  OMNI_REQUIRE(o.eval_interval >= 0, "--eval-interval must be 0 or positive");
  OMNI_REQUIRE(o.eval_iters >= 0, "--eval-iters must be 0 or positive");
  OMNI_REQUIRE(o.hidden_dropout == 0 && o.attention_dropout == 0,
               "--hidden-dropout/--attention-dropout: dropout is not built yet (use 0)");
  OMNI_REQUIRE(o.optim.clip_grad >= 0, "--clip-grad must be 0 or positive");
  OMNI_REQUIRE(o.optim.adam_beta1 >= 0 && o.optim.adam_beta1 < 1, "--adam-beta1 must be in [0, 1)");
  OMNI_REQUIRE(o.optim.adam_beta2 >= 0 && o.optim.adam_beta2 < 1, "--adam-beta2 must be in [0, 1)");
  OMNI_REQUIRE(o.optim.adam_eps > 0, "--adam-eps must be positive");
  o.optim.kind = parse_optimizer(o.optimizer);

  LRScheduleConfig& s = o.lr_schedule;
  s.lr = o.lr;
  s.min_lr = o.min_lr;
  s.style = parse_lr_decay_style(o.lr_decay_style);
  s.wsd_style = parse_wsd_decay_style(o.lr_wsd_decay_style);
  s.decay_iters = o.lr_decay_iters ? o.lr_decay_iters : o.train_iters;
  OMNI_REQUIRE(o.lr_warmup_fraction <= 1.0, "--lr-warmup-fraction must be at most 1");
  s.warmup_iters =
      o.lr_warmup_iters
          ? o.lr_warmup_iters
          : (o.lr_warmup_fraction > 0 ? static_cast<int64_t>(o.lr_warmup_fraction * s.decay_iters)
                                      : 0);
  s.wsd_decay_iters = o.lr_wsd_decay_iters;
  if (s.style == LRDecayStyle::WSD)
    OMNI_REQUIRE(s.wsd_decay_iters > 0 && s.wsd_decay_iters <= s.decay_iters - s.warmup_iters,
                 "--lr-wsd-decay-iters must be positive and fit after the warm-up");
  OMNI_REQUIRE(o.device == "auto" || o.device == "cpu" || o.device == "cuda" || o.device == "hip",
               "--device: '", o.device, "' is not one of auto, cpu, cuda, hip");
}

std::string options_help() {
  std::ostringstream os;
  std::vector<std::string> groups;
  for (const OptionDef& d : option_table())
    if (std::find(groups.begin(), groups.end(), d.group) == groups.end()) groups.push_back(d.group);
  const Options defaults;
  for (const std::string& g : groups) {
    os << "\n" << g << ":\n";
    for (const OptionDef& d : option_table()) {
      if (d.group != g) continue;
      std::string left = "  " + d.flag + (d.metavar.empty() ? "" : " " + d.metavar);
      os << left << std::string(left.size() < 44 ? 44 - left.size() : 1, ' ') << d.help;
      std::string def = d.get(defaults);
      if (!d.metavar.empty() && !def.empty() && g != "not built yet") os << " [" << def << "]";
      os << "\n";
    }
  }
  return os.str();
}

std::vector<std::string> options_as_args(const Options& opts, const std::string& group) {
  std::vector<std::string> args;
  for (const OptionDef& d : option_table()) {
    if (d.group != group) continue;
    std::string v = d.get(opts);
    if (d.metavar.empty()) {
      if (!v.empty()) args.push_back(d.flag);
    } else {
      args.push_back(d.flag);
      args.push_back(v);
    }
  }
  return args;
}

}  // namespace omni
