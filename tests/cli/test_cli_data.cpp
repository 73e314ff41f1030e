// The data commands end to end through the binary: preprocess, merge-datasets, train on
// the result with packed-document masks, and data-samples.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "cli/process.h"

namespace {

TEST(CliData, PreprocessMergeTrainAndPrintSamples) {
  const std::string dir = ::testing::TempDir() + "omnitron_cli_data";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  {
    std::ofstream a(dir + "/a.jsonl"), b(dir + "/b.jsonl");
    for (int d = 0; d < 120; ++d) {
      std::string ids;
      for (int i = 0; i < 20 + d % 9; ++i) ids += std::to_string((d + i) % 10) + " ";
      (d % 2 ? a : b) << "{\"text\": \"" << ids << "\", \"id\": " << d << "}\n";
    }
  }
  const std::string tok = " --tokenizer-type NullTokenizer --vocab-size 10 ";
  for (const char* part : {"a", "b"}) {
    ProcessResult r =
        run_omnitron("preprocess --input " + dir + "/" + part + ".jsonl" + tok +
                     "--append-eod --workers 2 --no-progress --output-prefix " + dir + "/" + part);
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  ProcessResult merged = run_omnitron("merge-datasets --input " + dir + "/a_text_document," + dir +
                                      "/b_text_document --output-prefix " + dir + "/ab");
  ASSERT_EQ(merged.exit_code, 0) << merged.output;
  EXPECT_EQ(std::filesystem::file_size(dir + "/ab.bin"),
            std::filesystem::file_size(dir + "/a_text_document.bin") +
                std::filesystem::file_size(dir + "/b_text_document.bin"));

  const std::string data = "--data-path " + dir + "/ab" + tok +
                           "--seq-length 16 --global-batch-size 4 --train-iters 30 ";
  ProcessResult train = run_omnitron(
      "train " + data +
      "--micro-batch-size 4 --num-layers 1 --hidden-size 32 --num-attention-heads 2 --lr 1e-2 "
      "--eval-iters 2 --eval-interval 30 --eod-mask-loss --reset-position-ids "
      "--reset-attention-mask --no-progress");
  ASSERT_EQ(train.exit_code, 0) << train.output;
  EXPECT_NE(train.output.find("NullTokenizer (11 tokens, eod 10)"), std::string::npos)
      << train.output;
  EXPECT_NE(train.output.find("validation loss at iteration 30"), std::string::npos);

  ProcessResult samples = run_omnitron("data-samples " + data + "--print-samples 2");
  ASSERT_EQ(samples.exit_code, 0) << samples.output;
  EXPECT_NE(samples.output.find("\nsample 1 | shuffle_idx -> sample_idx row"), std::string::npos)
      << samples.output;
}

TEST(CliData, PreprocessNamesTheBadLine) {
  const std::string dir = ::testing::TempDir() + "omnitron_cli_bad";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/bad.jsonl") << "{\"text\": \"1 2\"}\n{\"text\": 3}\n";
  ProcessResult r = run_omnitron("preprocess --input " + dir +
                                 "/bad.jsonl --tokenizer-type NullTokenizer --vocab-size 10 "
                                 "--no-progress --output-prefix " +
                                 dir + "/bad");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("bad.jsonl:2"), std::string::npos) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir + "/bad_text_document.idx"));
}

// JSON lines are read as Megatron's preprocess_data.py reads them (a UTF-8 file, json.loads):
// NaN and a later duplicate key are fine; invalid UTF-8 and lone surrogates are refused.
TEST(CliData, PreprocessReadsJsonLinesAsJsonLoadsDoes) {
  const std::string dir = ::testing::TempDir() + "omnitron_cli_json_rules";
  std::filesystem::create_directories(dir);
  auto preprocess = [&](const std::string& name, const std::string& lines) {
    std::ofstream(dir + "/" + name) << lines;
    return run_omnitron("preprocess --input " + dir + "/" + name +
                        " --tokenizer-type NullTokenizer --vocab-size 10 --no-progress "
                        "--output-prefix " +
                        dir + "/out");
  };
  ProcessResult ok = preprocess("ok.jsonl", "{\"n\": NaN, \"text\": 5, \"text\": \"1 2\"}\n");
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  ProcessResult utf8 = preprocess("utf8.jsonl", "{\"text\": \"1\"}\n{\"text\": \"1 \xFF\"}\n");
  EXPECT_EQ(utf8.exit_code, 2) << utf8.output;
  EXPECT_NE(utf8.output.find("utf8.jsonl:2: column 13: invalid UTF-8"), std::string::npos)
      << utf8.output;
  ProcessResult lone = preprocess("lone.jsonl", "{\"text\": \"1\\ud800\"}\n");
  EXPECT_EQ(lone.exit_code, 2) << lone.output;
  EXPECT_NE(lone.output.find("lone.jsonl:1: column 12: lone high surrogate"), std::string::npos)
      << lone.output;
}

}  // namespace

