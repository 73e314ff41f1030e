// Checkpoints (issue 4 item 3): Megatron's layout, exact resume, the load/exit flags and
// clean errors for missing, truncated and mismatched checkpoints.
#include <gtest/gtest.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "base/error.h"
#include "checkpoint/checkpoint.h"
#include "cli/process.h"
#include "config/options.h"
#include "data/datasets/dataset.h"
#include "train/trainer.h"

namespace {

namespace fs = std::filesystem;

std::string fresh_dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "omnitron_ckpt_" + name;
  fs::remove_all(dir);
  return dir;
}

// Gradient accumulation (global batch 4 of micro-batches of 2), a warm-up and a cosine
// decay over 10 steps, so the schedule's position matters too.
omni::Options options(const std::vector<std::string>& extra) {
  omni::Options o;
  std::vector<std::string> args = {"--mock-data", "--vocab-size",
                                   "97",          "--num-layers",
                                   "2",           "--hidden-size",
                                   "32",          "--num-attention-heads",
                                   "4",           "--seq-length",
                                   "16",          "--micro-batch-size",
                                   "2",           "--global-batch-size",
                                   "4",           "--train-iters",
                                   "10",          "--eval-iters",
                                   "0",           "--lr",
                                   "1e-2",        "--min-lr",
                                   "1e-3",        "--lr-decay-style",
                                   "cosine",      "--lr-warmup-iters",
                                   "2",           "--log-interval",
                                   "5",           "--no-progress"};
  args.insert(args.end(), extra.begin(), extra.end());
  omni::parse_options(args, o);
  omni::finalize(o);
  return o;
}

struct TrainedRun {
  omni::TrainResult result;
  std::vector<float> params;
};

TrainedRun train(const omni::Options& o) {
  omni::Trainer t(o, omni::make_mock_data(o.model.vocab_size, static_cast<uint64_t>(o.seed)));
  omni::MetricsSink sink("", false, nullptr);
  TrainedRun r{t.run(sink), {}};
  const auto& p = t.model().params();
  r.params.assign(p.values(), p.values() + p.size());
  return r;
}


// Ten steps straight, or six (saved at 6 and stopped there, as a killed run) and then a
// new Trainer that --loads and runs 7..10: the same losses and parameters, bit for bit.
void expect_exact_resume(const std::vector<std::string>& optimizer, const std::string& name) {
  const std::string dir = fresh_dir(name);
  const TrainedRun straight = train(options(optimizer));

  std::vector<std::string> first = optimizer;
  first.insert(first.end(), {"--save", dir, "--save-interval", "6", "--exit-interval", "6"});
  const TrainedRun interrupted = train(options(first));
  ASSERT_EQ(interrupted.result.train_losses.size(), 6u);
  EXPECT_EQ(interrupted.result.exit_reason, "exit interval");
  EXPECT_EQ(read_text(omni::latest_iteration_file(dir)), "6");

  std::vector<std::string> second = optimizer;
  second.insert(second.end(), {"--load", dir});
  const TrainedRun resumed = train(options(second));
  EXPECT_EQ(resumed.result.first_iteration, 7);
  ASSERT_EQ(resumed.result.train_losses.size(), 4u);
  for (size_t i = 0; i < 4; ++i)
    EXPECT_EQ(resumed.result.train_losses[i], straight.result.train_losses[6 + i])
        << "iteration " << 7 + i;
  for (size_t i = 0; i < 6; ++i)
    EXPECT_EQ(interrupted.result.train_losses[i], straight.result.train_losses[i]);
  ASSERT_EQ(resumed.params.size(), straight.params.size());
  EXPECT_EQ(std::memcmp(resumed.params.data(), straight.params.data(),
                        straight.params.size() * sizeof(float)),
            0);
}

TEST(CheckpointResume, AdamWWithAccumulationIsBitIdenticalToTheUninterruptedRun) {
  expect_exact_resume({"--optimizer", "adamw"}, "resume_adamw");
}

TEST(CheckpointResume, SGDWithMomentumAndAccumulationIsBitIdenticalToTheUninterruptedRun) {
  expect_exact_resume({"--optimizer", "sgd", "--lr", "5e-2"}, "resume_sgd");
}

