#include "config/options.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>

#include "base/error.h"
#include "config/option_rows.h"

namespace omni {

const std::vector<OptionDef>& option_table() {
  static const std::vector<OptionDef> table = [] {
    using namespace option_rows;
    std::vector<OptionDef> t;
    for (auto add :
         {add_model_options, add_moe_options, add_training_options, add_learning_rate_options, add_data_options,
          add_logging_options, add_evaluation_options, add_command_options,
          add_checkpointing_options, add_distributed_options, add_mixed_precision_options,
          add_noted_options, add_refused_options, add_primus_options, add_mla_options})
      add(t);
    return t;
  }();
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

namespace {

// "--num-experts 8, --moe-grouped-gemm: not built yet: mixture of experts; --fp8-format
// hybrid: not built yet: fp8 training", features in the order the command line names them.
std::string not_built_message(const std::vector<NotBuiltError>& refused) {
  std::vector<std::pair<std::string, std::string>> by_feature;  // feature, its flags
  for (const NotBuiltError& e : refused) {
    auto it = std::find_if(by_feature.begin(), by_feature.end(),
                           [&](const auto& f) { return f.first == e.feature; });
    if (it == by_feature.end())
      by_feature.emplace_back(e.feature, e.flag_and_value);
    else if ((", " + it->second + ", ").find(", " + e.flag_and_value + ", ") == std::string::npos)
      it->second += ", " + e.flag_and_value;
  }
  std::string message;
  for (const auto& [feature, flags] : by_feature)
    message += (message.empty() ? "" : "; ") + flags + ": not built yet: " + feature;
  return message;
}

}  // namespace

void parse_options(const std::vector<std::string>& args, Options& opts) {
  // Refusals by flag, reported together after the whole line.
  std::vector<std::pair<std::string, NotBuiltError>> refused;
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
    // A later value of the same flag replaces an earlier one, refusal included (a YAML's
    // value overridden on the command line).
    std::erase_if(refused, [&](const auto& r) { return r.first == flag; });
    try {
      def->set(opts, value);
    } catch (const NotBuiltError& e) {
      refused.emplace_back(flag, e);
    }
  }
  if (refused.empty()) return;
  std::vector<NotBuiltError> errors;
  for (auto& r : refused) errors.push_back(r.second);
  throw UsageError(not_built_message(errors));
}

namespace {

// --data-args-path FILE: --data-path's value read from a file (Megatron reads its
// whitespace-separated words), for blends too long for a command line.
void read_data_args(Options& o) {
  OMNI_REQUIRE(o.data_path.empty(), "give one of --data-path and --data-args-path");
  std::ifstream in(o.data_args_path);
  OMNI_REQUIRE(in.good(), "--data-args-path: cannot read '", o.data_args_path, "'");
  for (std::string word; in >> word;) o.data_path += (o.data_path.empty() ? "" : " ") + word;
  OMNI_REQUIRE(!o.data_path.empty(), "--data-args-path: '", o.data_args_path, "' is empty");
  o.data_args_path.clear();  // read once, so finalizing again changes nothing
}

// --num-virtual-stages-per-pipeline-rank V: the interleaved schedule as a count of chunks,
// turned into the layers per chunk (Megatron: 1 chunk is no interleaving).
void virtual_stages_to_layers(Options& o) {
  const int v = o.num_virtual_stages_per_pipeline_rank, pp = o.pipeline_model_parallel_size;
  OMNI_REQUIRE(o.num_layers_per_virtual_pipeline_stage == 0,
               "give one of --num-layers-per-virtual-pipeline-stage and "
               "--num-virtual-stages-per-pipeline-rank");
  OMNI_REQUIRE(o.decoder_first_pipeline_num_layers == 0 && o.decoder_last_pipeline_num_layers == 0,
               "--num-virtual-stages-per-pipeline-rank with an uneven pipeline split "
               "(--decoder-first/last-pipeline-num-layers) is not built yet");
  OMNI_REQUIRE(o.model.num_layers % (pp * v) == 0, "--num-virtual-stages-per-pipeline-rank ", v,
               " x --pipeline-model-parallel-size ", pp, " must divide --num-layers (",
               o.model.num_layers, ")");
  o.num_layers_per_virtual_pipeline_stage = v == 1 ? 0 : o.model.num_layers / (pp * v);
  o.num_virtual_stages_per_pipeline_rank = 0;
}

// Data (Megatron's data group): one source, and the vocabulary it implies.
void finalize_data(Options& o) {
  if (!o.data_args_path.empty()) read_data_args(o);
  const bool indexed = !o.data_path.empty() || !o.data_file_list.empty() || o.per_split_data();
  OMNI_REQUIRE(
      int(o.mock_data) + int(!o.data_path.empty()) + int(!o.data_file_list.empty()) +
              int(!o.train_text.empty()) + int(o.per_split_data()) <=
          1,
      "choose one data source: --mock-data, --data-path, --data-file-list, --train-text or "
      "--train-data-path (with --valid-data-path, --test-data-path)");
  // Megatron's blend_per_split: the training split needs its own datasets.
  OMNI_REQUIRE(!o.per_split_data() || !o.train_data_path.empty(),
               "--valid-data-path and --test-data-path need --train-data-path for training");
  if (o.mock_data || indexed) {
    OMNI_REQUIRE(o.model.vocab_size > 0, o.mock_data ? "--mock-data" : "--data-path",
                 " needs --vocab-size or --tokenizer-type");
  } else {
    OMNI_REQUIRE(o.model.vocab_size == 0 || o.model.vocab_size == 256,
                 "--vocab-size applies to --mock-data and --data-path; byte-level text has 256 "
                 "tokens");
    o.model.vocab_size = 256;
  }
  if (!o.pad_vocab_size) {
    // Megatron's --no-pad-vocab-size: the embedding holds exactly the tokenizer's ids, which
    // the tensor-parallel ranks must then split evenly.
    OMNI_REQUIRE(o.model.vocab_size % o.tensor_model_parallel_size == 0,
                 "--no-pad-vocab-size: the vocabulary (", o.model.vocab_size,
                 ") must divide evenly among --tensor-model-parallel-size ",
                 o.tensor_model_parallel_size, " ranks");
    o.model.make_vocab_size_divisible_by = 1;
  }
}

// Model, mixed precision and activation recompute.
void finalize_model(Options& o) {
  o.model.validate();
  option_rows::finalize_moe(o);
  option_rows::finalize_mla(o);
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
                 "--recompute-method uniform with --recompute-num-layers ", o.recompute_num_layers,
                 " (groups of layers recomputed together) is not built yet; uniform 1 and "
                 "block N are");
  }
}

