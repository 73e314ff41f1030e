// The training loop's contracts: determinism, the metrics file, gradient accumulation.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "base/error.h"
#include "config/options.h"
#include "data/datasets/dataset.h"
#include "train/run_options.h"
#include "train/trainer.h"

namespace {

omni::Options tiny_options(const std::vector<std::string>& extra = {}) {
  omni::Options o;
  std::vector<std::string> args = {
      "--mock-data", "--vocab-size",          "97", "--num-layers", "2",  "--hidden-size",
      "32",          "--num-attention-heads", "4",  "--seq-length", "16", "--micro-batch-size",
      "2",           "--train-iters",         "6",  "--eval-iters", "0",  "--lr",
      "1e-2",        "--log-interval",        "2",  "--no-progress"};
  args.insert(args.end(), extra.begin(), extra.end());
  omni::parse_options(args, o);
  omni::finalize(o);
  return o;
}

omni::TrainResult train(const omni::Options& o, const std::string& metrics = "") {
  omni::Trainer t(o, omni::make_mock_data(o.model.vocab_size, static_cast<uint64_t>(o.seed)));
  omni::Options logging = o;  // the sink logs every --log-interval steps, as the binary's
  logging.metrics_file = metrics;
  omni::MetricsSink sink(logging, nullptr);
  omni::TrainResult r = t.run(sink);
  return r;
}

const std::vector<std::string> kLlama = {"--normalization",
                                         "RMSNorm",
                                         "--swiglu",
                                         "--position-embedding-type",
                                         "rope",
                                         "--disable-bias-linear",
                                         "--group-query-attention",
                                         "--num-query-groups",
                                         "2",
                                         "--untie-embeddings-and-output-weights"};

TEST(Determinism, SameSeedGivesBitIdenticalLossesGpt2) {
  const omni::Options o = tiny_options();
  EXPECT_EQ(train(o).train_losses, train(o).train_losses);
}

TEST(Determinism, SameSeedGivesBitIdenticalLossesLlama) {
  const omni::Options o = tiny_options(kLlama);
  EXPECT_EQ(train(o).train_losses, train(o).train_losses);
}

TEST(Determinism, DifferentSeedsGiveDifferentLosses) {
  std::vector<std::string> seed = {"--seed", "7"};
  EXPECT_NE(train(tiny_options()).train_losses, train(tiny_options(seed)).train_losses);
}

// 100 steps on byte-level text that repeats one sentence. The text is this process's own
// file: three tests train on it, and under ctest -j2 one's rewrite (truncated, then filled)
// was read as 0 bytes by another ("has 0 training bytes", 3 of 300 runs of two loops).
omni::TrainResult train_repetitive(const std::vector<std::string>& extra = {}) {
  const std::string path =
      ::testing::TempDir() + "omnitron_repetitive_" + std::to_string(::getpid()) + ".txt";
  {
    std::ofstream out(path);
    for (int i = 0; i < 400; ++i) out << "the quick brown fox jumps over the lazy dog. ";
  }
  omni::Options o;
  std::vector<std::string> args = {
      "--train-text",          path,  "--num-layers", "2",    "--hidden-size",      "32",
      "--num-attention-heads", "4",   "--seq-length", "32",   "--micro-batch-size", "8",
      "--train-iters",         "100", "--lr",         "1e-2", "--eval-iters",       "2",
      "--eval-interval",       "0",   "--no-progress"};
  args.insert(args.end(), extra.begin(), extra.end());
  omni::parse_options(args, o);
  omni::finalize(o);
  omni::Trainer t(o, omni::make_byte_text_data(path, o.split, o.model.seq_length, 1));
  omni::MetricsSink sink("", false, nullptr);
  omni::TrainResult r = t.run(sink);
  std::filesystem::remove(path);
  return r;
}

TEST(Training, LearnsARepetitiveText) {
  // The loss must fall from ln(256) ~ 5.5 to under 1 nat per byte within 100 steps.
  const omni::TrainResult r = train_repetitive();
  EXPECT_NEAR(r.train_losses.front(), std::log(256.0), 0.2);
  ASSERT_EQ(r.val_losses.size(), 1u);
  EXPECT_LT(r.val_losses.back().second, 1.0);
}

TEST(Training, GradientAccumulationEqualsTheLargerMicroBatch) {
  // Global batch 4 as 2 micro-batches of 2, or as 1 micro-batch of 4: same samples, same
  // mean loss, so the same update up to float rounding.
  omni::TrainResult two = train(tiny_options({"--global-batch-size", "4"}));
  omni::TrainResult one =
      train(tiny_options({"--micro-batch-size", "4", "--global-batch-size", "4"}));
  ASSERT_EQ(two.train_losses.size(), one.train_losses.size());
  for (size_t i = 0; i < one.train_losses.size(); ++i)
    EXPECT_NEAR(two.train_losses[i], one.train_losses[i], 1e-5 * one.train_losses[i]) << i;
}

TEST(Training, DocumentMaskOptionsNeedAnEndOfDocumentToken) {
  const omni::Options o = tiny_options({"--eod-mask-loss"});
  EXPECT_THROW(omni::Trainer(o, omni::make_mock_data(97, 1)), omni::UsageError);
}

TEST(Training, DocumentMasksChangeTheLossWhenSamplesHoldEodTokens) {
  // Mock tokens are uniform in [0, 97): with eod = 5 about 1 in 97 tokens ends a document.
  const omni::Options packed = tiny_options(
      {"--eod-mask-loss", "--reset-position-ids", "--reset-attention-mask", "--seq-length", "64"});
  omni::MetricsSink sink("", false, nullptr);
  omni::Trainer a(packed, omni::make_mock_data(97, 1), 0, 5);
  omni::Trainer b(tiny_options({"--seq-length", "64"}), omni::make_mock_data(97, 1));
  const auto ra = a.run(sink), rb = b.run(sink);
  EXPECT_NE(ra.train_losses, rb.train_losses);
  for (double l : ra.train_losses) EXPECT_TRUE(std::isfinite(l));
}

// Mixed precision on the CPU: bf16 or fp16 parameter values, fp32 master weights.
TEST(MixedPrecision, Bf16TracksTheFp32LossCurve) {
  // Without dropout, as the curves below were measured.
  const std::vector<std::string> no_dropout = {"--hidden-dropout", "0", "--attention-dropout", "0"};
  std::vector<std::string> with_bf16 = no_dropout;
  with_bf16.push_back("--bf16");
  const omni::TrainResult fp32 = train_repetitive(no_dropout), bf16 = train_repetitive(with_bf16);
  ASSERT_EQ(bf16.train_losses.size(), fp32.train_losses.size());
  double worst = 0;
  for (size_t i = 0; i < bf16.train_losses.size(); ++i)
    worst = std::max(worst, std::abs(bf16.train_losses[i] - fp32.train_losses[i]));
  std::printf(
      "bf16 against fp32 over 100 steps: largest loss difference %.3g nats; final "
      "validation %.4f against %.4f\n",
      worst, bf16.val_losses.back().second, fp32.val_losses.back().second);
  // The curves fall steeply together (5.5 to under 0.1 nats), so a slight lag shows as a
  // tenth of a nat mid-way; they end within 0.02 of each other.
  EXPECT_GT(worst, 0.0);  // the parameters really are rounded
  EXPECT_LT(worst, 0.25);
  EXPECT_NEAR(bf16.val_losses.back().second, fp32.val_losses.back().second, 0.02);
}

TEST(MixedPrecision, Fp16SkipsTheOverflowingStepsThenTrains) {
  // The dynamic scale starts at 2^32: fp16 gradients overflow until it has backed off.
  const omni::TrainResult r = train_repetitive({"--fp16"});
  std::printf(
      "fp16 from a loss scale of 2^32: %lld of 100 steps skipped, final validation "
      "%.4f\n",
      (long long)r.skipped_iterations, r.val_losses.back().second);
  EXPECT_GT(r.skipped_iterations, 5);
  EXPECT_LT(r.skipped_iterations, 30);
  EXPECT_LT(r.val_losses.back().second, 1.0);
  const omni::TrainResult fixed = train_repetitive({"--fp16", "--loss-scale", "1024"});
  EXPECT_EQ(fixed.skipped_iterations, 0);
  EXPECT_LT(fixed.val_losses.back().second, 1.0);
}

std::vector<int64_t> evaluated_iterations(const omni::TrainResult& r) {
  std::vector<int64_t> its;
  for (const auto& [it, loss] : r.val_losses) its.push_back(it);
  return its;
}

TEST(Training, StartEvalAtIterLeavesOutTheEarlierEvaluations) {
  const std::vector<std::string> every2 = {"--eval-iters", "1", "--eval-interval", "2"};
  EXPECT_EQ(evaluated_iterations(train(tiny_options(every2))), (std::vector<int64_t>{2, 4, 6}));
  std::vector<std::string> late = every2;
  late.insert(late.end(), {"--start-eval-at-iter", "4"});
  EXPECT_EQ(evaluated_iterations(train(tiny_options(late))), (std::vector<int64_t>{4, 6}));
}

TEST(Training, ANonFiniteGradientStopsTheRunUnlessTheNanCheckIsOff) {
  // A learning rate of 1e38 overflows the logits after the first step.
  const std::vector<std::string> diverging = {"--lr", "1e38", "--clip-grad", "0"};
  EXPECT_THROW(train(tiny_options(diverging)), omni::UsageError);
  std::vector<std::string> unchecked = diverging;
  unchecked.push_back("--no-check-for-nan-in-loss-and-grad");
  EXPECT_EQ(train(tiny_options(unchecked)).train_losses.size(), 6u);
}

TEST(Training, NoSaveOptimWritesAModelOnlyCheckpoint) {
  const std::string dir = ::testing::TempDir() + "omnitron_no_save_optim";
  std::filesystem::remove_all(dir);
  train(tiny_options({"--save", dir, "--no-save-optim"}));
  std::ifstream md(dir + "/iter_0000006/metadata.txt");
  std::string text((std::istreambuf_iterator<char>(md)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("\noptimizer none "), std::string::npos) << text;
  EXPECT_FALSE(std::filesystem::exists(dir + "/iter_0000006/optimizer.bin"));
}

TEST(RunOptions, LoadPutsTheCheckpointsModelUnderTheCommandLineOrOverItWithUseCheckpointArgs) {
  const std::string dir = ::testing::TempDir() + "omnitron_checkpoint_args";
  std::filesystem::remove_all(dir);
  train(tiny_options({"--save", dir}));  // a 2-layer, 32-wide model
  const std::vector<std::string> args = {
      "--load", dir, "--mock-data", "--vocab-size", "97", "--num-layers", "3", "--eval-iters", "0"};
  const omni::RunOptions cli_wins = omni::resolve_run_options(args, 1);
  EXPECT_EQ(cli_wins.opts.model.num_layers, 3);
  EXPECT_EQ(cli_wins.opts.model.hidden_size, 32);  // from the checkpoint
  std::vector<std::string> with_flag = args;
  with_flag.push_back("--use-checkpoint-args");
  EXPECT_EQ(omni::resolve_run_options(with_flag, 1).opts.model.num_layers, 2);
  EXPECT_FALSE(cli_wins.demo);
}

// Every option of every group as command-line text, and the notes: two resolutions agree when
// these do.
static std::vector<std::string> everything(const omni::Options& o) {
  std::vector<std::string> all = o.notes, groups;
  for (const omni::OptionDef& d : omni::option_table())
    if (std::find(groups.begin(), groups.end(), d.group) == groups.end()) {
      groups.push_back(d.group);
      const std::vector<std::string> args = omni::options_as_args(o, d.group);
      all.push_back("[" + d.group + "]");
      all.insert(all.end(), args.begin(), args.end());
    }
  return all;
}

TEST(RunOptions, ACommandLineParsedOnceResolvesAsItsText) {
  // Without a preset, the command line alone is the run's options: parsed and finalized.
  const std::vector<std::string> plain = {
      "--mock-data",      "--vocab-size", "97", "--num-layers", "3", "--lr", "3e-4",
      "--use-flash-attn", "--eval-iters", "0"};
  omni::Options named, alone;
  omni::parse_options(plain, named);
  omni::parse_options(plain, alone);
  omni::finalize(alone);
  const omni::RunOptions once = omni::resolve_run_options(plain, named, 1);
  EXPECT_FALSE(once.demo);
  EXPECT_EQ(everything(once.opts), everything(alone));
  EXPECT_EQ(everything(once.opts), everything(omni::resolve_run_options(plain, 1).opts));
  // Under the demo's preset, which the command line overrides.
  const std::vector<std::string> demo = {"--num-layers", "3", "--use-flash-attn"};
  omni::Options demo_named;
  omni::parse_options(demo, demo_named);
  const omni::RunOptions demo_once = omni::resolve_run_options(demo, demo_named, 1);
  EXPECT_TRUE(demo_once.demo);
  EXPECT_EQ(demo_once.opts.model.num_layers, 3);     // the command line's
  EXPECT_EQ(demo_once.opts.model.hidden_size, 256);  // the demo's
  EXPECT_EQ(everything(demo_once.opts), everything(omni::resolve_run_options(demo, 1).opts));
}

TEST(Metrics, FileHasOneJsonObjectPerLoggedStepWithTheRequiredKeys) {
  const std::string path = ::testing::TempDir() + "omnitron_metrics.jsonl";
  omni::Options o = tiny_options({"--eval-iters", "1", "--eval-interval", "3"});
  train(o, path);
  std::ifstream in(path);
  std::string line;
  int train_lines = 0, val_lines = 0;
  while (std::getline(in, line)) {
    ASSERT_EQ(line.front(), '{');
    ASSERT_EQ(line.back(), '}');
    if (line.find("\"lm_loss\"") != std::string::npos) {
      ++train_lines;
      for (const char* key :
           {"\"iteration\"", "\"lr\"", "\"grad_norm\"", "\"tokens_per_sec\"", "\"tflops\""})
        EXPECT_NE(line.find(key), std::string::npos) << key << " missing in " << line;
    }
    if (line.find("\"val_loss\"") != std::string::npos) ++val_lines;
  }
  EXPECT_EQ(train_lines, 3);  // iterations 2, 4, 6
  EXPECT_EQ(val_lines, 2);    // iterations 3, 6
}

}  // namespace
