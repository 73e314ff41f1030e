// The binary end to end: train on a small text with --save, then generate from it.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "cli/process.h"

namespace {

TEST(CliTrainGenerate, SavedWeightsGenerateTheSameTextTwiceAndResumeTraining) {
  const std::string dir = ::testing::TempDir() + "omnitron_cli_model";
  const std::string text = ::testing::TempDir() + "omnitron_cli_text.txt";
  {
    std::ofstream out(text);
    for (int i = 0; i < 300; ++i) out << "In the beginning was the Word. ";
  }
  const std::string model =
      "--num-layers 1 --hidden-size 32 --num-attention-heads 2 "
      "--seq-length 32 --no-progress ";
  auto [code, out] = run_omnitron("train " + model + "--train-text " + text +
                                  " --micro-batch-size 4 --train-iters 30 --lr 1e-2 --eval-iters 1 "
                                  "--max-new-tokens 20 --save " +
                                  dir);
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("validation loss at iteration 30"), std::string::npos) << out;
  EXPECT_NE(out.find("--- sample"), std::string::npos) << out;

  // The architecture comes from the weights file; the same seed gives the same text.
  const std::string gen =
      "generate --load " + dir + " --prompt 'In the' --max-new-tokens 40 --seed 3";
  auto [c1, g1] = run_omnitron(gen);
  auto [c2, g2] = run_omnitron(gen);
  ASSERT_EQ(c1, 0) << g1;
  EXPECT_EQ(g1.rfind("In the", 0), 0u) << g1;
  EXPECT_EQ(g1.size(), std::string("In the").size() + 40 + 1) << g1;
  EXPECT_EQ(g1, g2);

  // --load --finetune trains on from the saved weights: the first loss is already low.
  auto [c3, resumed] =
      run_omnitron("train --load " + dir + " --finetune --train-text " + text +
                   " --micro-batch-size 4 --train-iters 2 --log-interval 1 --eval-iters 0 "
                   "--max-new-tokens 0 --no-progress");
  ASSERT_EQ(c3, 0) << resumed;
  const size_t at = resumed.find("lm loss: ");
  ASSERT_NE(at, std::string::npos) << resumed;
  EXPECT_LT(std::stod(resumed.substr(at + 9)), 3.0) << resumed;  // untrained: ln 256 = 5.5
}

TEST(CliTrainGenerate, MetricsFileIsWrittenByTheBinary) {
  const std::string path = ::testing::TempDir() + "omnitron_cli_metrics.jsonl";
  auto [code, out] = run_omnitron(
      "train --mock-data --vocab-size 40 --num-layers 1 --hidden-size 16 "
      "--num-attention-heads 2 --seq-length 8 --micro-batch-size 2 "
      "--train-iters 4 --log-interval 2 --eval-iters 1 --eval-interval 4 "
      "--no-progress --metrics-file " +
      path);
  ASSERT_EQ(code, 0) << out;
  std::ifstream in(path);
  std::string line;
  int lines = 0;
  while (std::getline(in, line)) ++lines;
  EXPECT_EQ(lines, 3);  // iterations 2 and 4, and the validation at 4
}

}  // namespace

namespace {

const std::string kTinyMock =
    "train --mock-data --vocab-size 40 --num-layers 1 --hidden-size 16 --num-attention-heads 2 "
    "--seq-length 8 --micro-batch-size 2 --eval-iters 0 --log-interval 1 --no-progress "
    "--max-new-tokens 0 ";

TEST(CliCheckpoints, ExitIntervalSavesAndLoadResumesAtTheNextIteration) {
  const std::string dir = ::testing::TempDir() + "omnitron_cli_ckpt_exit";
  std::filesystem::remove_all(dir);
  auto [c1, first] = run_omnitron(kTinyMock + "--train-iters 6 --exit-interval 3 --save " + dir);
  ASSERT_EQ(c1, 0) << first;
  EXPECT_NE(first.find("stopped early (exit interval)"), std::string::npos) << first;
  EXPECT_TRUE(std::filesystem::is_directory(dir + "/iter_0000003")) << first;
  auto [c2, second] = run_omnitron(kTinyMock + "--train-iters 6 --load " + dir + " --save " + dir);
  ASSERT_EQ(c2, 0) << second;
  EXPECT_NE(second.find("3 iterations (4 to 6)"), std::string::npos) << second;
  std::ifstream latest(dir + "/latest_checkpointed_iteration.txt");
  std::string text;
  latest >> text;
  EXPECT_EQ(text, "6");
  auto [c3, third] = run_omnitron(kTinyMock + "--train-iters 6 --load " + dir);
  ASSERT_EQ(c3, 0) << third;
  EXPECT_NE(third.find("nothing to train: the checkpoint is at iteration 6"), std::string::npos)
      << third;
}

TEST(CliCheckpoints, SigtermWithTheExitSignalHandlerSavesAndExitsCleanly) {
  const std::string dir = ::testing::TempDir() + "omnitron_cli_ckpt_signal";
  const std::string metrics = dir + "_metrics.jsonl";
  std::filesystem::remove_all(dir);
  std::filesystem::remove(metrics);
  // The first metrics line shows the loop is running (the handler is installed by then).
  auto [code, out] = run_omnitron(
      kTinyMock + "--train-iters 100000000 --exit-signal-handler --save " + dir +
      " --metrics-file " + metrics + " & pid=$!; while [ ! -s " + metrics +
      " ] && kill -0 $pid 2>/dev/null; do sleep 0.05; done; kill -TERM $pid; wait $pid");
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("stopped early (signal)"), std::string::npos) << out;
  EXPECT_TRUE(std::filesystem::exists(dir + "/latest_checkpointed_iteration.txt")) << out;
}

// Without --exit-on-missing-checkpoint, Megatron's warning and a fresh start
// (test_cli_first_runs.cpp).
TEST(CliCheckpoints, LoadingAMissingCheckpointWithExitOnMissingNamesTheFile) {
  const std::string dir = ::testing::TempDir() + "omnitron_cli_ckpt_none";
  std::filesystem::remove_all(dir);
  auto [code, out] =
      run_omnitron(kTinyMock + "--train-iters 2 --exit-on-missing-checkpoint --load " + dir);
  EXPECT_NE(code, 0) << out;
  EXPECT_NE(out.find(dir + "/latest_checkpointed_iteration.txt"), std::string::npos) << out;
}

}  // namespace
