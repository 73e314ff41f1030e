#include "config/env_overrides.h"

#include <cstdlib>

#include "base/error.h"

namespace omni {

namespace {

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

}  // namespace

std::vector<EnvOverride> env_overrides(const std::map<std::string, std::string>& env) {
  auto get = [&](const char* k) -> const std::string* {
    auto it = env.find(k);
    return it == env.end() ? nullptr : &it->second;
  };
  std::vector<EnvOverride> out;
  auto add = [&](const char* var, std::vector<std::string> args) {
    out.push_back({var, *get(var), std::move(args)});
  };
  // Variables that are one flag with the same value.
  const std::pair<const char*, const char*> plain[] = {
      {"TP", "--tensor-model-parallel-size"}, {"PP", "--pipeline-model-parallel-size"},
      {"NLAYERS", "--num-layers"},            {"HIDDEN", "--hidden-size"},
      {"HEADS", "--num-attention-heads"},     {"FFN_HIDDEN_SIZE", "--ffn-hidden-size"},
      {"SEQ", "--seq-length"},                {"MICRO_BATCH", "--micro-batch-size"},
      {"TRAIN_ITERS", "--train-iters"},       {"LR", "--lr"},
      {"WEIGHT_DECAY", "--weight-decay"},     {"DATA_FILE_LIST", "--data-file-list"}};
  for (const auto& [var, flag] : plain)
    if (get(var)) add(var, {flag, *get(var)});
  if (get("SP") && truthy("SP", *get("SP"))) add("SP", {"--sequence-parallel"});
  if (get("NUM_KV_HEAD"))
    add("NUM_KV_HEAD", {"--group-query-attention", "--num-query-groups", *get("NUM_KV_HEAD")});
  if (get("GRAD_ACC_STEPS")) {
    OMNI_REQUIRE(get("MICRO_BATCH"), "GRAD_ACC_STEPS needs MICRO_BATCH (the global batch is "
                 "MICRO_BATCH x GRAD_ACC_STEPS x data-parallel ranks)");
    const int64_t global = positive("MICRO_BATCH", *get("MICRO_BATCH")) *
                           positive("GRAD_ACC_STEPS", *get("GRAD_ACC_STEPS"));
    add("GRAD_ACC_STEPS", {"--global-batch-size", std::to_string(global)});
  }
  if (get("TRAIN_TOKENS")) {
    OMNI_REQUIRE(!get("TRAIN_ITERS"), "set TRAIN_TOKENS or TRAIN_ITERS, not both");
    OMNI_REQUIRE(get("SEQ") && get("MICRO_BATCH") && get("GRAD_ACC_STEPS"),
                 "TRAIN_TOKENS needs SEQ, MICRO_BATCH and GRAD_ACC_STEPS to become iterations");
    const int64_t per_iter = positive("SEQ", *get("SEQ")) *
                             positive("MICRO_BATCH", *get("MICRO_BATCH")) *
                             positive("GRAD_ACC_STEPS", *get("GRAD_ACC_STEPS"));
    const int64_t tokens = positive("TRAIN_TOKENS", *get("TRAIN_TOKENS"));
    add("TRAIN_TOKENS", {"--train-iters", std::to_string((tokens + per_iter - 1) / per_iter)});
  }
  if (const std::string* d = get("DTYPE")) {
    OMNI_REQUIRE(*d == "bf16" || *d == "fp16" || *d == "fp32", "DTYPE=", *d,
                 ": expected bf16, fp16 or fp32");
    add("DTYPE", *d == "fp32" ? std::vector<std::string>{} : std::vector<std::string>{"--" + *d});
  }
  if (const std::string* opt = get("OPT")) add("OPT", {"--optimizer", *opt});
  if (const std::string* z = get("ZERO_STAGE")) {
    OMNI_REQUIRE(*z == "0" || *z == "1" || *z == "2" || *z == "3", "ZERO_STAGE=", *z,
                 ": expected 0, 1, 2 or 3");
    // Stage 1 shards optimizer states, which is Megatron's distributed optimizer.
    add("ZERO_STAGE", *z == "0" ? std::vector<std::string>{}
                                : std::vector<std::string>{"--use-distributed-optimizer"});
  }
  if (get("USE_ACTIVATION_CHECKPOINTING") &&
      truthy("USE_ACTIVATION_CHECKPOINTING", *get("USE_ACTIVATION_CHECKPOINTING")))
    add("USE_ACTIVATION_CHECKPOINTING", {"--checkpoint-activations"});
  return out;
}

}  // namespace omni