TEST(CheckpointResume, TheDistributedOptimizerOnOneRankIsBitIdenticalToo) {
  expect_exact_resume({"--optimizer", "adamw", "--use-distributed-optimizer"}, "resume_distopt");
}

// Dropout's masks are a function of (seed, iteration, layer, sample, element): a resumed run
// draws the uninterrupted run's, with no RNG state in the checkpoint.
TEST(CheckpointResume, DropoutIsBitIdenticalToo) {
  const std::vector<std::string> dropout = {
      "--optimizer", "adamw", "--hidden-dropout", "0.1", "--attention-dropout", "0.1"};
  expect_exact_resume(dropout, "resume_dropout");
  // ... and dropout was on: the losses differ from the run without it.
  EXPECT_NE(
      train(options(dropout)).result.train_losses,
      train(options({"--optimizer", "adamw", "--hidden-dropout", "0", "--attention-dropout", "0"}))
          .result.train_losses);
}

TEST(CheckpointResume, Fp16WithItsLossScalerIsBitIdenticalToo) {
  // From 2^32 the first steps overflow and are skipped; a short window grows it again.
  expect_exact_resume({"--optimizer", "adamw", "--fp16", "--loss-scale-window", "2"},
                      "resume_fp16");
}

TEST(CheckpointLayout, MegatronDirectoriesAndSelfDescribingTensors) {
  const std::string dir = fresh_dir("layout");
  const TrainedRun r =
      train(options({"--train-iters", "4", "--save", dir, "--save-interval", "2"}));
  ASSERT_EQ(r.result.saved.size(), 2u);  // 2 and 4 (the end is not saved twice)
  EXPECT_TRUE(fs::is_directory(dir + "/iter_0000002"));
  EXPECT_TRUE(fs::is_directory(dir + "/iter_0000004"));
  EXPECT_FALSE(fs::exists(dir + "/iter_0000004.tmp"));
  EXPECT_EQ(read_text(dir + "/latest_checkpointed_iteration.txt"), "4");
  const std::string md = read_text(dir + "/iter_0000004/metadata.txt");
  EXPECT_EQ(md.rfind("omnitron-checkpoint 2\n", 0), 0u) << md;
  EXPECT_NE(md.find("\niteration 4\n"), std::string::npos) << md;
  EXPECT_NE(md.find("\nconsumed_samples 16\n"), std::string::npos) << md;
  EXPECT_NE(md.find("\noptimizer adamw 4\n"), std::string::npos) << md;
  EXPECT_NE(md.find("\n--hidden-size\n32\n"), std::string::npos) << md;
  // One rank: every tensor whole, in one shard of model.bin and of optimizer.bin.
  EXPECT_NE(md.find("\nshard embedding.word_embeddings.weight model.bin 0 float32 global 128,32 "
                    "offset 0,0 shape 128,32 elements 0 4096 crc32 "),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("\nshard optimizer.exp_avg_sq.embedding.word_embeddings.weight optimizer.bin "),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("\nfile model.bin bytes "), std::string::npos) << md;
  EXPECT_TRUE(md.size() > 4 && md.substr(md.size() - 4) == "end\n");
}

TEST(CheckpointLayout, AnInterruptedSaveLeavesThePreviousCheckpointLatest) {
  const std::string dir = fresh_dir("interrupted");
  train(options({"--train-iters", "2", "--save", dir}));
  // What a crash in the middle of saving iteration 4 leaves behind.
  fs::create_directories(dir + "/iter_0000004.tmp");
  std::ofstream(dir + "/iter_0000004.tmp/model.bin") << "partial";
  EXPECT_EQ(omni::latest_checkpoint_iteration(dir), 2);
  const TrainedRun resumed = train(options({"--train-iters", "3", "--load", dir}));
  EXPECT_EQ(resumed.result.first_iteration, 3);
}

TEST(CheckpointLoad, FinetuneLoadsTheModelOnlyAndStartsAtIterationZero) {
  const std::string dir = fresh_dir("finetune");
  const TrainedRun saved = train(options({"--train-iters", "3", "--save", dir}));
  omni::Options o = options({"--train-iters", "3", "--load", dir, "--finetune"});
  omni::Trainer t(o, omni::make_mock_data(97, static_cast<uint64_t>(o.seed)));
  EXPECT_EQ(t.iteration(), 0);
  EXPECT_EQ(t.consumed_samples(), 0);
  const auto& p = t.model().params();
  EXPECT_EQ(std::memcmp(p.values(), saved.params.data(), saved.params.size() * sizeof(float)), 0);
  omni::MetricsSink sink("", false, nullptr);
  EXPECT_EQ(t.run(sink).train_losses.size(), 3u);
}

