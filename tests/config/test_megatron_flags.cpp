// Every flag of current Megatron-LM (tests/fixtures/megatron_flags.tsv: Megatron's
// arguments.py at d98e8a64) is implemented with Megatron's meaning, accepted with a note, or
// refused naming the feature that is not built yet: none is an unknown option.
#include <gtest/gtest.h>

#include <cstdio>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "base/error.h"
#include "config/megatron_flag_list.h"
#include "config/options.h"

namespace omni {
namespace {

std::vector<std::string> command_line(const MegatronFlag& f) {
  std::vector<std::string> args = {f.flag};
  args.insert(args.end(), f.test_value.begin(), f.test_value.end());
  return args;
}

std::string parse_error(const std::vector<std::string>& args, Options& o) {
  try {
    parse_options(args, o);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(MegatronFlagList, HoldsEveryFlagOfMegatronsArgumentsPy) {
  const std::vector<MegatronFlag> flags = megatron_flags();
  EXPECT_EQ(flags.size(), 876u);
  std::set<std::string> names;
  for (const MegatronFlag& f : flags) {
    EXPECT_TRUE(names.insert(f.flag).second) << f.flag << " twice";
    EXPECT_EQ(f.takes_value, !f.test_value.empty()) << f.flag;
  }
}

TEST(MegatronFlags, NoFlagIsUnknown) {
  int built = 0, noted = 0, refused = 0;
  std::vector<std::string> unknown;
  for (const MegatronFlag& f : megatron_flags()) {
    Options o;
    const std::string error = parse_error(command_line(f), o);
    const OptionDef* def = find_option(f.flag);
    if (!def || error.find("unknown option") != std::string::npos) {
      unknown.push_back(f.flag);
      continue;
    }
    EXPECT_EQ(def->metavar.empty(), !f.takes_value) << f.flag << " takes a value in Megatron";
    switch (def->support) {
      case Support::Built:
        ++built;
        break;
      case Support::Noted:
        ++noted;
        break;
      case Support::NotBuilt:
        ++refused;
        break;
    }
  }
  std::printf(
      "Megatron's %zu flags: %d implemented, %d noted, %d refused (not built yet), %zu "
      "unknown\n",
      megatron_flags().size(), built, noted, refused, unknown.size());
  std::string list;
  for (const std::string& f : unknown) list += " " + f;
  EXPECT_TRUE(unknown.empty()) << "unknown:" << list;
}

TEST(MegatronFlags, AFlagThatTakesAListReadsEveryValue) {
  Options o;
  // --recompute-modules takes several values; --seed after them is a flag again.
  parse_options({"--recompute-modules", "core_attn", "mlp", "--seed", "7"}, o);
  EXPECT_EQ(o.seed, 7);
}

TEST(MegatronFlags, EveryRefusedFlagSaysNotBuiltYetAndNamesItsFeature) {
  int checked = 0;
  for (const MegatronFlag& f : megatron_flags()) {
    const OptionDef* def = find_option(f.flag);
    if (!def || def->support != Support::NotBuilt) continue;
    Options o;
    const std::string error = parse_error(command_line(f), o);
    if (error.empty()) {  // the test value is the one that means "off" (EP 1, MTP 0 layers)
      EXPECT_NE(def->help.find(" works)"), std::string::npos) << f.flag << " accepted";
      continue;
    }
    const std::string feature = def->help.substr(0, def->help.find(" ("));
    EXPECT_EQ(error.find(f.flag), 0u) << error;
    EXPECT_NE(error.find(": not built yet: " + feature), std::string::npos) << error;
    ++checked;
  }
  EXPECT_GT(checked, 200);
}

TEST(MegatronFlags, MixtureOfExpertsAndExpertParallelismAreBuilt) {
  Options o;
  EXPECT_EQ(parse_error({"--num-experts", "8", "--moe-router-topk", "2", "--moe-aux-loss-coeff",
                         "0.01", "--moe-token-dispatcher-type", "alltoall"},
                        o),
            "");
  EXPECT_EQ(o.model.num_moe_experts, 8);
  EXPECT_EQ(o.model.moe_aux_loss_coeff, 0.01);
  EXPECT_TRUE(o.notes.empty());
  EXPECT_EQ(parse_error({"--expert-model-parallel-size", "2"}, o), "");
  EXPECT_EQ(o.expert_model_parallel_size, 2);
  EXPECT_EQ(parse_error({"--expert-tensor-parallel-size", "2"}, o), "");  // finalize checks it
  EXPECT_EQ(o.expert_tensor_parallel_size, 2);
  EXPECT_EQ(parse_error({"--moe-token-dispatcher-type", "flex"}, o),
            "--moe-token-dispatcher-type flex: not built yet: the flex token dispatcher (DeepEP, "
            "HybridEP)");
  EXPECT_EQ(parse_error({"--moe-router-load-balancing-type", "sinkhorn"}, o),
            "--moe-router-load-balancing-type sinkhorn: not built yet: load-balancing types "
            "other than aux_loss, seq_aux_loss and none");
  // Megatron's kernel and communication knobs say they change nothing here.
  Options knobs;
  parse_options({"--moe-permute-fusion"}, knobs);
  ASSERT_EQ(knobs.notes.size(), 1u);
  EXPECT_NE(knobs.notes[0].find("--moe-permute-fusion has no effect here: it tunes Megatron's "
                                "MoE kernels"),
            std::string::npos)
      << knobs.notes[0];
}

// Multi-token prediction builds --mtp-num-layers separate depths on the last stage; Megatron's
// variants of it stop with one line naming the flag and what is built instead.
TEST(MegatronFlags, MultiTokenPredictionVariantsAreRefused) {
  Options o;
  EXPECT_EQ(parse_error({"--mtp-num-layers", "2", "--mtp-loss-scaling-factor", "0.3"}, o), "");
  EXPECT_TRUE(o.notes.empty());
  EXPECT_EQ(parse_error({"--mtp-use-repeated-layer"}, o),
            "--mtp-use-repeated-layer: not built yet: one multi-token prediction layer shared by "
            "every depth (each of the --mtp-num-layers depths has its own layer)");
  for (const char* flag : {"--mtp-standalone", "--mtp-detach-heads", "--mtp-hsm"}) {
    const std::string error = parse_error({flag}, o);
    EXPECT_EQ(error.find(std::string(flag) + ": not built yet: "), 0u) << error;
    EXPECT_EQ(error.find('\n'), std::string::npos) << error;
  }
  EXPECT_EQ(
      parse_error({"--mtp-hybrid-override-pattern", "MM"}, o)
          .find("--mtp-hybrid-override-pattern MM: not built yet: multi-token prediction patterns "
                "of Mamba and hybrid models"),
      0u);
}

TEST(MegatronFlags, AllRefusedFeaturesOfACommandLineAreNamedInOneError) {
  Options o;
  EXPECT_EQ(parse_error({"--sample-rate", "0.5", "--fp8-format", "hybrid", "--seed", "3",
                         "--glu-linear-offset", "1"},
                        o),
            "--sample-rate 0.5: not built yet: sub-sampling the training data; --fp8-format "
            "hybrid: not built yet: fp8 training; --glu-linear-offset 1: not built yet: "
            "activation functions other than GELU and SwiGLU");
  // An unknown flag is still reported at once, by name.
  EXPECT_NE(parse_error({"--num-experts", "8", "--num-layer", "2"}, o)
                .find("unknown option "
                      "--num-layer"),
            std::string::npos);
}

TEST(MegatronFlags, EveryNotedFlagGivesExactlyOneNote) {
  int checked = 0;
  for (const MegatronFlag& f : megatron_flags()) {
    const OptionDef* def = find_option(f.flag);
    if (!def || def->support != Support::Noted) continue;
    Options o;
    parse_options(command_line(f), o);
    parse_options(command_line(f), o);  // commands re-parse under presets and checkpoints
    ASSERT_EQ(o.notes.size(), 1u) << f.flag;
    EXPECT_EQ(o.notes[0], "note: " + f.flag + " has no effect here: " + def->help);
    ++checked;
  }
  EXPECT_GT(checked, 400);
}

TEST(MegatronFlags, TheTableHasOneRowPerFlag) {
  std::set<std::string> seen;
  for (const OptionDef& d : option_table()) EXPECT_TRUE(seen.insert(d.flag).second) << d.flag;
}

TEST(MegatronFlags, HelpListsNotedAndRefusedFlagsByReason) {
  const std::string help = options_help();
  EXPECT_NE(help.find("Megatron flags accepted with a note"), std::string::npos);
  EXPECT_NE(help.find("  sub-sampling the training data:\n    --sample-rate 1"), std::string::npos);
  // Readable: no line wider than 100 columns but the built rows' own help.
  std::istringstream in(help.substr(help.find("Megatron flags accepted with a note")));
  for (std::string line; std::getline(in, line);)
    if (line.rfind("    --", 0) == 0) {
      EXPECT_LE(line.size(), 100u) << line;
    }
}

}  // namespace
}  // namespace omni