// The parallel layout (Megatron's distributed group).
void finalize_layout(Options& o) {
  OMNI_REQUIRE(o.tensor_model_parallel_size >= 1,
               "--tensor-model-parallel-size must be at least 1");
  OMNI_REQUIRE(o.pipeline_model_parallel_size >= 1,
               "--pipeline-model-parallel-size must be at least 1");
  OMNI_REQUIRE(o.context_parallel_size >= 1, "--context-parallel-size must be at least 1");
  // Ulysses (parallel/ulysses.h) gives each tensor- and context-parallel rank whole heads.
  const int ulysses = o.cp_comm_type == "a2a" ? o.context_parallel_size : 1;
  const int split = o.tensor_model_parallel_size * ulysses, groups = o.model.query_groups();
  OMNI_REQUIRE(ulysses == 1 || (o.model.num_attention_heads % split == 0 && groups % split == 0),
               "Ulysses sequence parallelism splits the heads: --num-attention-heads (",
               o.model.num_attention_heads, ") and --num-query-groups (", groups,
               ") must divide by --tensor-model-parallel-size (", o.tensor_model_parallel_size,
               ") x the sequence-parallel size (", ulysses, ")");
  OMNI_REQUIRE(o.num_virtual_stages_per_pipeline_rank >= 0,
               "--num-virtual-stages-per-pipeline-rank must be positive");
  if (o.num_virtual_stages_per_pipeline_rank > 0) virtual_stages_to_layers(o);
  OMNI_REQUIRE(o.num_layers_per_virtual_pipeline_stage >= 0,
               "--num-layers-per-virtual-pipeline-stage must be 0 (off) or positive");
  OMNI_REQUIRE(o.ddp_bucket_size >= 0, "--ddp-bucket-size must be 0 (default) or positive");
  option_rows::finalize_zero(o);
}