TEST(CheckpointLoad, NoLoadOptimKeepsThePositionButRestartsTheOptimizer) {
  const std::string dir = fresh_dir("no_load_optim");
  train(options({"--train-iters", "10", "--save", dir, "--exit-interval", "6"}));
  const TrainedRun with_optim = train(options({"--load", dir}));
  const TrainedRun without = train(options({"--load", dir, "--no-load-optim", "--no-load-rng"}));
  EXPECT_EQ(without.result.first_iteration, 7);
  EXPECT_EQ(with_optim.result.train_losses.front(), without.result.train_losses.front());
  EXPECT_NE(with_optim.result.train_losses.back(), without.result.train_losses.back());
}

TEST(CheckpointExit, SigtermFinishesTheStepSavesAndStops) {
  const std::string dir = fresh_dir("signal");
  omni::Options o = options({"--save", dir, "--exit-signal-handler"});
  omni::Trainer t(o, omni::make_mock_data(97, static_cast<uint64_t>(o.seed)));
  std::raise(SIGTERM);  // caught: only recorded
  omni::MetricsSink sink("", false, nullptr);
  const omni::TrainResult r = t.run(sink);
  EXPECT_EQ(r.exit_reason, "signal");
  EXPECT_EQ(r.train_losses.size(), 1u);
  EXPECT_EQ(omni::latest_checkpoint_iteration(dir), 1);
}

TEST(CheckpointExit, ExitDurationStopsAfterTheStepThatPassesIt) {
  const omni::Options o = options({"--exit-duration-in-mins", "1e-9"});
  const TrainedRun r = train(o);
  EXPECT_EQ(r.result.exit_reason, "exit duration");
  EXPECT_EQ(r.result.train_losses.size(), 1u);
}

