// Validation as Megatron's evaluate runs it: --eval-iters iterations of one global batch
// each, read from where the last evaluation stopped (consumed_valid_samples, kept in
// checkpoints). So the validation loss is that of the same samples at every data-parallel
// size, and a resumed run evaluates the samples the uninterrupted one does.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "comm/local_communicator.h"
#include "data/datasets/dataset.h"
#include "train/trainer.h"

namespace omni {
namespace {

namespace fs = std::filesystem;

// Two layers, global batch 4 of micro-batches of 1: four micro-batches a step on one rank,
// two on each of two. A constant learning rate, so a run of 2 steps trains the first 2 of one
// of 4.
std::vector<double> validation_losses(int ranks, const std::vector<std::string>& extra) {
  std::vector<double> losses;
  run_ranks(ranks, [&](Communicator& world) {
    Options o;
    std::vector<std::string> args = {
        "--mock-data", "--vocab-size", "64", "--num-layers", "2", "--hidden-size", "32",
        "--num-attention-heads", "4", "--seq-length", "16", "--micro-batch-size", "1",
        "--global-batch-size", "4", "--eval-iters", "2", "--lr", "3e-3", "--lr-decay-style",
        "constant", "--hidden-dropout",
        "0", "--attention-dropout", "0", "--log-interval", "1", "--no-progress"};
    args.insert(args.end(), extra.begin(), extra.end());
    parse_options(args, o);
    o.data_parallel_size = ranks;
    finalize(o);
    Trainer t(o, make_mock_data(o.model.vocab_size, uint64_t(o.seed)), 0, std::nullopt, &world);
    MetricsSink sink("", false, nullptr);
    const TrainResult r = t.run(sink);
    if (world.rank() == 0)
      for (const auto& [it, loss] : r.val_losses) losses.push_back(loss);
  });
  return losses;
}

TEST(Validation, SameSamplesAtEveryDataParallelSizeAndOnwardFromTheLastEvaluation) {
  const std::vector<std::string> twice = {"--train-iters", "4", "--eval-interval", "2"};
  const std::vector<double> one = validation_losses(1, twice), two = validation_losses(2, twice);
  ASSERT_EQ(one.size(), 2u);
  ASSERT_EQ(two.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    std::printf("evaluation %zu: one rank %.9f, DP 2 %.9f\n", i + 1, one[i], two[i]);
    EXPECT_NEAR(two[i], one[i], 1e-5 * std::abs(one[i])) << "evaluation " << i + 1;
  }

  // The second evaluation read the 8 samples after the first's: an evaluation at the same
  // iteration that is the run's first reads the first 8 (the model is the same: evaluating
  // changes no training state).
  const std::vector<double> once = validation_losses(1, {"--train-iters", "4", "--eval-interval", "4"});
  ASSERT_EQ(once.size(), 1u);
  std::printf("at iteration 4 after an evaluation at 2: %.9f; as the first evaluation: %.9f\n",
              one[1], once[0]);
  EXPECT_GT(std::abs(once[0] - one[1]), 1e-4 * std::abs(one[1]));

  // Saved at iteration 2 (after its evaluation) and resumed: the evaluation at 4 reads what
  // the uninterrupted run's does.
  const std::string dir = ::testing::TempDir() + "omnitron_validation_" + std::to_string(getpid());
  fs::remove_all(dir);
  validation_losses(1, {"--train-iters", "2", "--eval-interval", "2", "--save", dir});
  const std::vector<double> resumed =
      validation_losses(1, {"--train-iters", "4", "--eval-interval", "2", "--load", dir});
  fs::remove_all(dir);
  ASSERT_EQ(resumed.size(), 1u);
  std::printf("resumed at 2, evaluation at 4: %.9f (uninterrupted %.9f)\n", resumed[0], one[1]);
  EXPECT_NEAR(resumed[0], one[1], 1e-6 * std::abs(one[1]));
}

}  // namespace
}  // namespace omni
