#include "config/env_overrides.h"

#include <cstdlib>

#include "base/error.h"
#include "config/options.h"
#include "optim/optimizer_zoo.h"

namespace omni {

namespace {

using Env = std::map<std::string, std::string>;

int64_t positive(const std::string& var, const std::string& v) {
  char* end = nullptr;
  const long long n = std::strtoll(v.c_str(), &end, 10);
  OMNI_REQUIRE(!v.empty() && *end == '\0' && n > 0, var, "=", v, ": expected a positive integer");
  return n;
}

bool truthy(const std::string& var, const std::string& v) {
  if (v == "1" || v == "true" || v == "True") return true;
  OMNI_REQUIRE(v == "0" || v == "false" || v == "False" || v.empty(), var, "=", v,
               ": expected 1/0 or true/false");
  return false;
}

// Reads the variables as helpers.sh does (${VAR:-default}: empty is unset) and collects
// what they become.
class Overrides {
 public:
  Overrides(const Env& env, int world_size) : env_(env), world_size_(world_size) {}

  const std::string* get(const std::string& var) const {
    auto it = env_.find(var);
    return it == env_.end() || it->second.empty() ? nullptr : &it->second;
  }
  // The first of `vars` that is set: helpers.sh's ${A:-${B}} aliases (A wins).
  const char* first(std::initializer_list<const char*> vars) const {
    for (const char* v : vars)
      if (get(v)) return v;
    return nullptr;
  }
  int64_t number_or(const char* var, int64_t fallback) const {
    return get(var) ? positive(var, *get(var)) : fallback;
  }
  void add(const std::string& var, std::vector<std::string> args, const std::string& why = {}) {
    const std::string source = var + "=" + *get(var);
    out.push_back({var, *get(var), source, std::move(args),
                   why.empty() ? "" : "note: " + source + ": " + why});
  }
  // Data-parallel ranks, as helpers.sh counts them: WORLD_SIZE / TP / PP / SP.
  int64_t data_parallel(const std::string& why) const {
    const int64_t tp = number_or("TP", 1), pp = number_or("PP", 1), sp = number_or("SP", 1);
    OMNI_REQUIRE(world_size_ % (tp * pp * sp) == 0, why, ": ", world_size_,
                 " rank(s) do not divide into TP ", tp, " x PP ", pp, " x SP ", sp,
                 " (the data-parallel ranks are what remains); start a multiple of ", tp * pp * sp,
                 " ranks (scripts/launch.sh: NPROC or GPUS_PER_NODE)");
    return world_size_ / (tp * pp * sp);
  }

  std::vector<EnvOverride> out;

