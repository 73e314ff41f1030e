// Primus's keys that change a run, on a tiny model: disable_last_saving (no checkpoint at
// the end of training) and auto_continue_train (resume from the save folder when it holds a
// checkpoint), as Primus's Megatron trainer does them.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "config/options.h"
#include "data/datasets/dataset.h"
#include "train/run_options.h"
#include "train/trainer.h"

namespace omni {
namespace {

namespace fs = std::filesystem;

std::string fresh_dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "omnitron_primus_run_" + name;
  fs::remove_all(dir);
  return dir;
}

Options tiny(std::vector<std::string> extra) {
  std::vector<std::string> args = {
      "--mock-data", "--vocab-size",          "64", "--num-layers", "1",   "--hidden-size",
      "16",          "--num-attention-heads", "2",  "--seq-length", "8",   "--micro-batch-size",
      "2",           "--eval-iters",          "0",  "--lr",         "1e-3"};
  args.insert(args.end(), extra.begin(), extra.end());
  return resolve_run_options(args, 1).opts;
}

TrainResult train(const Options& o) {
  Trainer t(o, make_mock_data(o.model.vocab_size, static_cast<uint64_t>(o.seed)));
  MetricsSink sink("", false, nullptr);
  return t.run(sink);
}

TEST(PrimusRun, DisableLastSavingSkipsOnlyTheFinalSave) {
  const std::string dir = fresh_dir("last_saving");
  const TrainResult r = train(
      tiny({"--train-iters", "4", "--save", dir, "--save-interval", "3", "--disable-last-saving"}));
  ASSERT_EQ(r.saved.size(), 1u);  // the interval's, at 3; none at 4
  EXPECT_EQ(latest_checkpoint_iteration(dir), 3);
  const std::string without = fresh_dir("last_saving_default");
  EXPECT_EQ(
      train(tiny({"--train-iters", "4", "--save", without, "--save-interval", "3"})).saved.size(),
      2u);
  EXPECT_EQ(latest_checkpoint_iteration(without), 4);
}

TEST(PrimusRun, AutoContinueTrainResumesFromTheSaveFolderWhenItHoldsACheckpoint) {
  const std::string dir = fresh_dir("auto_continue");
  const std::vector<std::string> run = {
      "--train-iters",         "4",          "--save",         dir,
      "--auto-continue-train", "--finetune", "--no-load-optim"};
  // Nothing saved yet: a fresh start.
  const Options first = tiny(run);
  EXPECT_EQ(first.load, "");
  train(tiny({"--train-iters", "2", "--save", dir}));
  // Now the run resumes there, with the optimizer, as Primus sets load, finetune,
  // no_load_optim and use_checkpoint_args.
  const Options again = tiny(run);
  EXPECT_EQ(again.load, dir);
  EXPECT_FALSE(again.finetune);
  EXPECT_FALSE(again.no_load_optim);
  EXPECT_TRUE(again.use_checkpoint_args);
  const TrainResult r = train(again);
  EXPECT_EQ(r.first_iteration, 3);
  EXPECT_EQ(r.last_iteration, 4);
}

}  // namespace
}  // namespace omni