// Each error must name the file (and for tensors the tensor and both shapes).
template <typename F>
std::string usage_error(F f) {
  try {
    f();
  } catch (const omni::UsageError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no UsageError";
  return "";
}

TEST(CheckpointErrors, AMissingCheckpointNamesTheTrackerFile) {
  const std::string dir = fresh_dir("missing");
  const std::string msg = usage_error([&] { train(options({"--load", dir})); });
  EXPECT_NE(msg.find(dir + "/latest_checkpointed_iteration.txt"), std::string::npos) << msg;
}

TEST(CheckpointErrors, ATrackerNamingAMissingIterationNamesTheMetadataFile) {
  const std::string dir = fresh_dir("missing_iter");
  fs::create_directories(dir);
  std::ofstream(dir + "/latest_checkpointed_iteration.txt") << "7";
  const std::string msg = usage_error([&] { train(options({"--load", dir})); });
  EXPECT_NE(msg.find(dir + "/iter_0000007/metadata.txt"), std::string::npos) << msg;
}

TEST(CheckpointErrors, ATruncatedModelFileNamesTheFileAndTheTensor) {
  const std::string dir = fresh_dir("truncated");
  train(options({"--train-iters", "1", "--save", dir}));
  const std::string bin = dir + "/iter_0000001/model.bin";
  fs::resize_file(bin, fs::file_size(bin) / 2);
  const std::string msg = usage_error([&] { train(options({"--load", dir})); });
  EXPECT_NE(msg.find(bin), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
  EXPECT_NE(msg.find("tensor "), std::string::npos) << msg;
}

TEST(CheckpointErrors, ACorruptedByteIsCaughtByTheChecksum) {
  const std::string dir = fresh_dir("corrupted");
  train(options({"--train-iters", "1", "--save", dir}));
  const std::string bin = dir + "/iter_0000001/optimizer.bin";
  {
    std::fstream f(bin, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(1000);
    const char c = char(f.get());
    f.seekp(1000);
    f.put(char(c ^ 0x40));  // one flipped bit
  }
  const std::string msg = usage_error([&] { train(options({"--load", dir})); });
  EXPECT_NE(msg.find(bin), std::string::npos) << msg;
  EXPECT_NE(msg.find("corrupted"), std::string::npos) << msg;
  EXPECT_NE(msg.find("tensor optimizer."), std::string::npos) << msg;  // the shard's tensor
}

TEST(CheckpointErrors, TruncatedMetadataIsReported) {
  const std::string dir = fresh_dir("truncated_md");
  train(options({"--train-iters", "1", "--save", dir}));
  const std::string md = dir + "/iter_0000001/metadata.txt";
  fs::resize_file(md, fs::file_size(md) - 10);
  const std::string msg = usage_error([&] { train(options({"--load", dir})); });
  EXPECT_NE(msg.find(md), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
}

TEST(CheckpointErrors, ADifferentModelShapeNamesTheTensorAndBothShapes) {
  const std::string dir = fresh_dir("mismatch");
  train(options({"--train-iters", "1", "--save", dir}));
  const std::string msg = usage_error([&] {
    train(options({"--hidden-size", "48", "--load", dir}));
  });
  EXPECT_NE(msg.find(dir + "/iter_0000001/metadata.txt"), std::string::npos) << msg;
  EXPECT_NE(msg.find("embedding.word_embeddings.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[128,32]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[128,48]"), std::string::npos) << msg;
}

TEST(CheckpointErrors, AnotherOptimizerNeedsNoLoadOptim) {
  const std::string dir = fresh_dir("other_optimizer");
  train(options({"--train-iters", "1", "--save", dir}));
  const std::string msg = usage_error([&] {
    train(options({"--optimizer", "sgd", "--load", dir}));
  });
  EXPECT_NE(msg.find("--no-load-optim"), std::string::npos) << msg;
}

TEST(CheckpointLoad, ModelOptionsComeFromTheCheckpoint) {
  const std::string dir = fresh_dir("model_options");
  train(options({"--train-iters", "1", "--save", dir, "--swiglu"}));
  omni::Options o;
  omni::load_checkpoint_model_options(dir, o);
  EXPECT_EQ(o.model.hidden_size, 32);
  EXPECT_EQ(o.model.num_layers, 2);
  EXPECT_TRUE(o.model.swiglu);
  EXPECT_EQ(o.model.vocab_size, 97);
}

// Megatron's default GELU (erf) and --openai-gelu's tanh each come back as saved.
TEST(CheckpointLoad, TheGeluFormComesFromTheCheckpoint) {
  for (bool openai_gelu : {false, true}) {
    const std::string dir = fresh_dir(openai_gelu ? "gelu_tanh" : "gelu_erf");
    std::vector<std::string> extra = {"--train-iters", "1", "--save", dir};
    if (openai_gelu) extra.push_back("--openai-gelu");
    train(options(extra));
    EXPECT_NE(read_text(dir + "/iter_0000001/metadata.txt")
                  .find(openai_gelu ? "\ngelu tanh\n" : "\ngelu erf\n"),
              std::string::npos);
    omni::Options o;
    omni::load_checkpoint_model_options(dir, o);
    EXPECT_EQ(o.model.openai_gelu, openai_gelu);
  }
}

// omnitron's GELU was always tanh before erf became the default, and those checkpoints have
// neither a "gelu" line nor --openai-gelu among their options (the flag stored nothing then):
// they keep loading (and resuming) as tanh.
TEST(CheckpointLoad, ACheckpointWithoutAGeluLineIsTanhAsSavedBeforeErfGelu) {
  const std::string dir = fresh_dir("gelu_before_erf");
  train(options({"--train-iters", "1", "--save", dir}));
  const std::string md_path = dir + "/iter_0000001/metadata.txt";
  std::string md = read_text(md_path);
  const size_t line = md.find("\ngelu erf\n");
  ASSERT_NE(line, std::string::npos);
  md.erase(line, std::string("\ngelu erf").size());
  ASSERT_EQ(md.find("--openai-gelu"), std::string::npos);
  std::ofstream(md_path, std::ios::trunc) << md;
  omni::Options o;
  omni::load_checkpoint_model_options(dir, o);
  EXPECT_TRUE(o.model.openai_gelu);
  const std::vector<std::string> args = omni::checkpoint_model_args(dir);
  EXPECT_NE(std::find(args.begin(), args.end(), "--openai-gelu"), args.end());
}

}  // namespace
