#include "config/options.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>

#include "base/error.h"
#include "config/option_rows.h"

namespace omni {

namespace option_rows {

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
  return OptionDef{flag,
                   metavar,
                   "accepted, no effect",
                   why,
                   [flag, why](Options& o, const std::string&) {
                     // Commands parse some arguments twice (a preset, then a checkpoint's
                     // options under the command line): note each flag once.
                     std::string note = "note: " + flag + " has no effect here: " + why;
                     if (std::find(o.notes.begin(), o.notes.end(), note) == o.notes.end())
                       o.notes.push_back(std::move(note));
                   },
                   [](const Options&) { return std::string(); }};
}

}  // namespace option_rows

const std::vector<OptionDef>& option_table() {
  static const std::vector<OptionDef> table = [] {
    using namespace option_rows;
    std::vector<OptionDef> t;
    for (auto add :
         {add_model_options, add_training_options, add_learning_rate_options, add_data_options,
          add_logging_options, add_command_options, add_checkpointing_options,
          add_distributed_options, add_mixed_precision_options, add_noted_and_refused_options})
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
  OMNI_REQUIRE(
      int(o.mock_data) + int(!o.data_path.empty()) + int(!o.data_file_list.empty()) +
              int(!o.train_text.empty()) <=
          1,
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
                 "--recompute-method uniform with --recompute-num-layers ", o.recompute_num_layers,
                 " (groups of layers recomputed together) is not built yet; uniform 1 and "
                 "block N are");
  }
  OMNI_REQUIRE(o.tensor_model_parallel_size >= 1,
               "--tensor-model-parallel-size must be at least 1");
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
