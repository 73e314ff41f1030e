// GELU's form as Megatron chooses it (issue 11, "the meanings that differ today"): the exact
// erf GELU by default, the tanh approximation only with --openai-gelu, from the command line,
// from YAML (openai_gelu, as Primus's language_model.yaml writes it) and in the binary.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cli/process.h"
#include "config/config_test_helpers.h"
#include "config/options.h"
#include "config/yaml_config.h"
#include "model/gpt_model.h"

namespace omni {
namespace {

TEST(GeluForm, MegatronsDefaultIsTheExactErfGeluAndOpenaiGeluSelectsTanh) {
  Options o;
  parse_options({"--num-layers", "2"}, o);
  EXPECT_FALSE(o.model.openai_gelu);
  EXPECT_EQ(gelu_form(o.model), GeluForm::Erf);
  parse_options({"--openai-gelu"}, o);
  EXPECT_TRUE(o.model.openai_gelu);
  EXPECT_EQ(gelu_form(o.model), GeluForm::Tanh);
}

class GeluFormYaml : public YamlFiles {};

TEST_F(GeluFormYaml, OpenaiGeluKeyIsTheSwitch) {
  Options tanh, erf;
  parse_options(yaml_to_args(write("tanh.yaml", "openai_gelu: true\n"), {}), tanh);
  parse_options(yaml_to_args(write("erf.yaml", "openai_gelu: false\n"), {}), erf);
  EXPECT_TRUE(tanh.model.openai_gelu);
  EXPECT_FALSE(erf.model.openai_gelu);
}

const std::string kTiny =
    "train --mock-data --vocab-size 50 --num-layers 1 --hidden-size 16 --num-attention-heads 2 "
    "--seq-length 8 --micro-batch-size 2 --train-iters 1 --eval-iters 0 --no-progress ";

TEST(GeluForm, TheBinarySaysWhichGeluItTrainsAndHelpGivesTheDefault) {
  const ProcessResult erf = run_omnitron(kTiny);
  EXPECT_EQ(erf.exit_code, 0) << erf.output;
  EXPECT_NE(erf.output.find(", GELU (erf)"), std::string::npos) << erf.output;
  const ProcessResult tanh = run_omnitron(kTiny + "--openai-gelu");
  EXPECT_EQ(tanh.exit_code, 0) << tanh.output;
  EXPECT_NE(tanh.output.find(", GELU (tanh)"), std::string::npos) << tanh.output;
  const ProcessResult help = run_omnitron("train --help");
  EXPECT_NE(help.output.find("--openai-gelu"), std::string::npos) << help.output;
  EXPECT_NE(help.output.find("default: Megatron's exact erf GELU"), std::string::npos)
      << help.output;
}

}  // namespace
}  // namespace omni