namespace {

TEST(CliConfig, YamlExperimentTrainsAndTheCommandLineWins) {
  const std::string configs = std::string(OMNITRON_FIXTURE_DIR) + "/../../configs";
  const std::string exp = configs + "/examples/tiny_llama_smoke.yaml";
  ProcessResult printed = run_omnitron("train --config " + exp + " --print-config --num-layers 1");
  ASSERT_EQ(printed.exit_code, 0) << printed.output;
  EXPECT_NE(printed.output.find("num_layers: 2  # "), std::string::npos) << printed.output;
  EXPECT_NE(printed.output.find("tiny_llama.yaml"), std::string::npos) << printed.output;
  EXPECT_NE(printed.output.find("--num-layers 1  # command line"), std::string::npos)
      << printed.output;
  ProcessResult r = run_omnitron("train --config " + exp +
                                 " --num-layers 1 --train-iters 2 --eval-iters 0 --no-progress");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("| 1 layers,"), std::string::npos) << r.output;  // CLI over YAML
  EXPECT_NE(r.output.find("RMSNorm"), std::string::npos) << r.output;      // from the model
}

TEST(CliConfig, PrintConfigChecksValuesAsTrainDoes) {
  // --print-config resolves and finalizes the options as train would before printing, so a
  // value train would stop on stops it too, with the same message.
  ProcessResult bad =
      run_omnitron("train --print-config --mock-data --vocab-size 64 --num-layers 0");
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("--num-layers must be at least 1"), std::string::npos) << bad.output;
  ProcessResult refused = run_omnitron(
      "train --print-config --mock-data --vocab-size 64 "
      "--sample-rate 0.5");
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_NE(refused.output.find("--sample-rate 0.5: not built yet: sub-sampling the training data"),
            std::string::npos)
      << refused.output;
  ProcessResult good = run_omnitron(
      "train --print-config --mock-data --vocab-size 64 --use-flash-attn --num-layers 2");
  EXPECT_EQ(good.exit_code, 0) << good.output;
  EXPECT_NE(good.output.find("--num-layers 2  # command line"), std::string::npos) << good.output;
  EXPECT_NE(good.output.find("note: --use-flash-attn has no effect here"), std::string::npos)
      << good.output;
}

TEST(CliConfig, UnknownYamlKeyNamesFileAndClosestOption) {
  const std::string path = ::testing::TempDir() + "omnitron_bad_config.yaml";
  std::ofstream(path) << "num_layer: 2\n";
  ProcessResult r = run_omnitron("train --config " + path);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("num_layers"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("omnitron_bad_config.yaml"), std::string::npos) << r.output;
}

}  // namespace

namespace {

TEST(CliConfig, LauncherEnvironmentSitsBetweenYamlAndTheCommandLine) {
  const std::string exp =
      std::string(OMNITRON_FIXTURE_DIR) + "/../../configs/examples/tiny_llama_smoke.yaml";
  ProcessResult r = run_omnitron("train --config " + exp +
                                 " --print-config --hidden-size 32");  // no launcher: no env
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("# environment"), std::string::npos) << r.output;
  ProcessResult e = run_omnitron_env("OMNITRON_ENV_OVERRIDES=1 NLAYERS=3 HIDDEN=48",
                                     "train --config " + exp +
                                         " --hidden-size 32 --train-iters 1 --eval-iters 0 "
                                         "--no-progress");
  ASSERT_EQ(e.exit_code, 0) << e.output;
  EXPECT_NE(e.output.find("| 3 layers, hidden 32,"), std::string::npos) << e.output;
}

}  // namespace