// Logging, TensorBoard and profiling.
void finalize_logging(Options& o) {
  OMNI_REQUIRE(o.tensorboard_log_interval > 0, "--tensorboard-log-interval must be positive");
  OMNI_REQUIRE(o.log_avg_skip_iterations >= 0 && o.log_avg_reset_interval >= 0,
               "--log-avg-skip-iterations and --log-avg-reset-interval must be 0 or positive");
  option_rows::finalize_logging_and_profiling(o);
}

// The training and evaluation batches (data parallel is known by now).
void finalize_batches(Options& o) {
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
  OMNI_REQUIRE(o.eval_global_batch_size == 0 || o.eval_global_batch_size == o.global_batch_size,
               "--eval-global-batch-size ", o.eval_global_batch_size,
               ": not built yet: an evaluation batch other than --global-batch-size (",
               o.global_batch_size, ")");
  OMNI_REQUIRE(o.eval_micro_batch_size == 0 || o.eval_micro_batch_size == o.micro_batch_size,
               "--eval-micro-batch-size ", o.eval_micro_batch_size,
               ": not built yet: an evaluation micro batch other than --micro-batch-size (",
               o.micro_batch_size, ")");
}

// Learning rate, intervals, exit conditions, regularisation and the optimizer.
void finalize_training(Options& o) {
  OMNI_REQUIRE(o.lr >= 0 && o.min_lr >= 0 && o.min_lr <= o.lr, "--min-lr (", o.min_lr,
               ") must be between 0 and --lr (", o.lr, ")");
  OMNI_REQUIRE(o.log_interval > 0, "--log-interval must be positive (got ", o.log_interval, ")");
  OMNI_REQUIRE(o.eval_interval >= 0, "--eval-interval must be 0 or positive");
  OMNI_REQUIRE(o.eval_task_interval >= 0 && o.eval_task_limit >= 0,
               "--eval-task-interval and --eval-task-limit must be 0 or positive");
  OMNI_REQUIRE(o.eval_iters >= 0, "--eval-iters must be 0 or positive");
  OMNI_REQUIRE(o.start_eval_at_iter >= 0, "--start-eval-at-iter must be 0 or positive");
  OMNI_REQUIRE(o.exit_signal >= 1 && o.exit_signal <= 64, "--exit-signal: ", o.exit_signal,
               " is not a signal number");
  // Megatron's validate_args: the switch is deprecated, and only rope (which has no table
  // to drop) tolerates it.
  OMNI_REQUIRE(!o.no_position_embedding ||
                   o.model.position_embedding_type != PositionEmbedding::LearnedAbsolute,
               "--no-position-embedding is deprecated (as in Megatron), use "
               "--position-embedding-type: none for a model without position embedding");
  OMNI_REQUIRE(o.optim.clip_grad >= 0, "--clip-grad must be 0 or positive");
  OMNI_REQUIRE(o.optim.adam_beta1 >= 0 && o.optim.adam_beta1 < 1, "--adam-beta1 must be in [0, 1)");
  OMNI_REQUIRE(o.optim.adam_beta2 >= 0 && o.optim.adam_beta2 < 1, "--adam-beta2 must be in [0, 1)");
  OMNI_REQUIRE(o.optim.adam_eps > 0, "--adam-eps must be positive");
  o.optim.kind = parse_optimizer(o.optimizer);
  option_rows::finalize_optimizer_zoo(o);
}

}  // namespace

