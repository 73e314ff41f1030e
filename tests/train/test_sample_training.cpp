// Training with Megatron's sample-based options: the batch ramp changes the number of
// micro-batches during training, consumed samples and the schedule follow each step's batch,
// checkpoints are written where the batch changes and a resumed run continues exactly; and
// --calculate-per-token-loss, and the per-split datasets through the binary.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "cli/process.h"
#include "config/options.h"
#include "data/datasets/dataset.h"
#include "data/datasets/indexed_dataset.h"
#include "train/trainer.h"

namespace {

omni::Options options(const std::vector<std::string>& extra) {
  std::vector<std::string> args = {
      "--mock-data", "--vocab-size",          "97",  "--num-layers",
      "2",           "--hidden-size",         "32",  "--seq-length",
      "16",          "--num-attention-heads", "4",   "--micro-batch-size",
      "2",           "--eval-iters",          "0",   "--lr",
      "1e-2",        "--log-interval",        "100", "--no-progress"};
  args.insert(args.end(), extra.begin(), extra.end());
  omni::Options o;
  omni::parse_options(args, o);
  omni::finalize(o);
  return o;
}

// Ramp 2 -> 8 by 2 over 12 samples (3 increments of 4): steps of 2, 2, 4, 6 samples (the
// ramp ends once past 12 consumed), then 8s: (40 - 14) // 8 = 3 more, 7 in all, 38 samples.
const std::vector<std::string> kRamp = {
    "--train-samples", "40", "--global-batch-size", "8", "--rampup-batch-size", "2", "2", "12"};

TEST(BatchRampupTraining, StepsFollowTheRampAndSaveWhereTheBatchChanges) {
  const std::string dir = ::testing::TempDir() + "omnitron_rampup_saves";
  std::filesystem::remove_all(dir);
  std::vector<std::string> args = kRamp;
  args.insert(args.end(), {"--save", dir});
  const omni::Options o = options(args);
  EXPECT_EQ(o.train_iters, 7);
  omni::Trainer t(o, omni::make_mock_data(97, 1));
  omni::MetricsSink sink("", false, nullptr);
  const omni::TrainResult r = t.run(sink);
  EXPECT_EQ(r.train_losses.size(), 7u);
  EXPECT_EQ(t.consumed_samples(), 38);
  // Megatron saves before each step whose number of micro-batches differs from the last
  // step's: before steps 3 (4 samples), 4 (6) and 5 (8); and at the end.
  std::vector<std::string> names;
  for (const std::string& s : r.saved) names.push_back(std::filesystem::path(s).filename());
  EXPECT_EQ(names, (std::vector<std::string>{"iter_0000002", "iter_0000003", "iter_0000004",
                                             "iter_0000007"}));
  // The schedule's position in samples is stored with the checkpoint.
  const std::string md = read_text(dir + "/iter_0000004/metadata.txt");
  EXPECT_NE(md.find("\nconsumed_samples 14\n"), std::string::npos) << md;
  EXPECT_NE(md.find("\nlr_schedule_samples 14\n"), std::string::npos) << md;
}

TEST(BatchRampupTraining, AResumedRunContinuesTheRampExactly) {
  const std::string dir = ::testing::TempDir() + "omnitron_rampup_resume";
  std::filesystem::remove_all(dir);
  std::vector<std::string> schedule = kRamp;
  schedule.insert(schedule.end(), {"--lr-warmup-samples", "10", "--lr-decay-style", "cosine"});
  omni::MetricsSink sink("", false, nullptr);
  const omni::Options whole_opts = options(schedule);
  omni::Trainer whole(whole_opts, omni::make_mock_data(97, 1));
  const omni::TrainResult all = whole.run(sink);

  std::vector<std::string> first = schedule;
  first.insert(first.end(), {"--save", dir, "--exit-interval", "3"});
  omni::Trainer a(options(first), omni::make_mock_data(97, 1));
  EXPECT_EQ(a.run(sink).train_losses.size(), 3u);
  std::vector<std::string> second = schedule;
  second.insert(second.end(), {"--load", dir});
  omni::Trainer b(options(second), omni::make_mock_data(97, 1));
  EXPECT_EQ(b.consumed_samples(), 8);  // 2 + 2 + 4
  const omni::TrainResult rest = b.run(sink);
  ASSERT_EQ(rest.train_losses.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(rest.train_losses[i], all.train_losses[3 + i]) << i;
  EXPECT_EQ(b.consumed_samples(), 38);
}

// --eod-mask-loss leaves micro-batches with different numbers of loss tokens (mock tokens
// are uniform in [0, 97) and 5 ends a document): the per-token loss of two micro-batches of 2
// is the loss of one micro-batch of 4, the mean of their means is not.
TEST(PerTokenLoss, GradientAccumulationEqualsOneLargeMicroBatchUnderAMask) {
  auto run = [](const std::vector<std::string>& extra) {
    std::vector<std::string> args = {
        "--train-iters", "6", "--seq-length", "64", "--eod-mask-loss", "--global-batch-size", "4"};
    args.insert(args.end(), extra.begin(), extra.end());
    omni::Trainer t(options(args), omni::make_mock_data(97, 1), 0, 5);
    omni::MetricsSink sink("", false, nullptr);
    return t.run(sink).train_losses;
  };
  const auto two = run({"--calculate-per-token-loss"});
  const auto one = run({"--calculate-per-token-loss", "--micro-batch-size", "4"});
  const auto means = run({});
  ASSERT_EQ(two.size(), 6u);
  double worst_means = 0;
  for (size_t i = 0; i < two.size(); ++i) {
    EXPECT_NEAR(two[i], one[i], 1e-5 * one[i]) << i;
    worst_means = std::max(worst_means, std::abs(means[i] - one[i]));
  }
  EXPECT_GT(worst_means, 1e-4);  // the flag changes the result
}

TEST(SampleBasedTrainingCli, TheRampShowsInTheLogAndPrimusLlamaRopeKeysMeanWhatMegatronsDo) {
  const std::string common =
      "train --mock-data --vocab-size 97 --num-layers 1 --hidden-size 16 --num-attention-heads 2 "
      "--seq-length 16 --micro-batch-size 2 --eval-iters 0 --log-interval 1 --no-progress "
      "--device cpu --position-embedding-type rope ";
  // Primus's llama_base.yaml: rotary_scaling_factor 40 and add_position_embedding false.
  const ProcessResult r =
      run_omnitron(common +
                   "--global-batch-size 8 --train-samples 40 --rampup-batch-size 2 2 12 "
                   "--rotary-scaling-factor 40 --no-position-embedding");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("batch ramp: 2 to 8 by 2 over the first 12 samples"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find(" 7 iterations"), std::string::npos) << r.output;
  for (const char* logged : {"consumed samples:            2 ", "global batch size:     2 |",
                             "consumed samples:            8 ", "global batch size:     4 |",
                             "consumed samples:           38 ", "global batch size:     8 |"})
    EXPECT_NE(r.output.find(logged), std::string::npos) << logged << "\n" << r.output;
  EXPECT_NE(r.output.find("note: --rotary-scaling-factor has no effect here"), std::string::npos)
      << r.output;
  // Megatron refuses the deprecated switch where it would drop a learned position table.
  const ProcessResult learned =
      run_omnitron(common + "--position-embedding-type learned_absolute --no-position-embedding");
  EXPECT_NE(learned.exit_code, 0);
  EXPECT_NE(learned.output.find("--no-position-embedding is deprecated"), std::string::npos)
      << learned.output;
}

// A corpus of `docs` documents of cyclic tokens.
std::string write_dataset(const std::string& name, int docs) {
  const std::string prefix = ::testing::TempDir() + name;
  omni::IndexedDatasetWriter w(prefix, omni::IndexedDtype::kUInt16);
  for (int d = 0; d < docs; ++d) {
    std::vector<int32_t> doc(30 + d % 7);
    for (size_t i = 0; i < doc.size(); ++i) doc[i] = static_cast<int32_t>((d + i) % 10);
    w.add_document(doc);
  }
  w.finalize();
  return prefix;
}

TEST(PerSplitData, TrainAndValidationDataPathsTrainWithTheirOwnDatasetsAndCacheWhereAsked) {
  const std::string train = write_dataset("omnitron_split_train", 30);
  const std::string valid = write_dataset("omnitron_split_valid", 8);
  const std::string cache = ::testing::TempDir() + "omnitron_split_cache";
  std::filesystem::remove_all(cache);
  const std::string common =
      " --vocab-size 10 --num-layers 1 --hidden-size 16 --num-attention-heads 2 --seq-length 16 "
      "--micro-batch-size 2 --train-samples 8 --eval-iters 1 --eval-interval 2 --no-progress "
      "--device cpu";
  const ProcessResult r =
      run_omnitron("train --train-data-path " + train + " --valid-data-path 1 " + valid +
                   " --test-data-path " + valid + " --data-cache-path " + cache + common);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("data: " + train + " (validation: " + valid + "): Megatron indexed data"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("--test-data-path"), std::string::npos) << r.output;  // its note
  int cached = 0;
  for (const auto& e : std::filesystem::directory_iterator(cache))
    cached += e.path().extension() == ".gptidx";
  EXPECT_EQ(cached, 2);  // train and validation indices, in --data-cache-path
  // Not with --data-path, and training needs --train-data-path.
  EXPECT_NE(run_omnitron("train --data-path " + train + " --train-data-path " + train + common)
                .output.find("choose one data source"),
            std::string::npos);
  EXPECT_NE(run_omnitron("train --valid-data-path " + valid + common)
                .output.find("need --train-data-path"),
            std::string::npos);
}

// Megatron's blend_per_split uses each dataset whole: the training samples are those of
// --data-path with --split 1,0,0 (and the validation ones those of the other dataset whole).
TEST(PerSplitData, EachSplitIsItsDatasetsWhole) {
  const std::string train = write_dataset("omnitron_whole_train", 30);
  const std::string valid = write_dataset("omnitron_whole_valid", 8);
  omni::DataBlend t{{{1.0, train}}, false}, v{{{1.0, valid}}, false};
  const auto per_split = omni::make_megatron_data(t, v, 16, 1234, 40, 8);
  const auto whole_train = omni::make_megatron_data(t.prefixes, false, "1,0,0", 16, 1234, 40, 0);
  const auto whole_valid = omni::make_megatron_data(v.prefixes, false, "0,1,0", 16, 1234, 0, 8);
  std::vector<int32_t> a(16 * 40), b(16 * 40), la(a.size()), lb(b.size());
  per_split->train_samples(0, 40, 16, a.data(), la.data());
  whole_train->train_samples(0, 40, 16, b.data(), lb.data());
  EXPECT_EQ(a, b);
  per_split->valid_samples(0, 8, 16, a.data(), la.data());
  whole_valid->valid_samples(0, 8, 16, b.data(), lb.data());
  EXPECT_EQ(std::vector<int32_t>(a.begin(), a.begin() + 128),
            std::vector<int32_t>(b.begin(), b.begin() + 128));
}

}  // namespace
