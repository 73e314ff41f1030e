// omnitron convert end to end, and Hugging Face directories given straight to --load.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "checkpoint/safetensors.h"
#include "cli/process.h"

namespace {

namespace fs = std::filesystem;

const std::string kHf = std::string(OMNITRON_FIXTURE_DIR) + "/hf/";

std::string fresh_dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "omnitron_cli_convert_" + name;
  fs::remove_all(dir);
  return dir;
}


// Every tensor of `a` is in `b` with the same bytes, and nothing else is.
void expect_same_tensors(const std::string& a, const std::string& b) {
  const omni::SafetensorsFile x(a), y(b);
  EXPECT_EQ(x.tensors().size(), y.tensors().size());
  for (const omni::SafetensorsTensor& t : x.tensors()) {
    const omni::SafetensorsTensor* u = y.find(t.name);
    ASSERT_NE(u, nullptr) << t.name;
    EXPECT_TRUE(u->dtype == t.dtype && u->shape == t.shape && u->bytes == t.bytes &&
                std::memcmp(u->data, t.data, t.bytes) == 0)
        << t.name;
  }
}

TEST(CliConvert, HfToOmnitronToHfGivesTheSameTensors) {
  for (const std::string name : {"gpt2_tiny", "llama_tiny_sharded"}) {
    const std::string ckpt = fresh_dir("ckpt_" + name), hf = fresh_dir("hf_" + name);
    auto [c1, o1] = run_omnitron("convert --load " + kHf + name + " --save " + ckpt);
    ASSERT_EQ(c1, 0) << o1;
    EXPECT_TRUE(fs::exists(ckpt + "/iter_0000000/model.bin")) << o1;
    EXPECT_FALSE(fs::exists(ckpt + "/iter_0000000/optimizer.bin"));
    auto [c2, o2] = run_omnitron("convert --load " + ckpt + " --save " + hf);
    ASSERT_EQ(c2, 0) << o2;
    EXPECT_NE(o2.find("to Hugging Face f32 weights"), std::string::npos) << o2;
    if (name == "gpt2_tiny") {
      expect_same_tensors(kHf + name + "/model.safetensors", hf + "/model.safetensors");
      EXPECT_NE(read_text(hf + "/config.json").find("\"GPT2LMHeadModel\""), std::string::npos);
    }
  }
}

TEST(CliConvert, DtypeChoosesTheStoredType) {
  const std::string ckpt = fresh_dir("bf16_ckpt"), hf = fresh_dir("bf16");
  ASSERT_EQ(run_omnitron("convert --load " + kHf + "llama_tiny --save " + ckpt).exit_code, 0);
  auto [code, out] = run_omnitron("convert --load " + ckpt + " --save " + hf + " --dtype bf16");
  ASSERT_EQ(code, 0) << out;
  const omni::SafetensorsFile f(hf + "/model.safetensors");
  for (const omni::SafetensorsTensor& t : f.tensors()) EXPECT_EQ(t.dtype, omni::DType::BF16);
  EXPECT_NE(read_text(hf + "/config.json").find("\"torch_dtype\": \"bfloat16\""),
            std::string::npos);
  // omnitron checkpoints hold float32; a missing checkpoint is named.
  auto [c2, o2] =
      run_omnitron("convert --load " + kHf + "llama_tiny --save " + ckpt + " --dtype bf16");
  EXPECT_EQ(c2, 2);
  EXPECT_NE(o2.find("--dtype applies to --to hf"), std::string::npos) << o2;
  auto [c3, o3] = run_omnitron("convert --load " + fresh_dir("none") + " --save " + hf);
  EXPECT_EQ(c3, 2);
  EXPECT_NE(o3.find("latest_checkpointed_iteration.txt"), std::string::npos) << o3;
}

TEST(CliConvert, TrainAndGenerateLoadAHfDirectory) {
  const std::string run = fresh_dir("run"), hf = fresh_dir("trained");
  auto [c1, o1] = run_omnitron("train --load " + kHf +
                               "gpt2_tiny --mock-data --seq-length 8 --micro-batch-size 2 "
                               "--train-iters 2 --eval-iters 0 --no-progress --save " +
                               run);
  ASSERT_EQ(c1, 0) << o1;
  EXPECT_NE(o1.find("loaded " + kHf + "gpt2_tiny at iteration 0"), std::string::npos) << o1;
  auto [c2, o2] = run_omnitron("convert --load " + run + " --save " + hf);
  ASSERT_EQ(c2, 0) << o2;
  EXPECT_NE(o2.find("iteration 2"), std::string::npos) << o2;
  // The byte-level (256-token) GPT-2 samples text; the same seed gives the same text.
  for (const std::string& dir : {kHf + "gpt2_tiny", hf}) {
    auto [c3, o3] = run_omnitron("generate --load " + dir + " --prompt ab --max-new-tokens 5");
    ASSERT_EQ(c3, 0) << o3;
    EXPECT_EQ(o3.rfind("ab", 0), 0u) << o3;
  }
}

TEST(CliConvert, MistakesAreOneLineErrors) {
  auto [c1, o1] = run_omnitron("convert --load " + kHf + "gpt2_tiny");
  EXPECT_EQ(c1, 2);
  EXPECT_NE(o1.find("convert needs --load SRC and --save DST"), std::string::npos) << o1;
  auto [c2, o2] =
      run_omnitron("convert --load " + kHf + "gpt2_tiny --save " + fresh_dir("x") + " --to hf");
  EXPECT_EQ(c2, 2);
  EXPECT_NE(o2.find("is already a Hugging Face model directory"), std::string::npos) << o2;
  auto [c3, o3] =
      run_omnitron("convert --load " + kHf + "gpt2_tiny --save " + fresh_dir("x") + " --to onnx");
  EXPECT_EQ(c3, 2);
  EXPECT_NE(o3.find("--to: 'onnx' is not one of hf, omnitron"), std::string::npos) << o3;
  auto [c4, o4] = run_omnitron("convert --help");
  EXPECT_EQ(c4, 0);
  EXPECT_NE(o4.find("usage: omnitron convert"), std::string::npos) << o4;
}

}  // namespace