// Each group's checks in turn; the order is the order of the errors a bad run meets first.
void finalize(Options& o) {
  finalize_data(o);
  finalize_model(o);
  finalize_layout(o);
  finalize_logging(o);
  finalize_batches(o);
  finalize_training(o);
  option_rows::finalize_schedules(o);
  OMNI_REQUIRE(o.device == "auto" || o.device == "cpu" || o.device == "cuda" || o.device == "hip",
               "--device: '", o.device, "' is not one of auto, cpu, cuda, hip");
}

namespace {

// "  why:" then the flags, wrapped at 100 columns: Megatron's noted and refused flags are
// hundreds, so --help lists them by reason rather than one a line.
void list_by_reason(std::ostringstream& os, Support support, const std::string& title) {
  std::vector<std::pair<std::string, std::vector<std::string>>> reasons;  // and their flags
  for (const OptionDef& d : option_table()) {
    if (d.support != support) continue;
    std::string reason = d.help, flag = d.flag;
    const size_t works = reason.find(" works)");
    if (works != std::string::npos) {  // "feature (1 works)": the flag carries its "off" value
      const size_t open = reason.rfind(" (", works);
      flag += " " + reason.substr(open + 2, works - open - 2);
      reason = reason.substr(0, open);
    }
    auto it = std::find_if(reasons.begin(), reasons.end(),
                           [&](const auto& r) { return r.first == reason; });
    if (it == reasons.end()) it = reasons.insert(reasons.end(), {reason, {}});
    it->second.push_back(flag);
  }
  // Items joined into lines of at most 100 columns, each starting with `indent`.
  const auto wrap = [&os](const std::vector<std::string>& items, const std::string& indent) {
    std::string line = indent;
    for (const std::string& item : items) {
      if (line.size() > indent.size() && line.size() + item.size() + 1 > 100)
        os << line << "\n", line = indent;
      line += (line.size() > indent.size() ? " " : "") + item;
    }
    os << line << "\n";
  };
  os << "\n" << title << ":\n";
  for (const auto& [reason, flags] : reasons) {
    std::istringstream words(reason + ":");
    wrap({std::istream_iterator<std::string>(words), std::istream_iterator<std::string>()}, "  ");
    wrap(flags, "    ");
  }
}

}  // namespace

std::string options_help() {
  std::ostringstream os;
  std::vector<std::string> groups;
  for (const OptionDef& d : option_table())
    if (d.support == Support::Built &&
        std::find(groups.begin(), groups.end(), d.group) == groups.end())
      groups.push_back(d.group);
  const Options defaults;
  for (const std::string& g : groups) {
    os << "\n" << g << ":\n";
    for (const OptionDef& d : option_table()) {
      if (d.group != g || d.support != Support::Built) continue;
      std::string left = "  " + d.flag + (d.metavar.empty() ? "" : " " + d.metavar);
      os << left << std::string(left.size() < 44 ? 44 - left.size() : 1, ' ') << d.help;
      const std::string def = d.get ? d.get(defaults) : "";
      if (!d.metavar.empty() && !def.empty()) os << " [" << def << "]";
      os << "\n";
    }
  }
  list_by_reason(os, Support::Noted,
                 "Megatron flags accepted with a note (no effect here, for the reason given)");
  list_by_reason(os, Support::NotBuilt,
                 "Megatron flags of features not built yet (refused, naming the feature; a value "
                 "shown with a flag is accepted: it means the feature is off)");
  return os.str();
}

std::vector<std::string> options_as_args(const Options& opts, const std::string& group) {
  std::vector<std::string> args;
  for (const OptionDef& d : option_table()) {
    if (d.group != group || !d.get) continue;
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
