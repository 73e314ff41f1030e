// The binary end to end: train on a small text with --save, then generate from it.
#include <gtest/gtest.h>

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

  // --load continues training from the saved weights: the first loss is already low.
  auto [c3, resumed] =
      run_omnitron("train --load " + dir + " --train-text " + text +
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
