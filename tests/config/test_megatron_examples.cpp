// Megatron-LM's own example command lines (tests/fixtures/megatron_examples/: GPT-3 175B,
// Llama 3 8B fp8, Mixtral 8x7B, DeepSeek-V3) through the path `omnitron train` takes: only
// features that are not built yet stop them, each named; everything else parses and passes
// finalize()'s checks.
#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "base/error.h"
#include "config/config_test_helpers.h"
#include "config/megatron_flag_list.h"
#include "config/options.h"
#include "train/run_options.h"

namespace omni {
namespace {

// A flag followed by its values, up to the next --flag.
using Arguments = std::vector<std::vector<std::string>>;

Arguments example(const std::string& name) {
  std::ifstream in(std::string(OMNITRON_FIXTURE_DIR) + "/megatron_examples/" + name + ".args");
  EXPECT_TRUE(in.good()) << name;
  Arguments args;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    if (line.rfind("--", 0) == 0 || args.empty())
      args.push_back({line});
    else
      args.back().push_back(line);
  }
  return args;
}

// Without keep_refused: less each flag refused alone (for every value, or for the value given),
// and less `also`.
std::vector<std::string> flatten(const Arguments& args, bool keep_refused,
                                 const std::set<std::string>& also = {}) {
  std::vector<std::string> out;
  for (const std::vector<std::string>& a : args) {
    const OptionDef* def = find_option(a[0]);
    if (!keep_refused && def && def->support == Support::NotBuilt) continue;
    if (!keep_refused && also.count(a[0])) continue;
    if (!keep_refused) {
      Options scratch;
      try {
        parse_options(a, scratch);
      } catch (const NotBuiltError&) {
        continue;
      } catch (const UsageError& e) {  // parse_options collects NotBuiltErrors into one
        if (std::string(e.what()).find(": not built yet: ") != std::string::npos) continue;
      }
    }
    out.insert(out.end(), a.begin(), a.end());
  }
  return out;
}

std::set<std::string> refusals_of(const std::string& name) {
  try {
    resolve_run_options(flatten(example(name), true), 1);
  } catch (const UsageError& e) {
    const std::string error = e.what();
    EXPECT_EQ(error.find("unknown option"), std::string::npos) << error;
    return refused_features(error);
  }
  ADD_FAILURE() << name << " was accepted whole";
  return {};
}

// The example less its refused flags: every value parses and passes finalize()'s checks.
Options parsed_without_refusals(const std::string& name, int vocab_size,
                                const std::set<std::string>& also = {}) {
  Options o;
  parse_options(flatten(example(name), false, also), o);
  if (o.model.vocab_size == 0) o.model.vocab_size = vocab_size;  // the tokenizer's, unopened
  finalize(o);
  return o;
}

TEST(MegatronExamples, Gpt3_175bStopsOnlyAtTheStepBatchSizeSchedule) {
  EXPECT_EQ(refusals_of("gpt3_175b"),
            std::set<std::string>{"batch-size schedules (--rampup-batch-size is the one built)"});
  const Options o = parsed_without_refusals("gpt3_175b", 50257);
  EXPECT_EQ(o.model.num_layers, 96);
  EXPECT_EQ(o.tensor_model_parallel_size, 8);
  // .001 of --lr-decay-iters 430000, in samples of --global-batch-size 1536 (Megatron's
  // lr_warmup_steps = lr_warmup_fraction * lr_decay_iters * global_batch_size)
  EXPECT_DOUBLE_EQ(o.lr_schedule.warmup_steps, 0.001 * 430000 * 1536);
  EXPECT_TRUE(o.fp16);
}

TEST(MegatronExamples, Llama3_8bStopsOnlyAtFp8AndLowerPrecisionAndDecoupledLr) {
  EXPECT_EQ(refusals_of("llama3_8b_fp8"),
            (std::set<std::string>{"a separate learning rate for the embedding and output layers",
                                   "lower-precision gradient reduction, cross-entropy and logits",
                                   "fp8 training"}));
  const Options o = parsed_without_refusals("llama3_8b_fp8", 0);
  EXPECT_EQ(o.model.query_groups(), 8);
  EXPECT_EQ(o.split, "'99,1,0'");  // as the script's word splitting passes it; read as 99,1,0
  EXPECT_EQ(o.model.vocab_size, 128256);
}

TEST(MegatronExamples, Mixtral8x7bStopsAtNothingNotBuilt) {
  EXPECT_EQ(refusals_of("mixtral_8x7b"), std::set<std::string>{});
  const Options o = parsed_without_refusals("mixtral_8x7b", 32000);
  EXPECT_EQ(o.pipeline_model_parallel_size, 4);
  EXPECT_EQ(o.model.max_position_embeddings, 32768);
}

// Its --use-megatron-fsdp trains with the distributed optimizer (a note says what is not
// sharded), so it stops only at the features not built.
TEST(MegatronExamples, DeepSeekV3StopsOnlyAtDeepEP) {
  EXPECT_EQ(refusals_of("deepseek_v3"),
            (std::set<std::string>{"the flex token dispatcher (DeepEP, HybridEP)"}));
  // Less those, its forced load balancing (Megatron's benchmarking mode, random routing
  // scores) stops it, and only with experts.
  std::string error;
  try {
    parsed_without_refusals("deepseek_v3", 129280);
  } catch (const UsageError& e) {
    error = e.what();
  }
  EXPECT_EQ(error,
            "--moe-router-force-load-balancing with --num-experts: not built yet: MoE router "
            "variants (fp64 router, forced or biased balancing, quantile balancing, input jitter)");
  const Options o =
      parsed_without_refusals("deepseek_v3", 129280, {"--moe-router-force-load-balancing"});
  EXPECT_EQ(o.model.num_moe_experts, 256);
  EXPECT_EQ(o.model.mtp_num_layers, 1);
  EXPECT_EQ(o.model.mtp_loss_scaling_factor, 0.1);
  EXPECT_EQ(o.model.moe_router_topk, 8);
  EXPECT_EQ(o.model.moe_router_score_function, MoEScoreFunction::Sigmoid);
  EXPECT_TRUE(o.model.moe_router_enable_expert_bias);
  EXPECT_EQ(o.model.moe_layer_pattern()[2], 0);  // three dense layers first
  EXPECT_EQ(o.model.moe_layer_pattern()[3], 1);
  EXPECT_FALSE(o.check_for_nan_in_loss_and_grad);
  EXPECT_DOUBLE_EQ(o.lr_schedule.warmup_init, 3.9e-7);
  EXPECT_TRUE(o.use_distributed_optimizer);
}

}  // namespace
}  // namespace omni