 private:
  const Env& env_;
  int world_size_;
};

// Variables that are one flag with the same value; the second name is an alias that
// helpers.sh reads when the first is unset.
void add_plain(Overrides& r) {
  struct Plain {
    const char* vars[2];
    const char* flag;
  };
  const Plain plain[] = {
      {{"TP"}, "--tensor-model-parallel-size"},
      {{"PP"}, "--pipeline-model-parallel-size"},
      {{"NLAYERS", "NUM_LAYERS"}, "--num-layers"},
      {{"HIDDEN"}, "--hidden-size"},
      {{"HEADS", "NHEADS"}, "--num-attention-heads"},
      {{"FFN_HIDDEN_SIZE"}, "--ffn-hidden-size"},
      {{"SEQ"}, "--seq-length"},
      {{"MICRO_BATCH"}, "--micro-batch-size"},
      {{"LR"}, "--lr"},
      {{"LR_DECAY_ITERS"}, "--lr-decay-iters"},
      {{"LR_WARMUP_FRAC"}, "--lr-warmup-fraction"},
      {{"WEIGHT_DECAY"}, "--weight-decay"},
      {{"ADAM_BETA1"}, "--adam-beta1"},
      {{"ADAM_BETA2"}, "--adam-beta2"},
      {{"ADAM_EPS"}, "--adam-eps"},
      {{"CLIP_GRAD"}, "--clip-grad"},
      {{"INIT_METHOD_STD"}, "--init-method-std"},
      {{"ROPE_THETA"}, "--rotary-base"},  // helpers.sh: --rotary-position-embeddings-theta
      {{"EVAL_INTERVAL"}, "--eval-interval"},
      {{"EVAL_ITERS"}, "--eval-iters"},
      {{"LOG_INTERVAL"}, "--log-interval"},
      {{"SAVE_INTERVAL"}, "--save-interval"},
      {{"TIMING_LOG_LEVEL"}, "--timing-log-level"},
      {{"TOKENIZER_MODEL"}, "--tokenizer-model"},
      {{"DATA_FILE_LIST"}, "--data-file-list"}};
  for (const Plain& p : plain)
    if (const char* var = r.first({p.vars[0], p.vars[1] ? p.vars[1] : p.vars[0]}))
      r.add(var, {p.flag, *r.get(var)});
}

// SP is DeepSpeed-Ulysses's degree: each sequence split over SP ranks, which leave the
// data-parallel ranks, and attention by all-to-all over heads (parallel/ulysses.h; Megatron's
// --sequence-parallel is another thing: pass it as a flag).
void add_layout(Overrides& r) {
  if (r.get("SP")) {
    const int64_t sp = positive("SP", *r.get("SP"));
    r.add("SP", sp == 1
                    ? std::vector<std::string>{}
                    : std::vector<std::string>{"--ds-sequence-parallel-size", std::to_string(sp)});
  }
  if (const std::string* z = r.get("ZERO_STAGE")) {
    OMNI_REQUIRE(*z == "0" || *z == "1" || *z == "2" || *z == "3", "ZERO_STAGE=", *z,
                 ": expected 0, 1, 2 or 3");
    // Stage 1 (optimizer states) is Megatron's distributed optimizer; 2 and 3 shard more.
    r.add("ZERO_STAGE",
          *z == "0" ? std::vector<std::string>{} : std::vector<std::string>{"--zero-stage", *z});
  }
  if (const std::string* d = r.get("DTYPE")) {
    OMNI_REQUIRE(*d == "bf16" || *d == "fp16" || *d == "fp32", "DTYPE=", *d,
                 ": expected bf16, fp16 or fp32");
    r.add("DTYPE", *d == "fp32" ? std::vector<std::string>{} : std::vector<std::string>{"--" + *d});
  }
  const bool recompute =
      r.get("USE_ACTIVATION_CHECKPOINTING") &&
      truthy("USE_ACTIVATION_CHECKPOINTING", *r.get("USE_ACTIVATION_CHECKPOINTING"));
  if (recompute) r.add("USE_ACTIVATION_CHECKPOINTING", {"--checkpoint-activations"});
  if (r.get("ACT_CKPT_NUM_LAYERS")) {
    const int64_t n = positive("ACT_CKPT_NUM_LAYERS", *r.get("ACT_CKPT_NUM_LAYERS"));
    if (!recompute)
      r.add("ACT_CKPT_NUM_LAYERS", {},
            "it has no effect without USE_ACTIVATION_CHECKPOINTING=1 (as in helpers.sh)");
    else if (n == 1)
      r.add("ACT_CKPT_NUM_LAYERS", {"--recompute-num-layers", "1"});
    else
      r.add("ACT_CKPT_NUM_LAYERS", {},
            "recomputing groups of layers together is not built; every layer is recomputed "
            "on its own, which gives the same results with another memory use");
  }
  if (r.get("NUM_KV_HEAD"))
    r.add("NUM_KV_HEAD", {"--group-query-attention", "--num-query-groups", *r.get("NUM_KV_HEAD")});
}

// The global batch (GLOBAL_BATCH, else MICRO_BATCH x GRAD_ACC_STEPS x data-parallel ranks)
// and the length of training (TRAIN_TOKENS / SEQ / global batch, else TRAIN_ITERS).
void add_batch_and_length(Overrides& r) {
  int64_t global = 0;
  const std::string* mb = r.get("MICRO_BATCH");
  const std::string* gas = r.get("GRAD_ACC_STEPS");
  if (r.get("GLOBAL_BATCH")) {
    global = positive("GLOBAL_BATCH", *r.get("GLOBAL_BATCH"));
    r.add("GLOBAL_BATCH", {"--global-batch-size", std::to_string(global)});
    if (mb && gas) {
      const int64_t dp = r.data_parallel("GLOBAL_BATCH with GRAD_ACC_STEPS");
      const int64_t implied = positive("MICRO_BATCH", *mb) * positive("GRAD_ACC_STEPS", *gas) * dp;
      OMNI_REQUIRE(global == implied, "GLOBAL_BATCH=", global, " but MICRO_BATCH x GRAD_ACC_STEPS",
                   " x data-parallel ranks = ", *mb, " x ", *gas, " x ", dp, " = ", implied,
                   " (DeepSpeed refuses this too); set one of GLOBAL_BATCH and GRAD_ACC_STEPS");
    }
  } else if (gas) {
    OMNI_REQUIRE(mb,
                 "GRAD_ACC_STEPS needs MICRO_BATCH (the global batch is MICRO_BATCH x "
                 "GRAD_ACC_STEPS x data-parallel ranks)");
    const int64_t per_rank = positive("MICRO_BATCH", *mb) * positive("GRAD_ACC_STEPS", *gas);
    global = per_rank * r.data_parallel("GRAD_ACC_STEPS");
    r.add("GRAD_ACC_STEPS", {"--global-batch-size", std::to_string(global)});
  }
  const char* iters = r.first({"TRAIN_ITERS", "TRAIN_ITER"});
  if (r.get("TRAIN_TOKENS")) {
    OMNI_REQUIRE(r.get("SEQ") && (global || mb),
                 "TRAIN_TOKENS needs SEQ and GLOBAL_BATCH (or MICRO_BATCH, with GRAD_ACC_STEPS "
                 "if not 1) to become iterations");
    if (!global) global = positive("MICRO_BATCH", *mb) * r.data_parallel("TRAIN_TOKENS");
    const int64_t per_iter = positive("SEQ", *r.get("SEQ")) * global;
    const int64_t tokens = positive("TRAIN_TOKENS", *r.get("TRAIN_TOKENS"));
    OMNI_REQUIRE(tokens >= per_iter, "TRAIN_TOKENS=", tokens, " is less than one iteration (",
                 per_iter, " tokens: SEQ x global batch)");
    // helpers.sh divides in integers (rounding down), and TRAIN_TOKENS wins over TRAIN_ITERS.
    r.add("TRAIN_TOKENS", {"--train-iters", std::to_string(tokens / per_iter)},
          iters ? std::string(iters) + "=" + *r.get(iters) +
                      " is ignored: TRAIN_TOKENS sets the iterations (as in helpers.sh)"
                : "");
  } else if (iters) {
    r.add(iters, {"--train-iters", *r.get(iters)});
  }
}

void add_optimizer_and_schedule(Overrides& r) {
  if (const char* var = r.first({"OPT", "OPTIMIZER", "OPTIM"})) {
    const std::string& v = *r.get(var);
    if (v == "adamw" || v == "apex.adam")  // apex's FusedAdam decouples weight decay
      r.add(var, {"--optimizer", "adamw"});
    else if (v == "adam")
      r.add(var, {"--optimizer", "adam"},
            "Megatron-DeepSpeed's adam is torch.optim.Adam, which adds the weight decay to "
            "the gradient (L2); omnitron's adam is AdamW (decoupled, as Megatron's), so the "
            "runs match only with WEIGHT_DECAY=0");
    else if (v == "sgd" || v == "apex.sgd")
      r.add(var, {"--optimizer", "sgd"});
    else if (v == "ipex.lamb" || v == "ipex.fusedlamb")
      r.add(var, {"--optimizer", "lamb"},
            "omnitron's lamb is DeepSpeed FusedLamb's arithmetic (ds.fusedlamb: trust ratio "
            "from the update before bias correction, clamped to [0.01, 10]); Intel's Lamb is "
            "another implementation of the paper and may differ in those details");
    else if (auto kind = parse_zoo_optimizer(v))
      r.add(var, {"--optimizer", zoo_optimizer_name(*kind)});
    else
      throw NotBuiltError(
          std::string(var) + "=" + v,
          "the " + v + " optimizer (built: adamw, adam, sgd, " + zoo_optimizer_names() + ")");
  }
  if (const std::string* style = r.get("LR_DECAY_STYLE")) {
    if (*style == "infinite-cosine" || *style == "infinite-inv-square-root")
      throw NotBuiltError("LR_DECAY_STYLE=" + *style,
                          "Megatron-DeepSpeed's " + *style + " learning-rate schedule");
    r.add("LR_DECAY_STYLE", {"--lr-decay-style", *style});
  }
}

// helpers.sh: --split ${TRAIN_SPLIT:-990},${VAL_SPLIT:-10},${TEST_SPLIT:-0}; checkpoints in
// CKPT_DIR unless SAVE/LOAD say otherwise, TensorBoard in CKPT_DIR/tensorboard unless
// NO_TENSORBOARD is set; GPT-2 BPE for any TOKENIZER_TYPE starting with gpt or GPT.
void add_data_and_output(Overrides& r) {
  const char* split_vars[] = {"TRAIN_SPLIT", "VAL_SPLIT", "TEST_SPLIT"};
  const char* split_defaults[] = {"990", "10", "0"};
  std::string split, source;
  for (int i = 0; i < 3; ++i) {
    const std::string* v = r.get(split_vars[i]);
    if (i) split += ',';
    split += v ? *v : split_defaults[i];
    if (!v) continue;
    if (!source.empty()) source += ' ';
    source += std::string(split_vars[i]) + "=" + *v;
  }
  if (!source.empty()) {
    const char* var = r.first({"TRAIN_SPLIT", "VAL_SPLIT", "TEST_SPLIT"});
    r.out.push_back({var, *r.get(var), source, {"--split", split}, ""});
  }
  if (const std::string* t = r.get("TOKENIZER_TYPE")) {
    const bool gpt2 = t->starts_with("gpt") || t->starts_with("GPT");
    r.add("TOKENIZER_TYPE",
          {"--tokenizer-type", gpt2                  ? std::string("GPT2BPETokenizer")
                               : *t == "HFTokenizer" ? std::string("HuggingFaceTokenizer")
                                                     : *t});
  }
  const std::string* save = r.get("SAVE");
  const std::string* load = r.get("LOAD");
  const std::string* no_tb = r.get("NO_TENSORBOARD");
  if (save) r.add("SAVE", {"--save", *save});
  if (load) r.add("LOAD", {"--load", *load});
  if (const std::string* dir = r.get("CKPT_DIR")) {
    std::vector<std::string> args;
    if (!save) args.insert(args.end(), {"--save", *dir});
    if (!load) args.insert(args.end(), {"--load", *dir});
    if (!no_tb) args.insert(args.end(), {"--tensorboard-dir", *dir + "/tensorboard"});
    r.add("CKPT_DIR", args);
  }
  if (no_tb)
    r.add("NO_TENSORBOARD", {"--disable-tensorboard"},
          *no_tb == "0" || *no_tb == "false"
              ? "helpers.sh only asks whether NO_TENSORBOARD is set, so this turns TensorBoard "
                "off too; unset it to keep TensorBoard"
              : "");
}

// Variables that only tune DeepSpeed or pick a kernel: accepted, each with a note.
void add_noted(Overrides& r) {
  const std::pair<const char*, const char*> noted[] = {
      {"NO_FLASH_ATTN",
       "omnitron has one attention implementation per device and nothing to switch off; "
       "flash attention computes the same attention"},
      {"CPU_OPTIMIZER",
       "DeepSpeed's optimizer offload to the CPU (ZeRO stages 1 and 2) only moves where the "
       "optimizer step runs; omnitron keeps the optimizer states beside the parameters"},
      {"ZERO_HPZ_PARTITION_SIZE",
       "DeepSpeed ZeRO++'s secondary partition of the parameters within a node (stage 3) only "
       "changes where gathered parameters come from"},
      {"MICS_SHARD_SIZE",
       "DeepSpeed's MiCS shard groups only change how states are sharded (and helpers.sh does "
       "not pass MICS_SHARD_SIZE on either)"},
      {"COMMS_LOGGER", "DeepSpeed's communication logger has no counterpart here"}};
  for (const auto& [var, why] : noted)
    if (r.get(var)) r.add(var, {}, why);
}

}  // namespace

std::vector<EnvOverride> env_overrides(const std::map<std::string, std::string>& env,
                                       int world_size) {
  Overrides r(env, world_size);
  add_plain(r);
  add_layout(r);
  add_batch_and_length(r);
  add_optimizer_and_schedule(r);
  add_data_and_output(r);
  add_noted(r);
  // Each value must be what its flag takes; the error names the variable.
  for (const EnvOverride& o : r.out) {
    Options scratch;
    try {
      parse_options(o.args, scratch);
    } catch (const UsageError& e) {
      throw UsageError(o.source + ": " + e.what());
    }
  }
  return std::move(r.out);
}

}  // namespace omni
