// Megatron's sample-based training: --train-samples, the --lr-*-samples schedule and
// --rampup-batch-size, against values computed by hand from Megatron's formulas
// (get_optimizer_param_scheduler, OptimizerParamScheduler.get_lr, update_train_iters and
// RampupBatchsizeNumMicroBatchesCalculator).
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "config/config_test_helpers.h"
#include "config/options.h"
#include "optim/batch_schedule.h"
#include "optim/lr_schedule.h"

namespace omni {
namespace {

Options finalized(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> args;
  for (std::string w; in >> w;) args.push_back(w);
  Options o;
  parse_options(args, o);  // byte-level text (the demo corpus's vocabulary), never opened
  finalize(o);
  return o;
}

// The doc example of Megatron's --rampup-batch-size: 16 8 300000 up to 1024 is 126
// increments of 300000 / 126 = 2380.95... samples each.
TEST(BatchRampup, GrowsByTheIncrementEveryRampSamplesOverIncrements) {
  const BatchSchedule b{.global_batch_size = 1024,
                        .rampup_start = 16,
                        .rampup_increment = 8,
                        .rampup_samples = 300000};
  EXPECT_EQ(b.batch_at(0), 16);
  EXPECT_EQ(b.batch_at(2380), 16);  // 2380 / 2380.95 = 0.9996
  EXPECT_EQ(b.batch_at(2381), 24);  // 1.00002 increments
  EXPECT_EQ(b.batch_at(150000), 16 + 63 * 8);
  EXPECT_EQ(b.batch_at(300000), 1024);  // 126 increments: still "in" the ramp, at the top
  EXPECT_EQ(b.batch_at(300001), 1024);
  const BatchSchedule constant{.global_batch_size = 64};
  EXPECT_EQ(constant.batch_at(0), 64);
  EXPECT_EQ(constant.iterations_for(1000), 15);  // 1000 // 64
}

// Ramp 8 -> 32 by 8 over 30 samples: 3 increments of 10 samples. Steps: 8 (at 0), 8 (at 8),
// 16 (at 16), then 32 (at 32 > 30) ...
TEST(BatchRampup, IterationsAreMegatronsUpdateTrainIters) {
  const BatchSchedule b{
      .global_batch_size = 32, .rampup_start = 8, .rampup_increment = 8, .rampup_samples = 30};
  EXPECT_EQ(b.batch_at(8), 8);
  EXPECT_EQ(b.batch_at(16), 16);
  EXPECT_EQ(b.batch_at(30), 32);  // int(30 / 10) = 3 increments
  // Ramp phase: 0 -> 8 -> 16 -> 32 (3 steps, stops once past 30); then (100 - 32) // 32 = 2.
  EXPECT_EQ(b.iterations_for(100), 5);
  EXPECT_EQ(b.samples_after(5), 96);
  EXPECT_EQ(b.samples_after(2), 16);
  // Ending inside the ramp: Megatron's loop still takes the step that crosses train_samples.
  EXPECT_EQ(b.iterations_for(20), 3);
}

TEST(SampleBasedTraining, TrainSamplesSetTheIterationsAndTheScheduleInSamples) {
  const Options o = finalized(
      "--train-samples 1000 --micro-batch-size 2 --global-batch-size 10 --lr 1 --min-lr 0.1 "
      "--lr-decay-style linear --lr-warmup-samples 100 --lr-decay-samples 600");
  EXPECT_EQ(o.train_iters, 100);
  EXPECT_EQ(o.train_samples(), 1000);
  const LRScheduleConfig& s = o.lr_schedule;
  EXPECT_DOUBLE_EQ(s.warmup_steps, 100);
  EXPECT_EQ(s.decay_steps, 600);
  EXPECT_DOUBLE_EQ(learning_rate(s, 50), 0.5);                     // warm-up: 50 / 100
  EXPECT_DOUBLE_EQ(learning_rate(s, 350), 0.1 + 0.9 * (1 - 0.5));  // (350-100)/(600-100)
  EXPECT_DOUBLE_EQ(learning_rate(s, 601), 0.1);                    // past the decay
  // Without --lr-decay-samples the decay ends at --train-samples.
  EXPECT_EQ(finalized("--train-samples 1000 --global-batch-size 10").lr_schedule.decay_steps, 1000);
  // --lr-warmup-fraction is of the decay samples (not truncated).
  EXPECT_DOUBLE_EQ(
      finalized("--train-samples 1000 --global-batch-size 10 --lr-warmup-fraction 0.0015")
          .lr_schedule.warmup_steps,
      1.5);
}

TEST(SampleBasedTraining, IterationBasedSchedulesCountSamplesOfTheGlobalBatch) {
  const Options o = finalized(
      "--train-iters 100 --micro-batch-size 2 --global-batch-size 8 --lr 1 --min-lr 0 "
      "--lr-warmup-iters 10 --lr-decay-iters 60 --lr-decay-style WSD --lr-wsd-decay-iters 20 "
      "--lr-wsd-decay-style linear");
  const LRScheduleConfig& s = o.lr_schedule;
  EXPECT_DOUBLE_EQ(s.warmup_steps, 80);  // Megatron: lr_warmup_iters * global_batch_size
  EXPECT_EQ(s.decay_steps, 480);
  EXPECT_EQ(s.wsd_decay_steps, 160);
  EXPECT_DOUBLE_EQ(learning_rate(s, 5 * 8), 0.5);
  EXPECT_DOUBLE_EQ(learning_rate(s, 40 * 8), 1.0);  // before the anneal (at iteration 40)
  EXPECT_DOUBLE_EQ(learning_rate(s, 50 * 8), 0.5);  // half-way through the anneal
}

TEST(SampleBasedTraining, WsdDecaySamplesAnnealTheLastSamples) {
  const Options o = finalized(
      "--train-samples 1000 --global-batch-size 10 --lr 1 --min-lr 0.1 --lr-decay-style WSD "
      "--lr-wsd-decay-samples 200 --lr-wsd-decay-style linear --lr-decay-samples 600");
  EXPECT_DOUBLE_EQ(learning_rate(o.lr_schedule, 400), 1.0);
  EXPECT_DOUBLE_EQ(learning_rate(o.lr_schedule, 500), 0.1 + 0.9 * 0.5);
}

TEST(SampleBasedTraining, RampupSetsTheIterationsAndChecksItsBatches) {
  const Options o = finalized(
      "--train-samples 100 --micro-batch-size 4 --global-batch-size 32 --rampup-batch-size 8 8 "
      "30");
  EXPECT_EQ(o.train_iters, 5);
  EXPECT_TRUE(o.batch_schedule.ramps());
  EXPECT_EQ(o.batch_schedule.batch_at(16), 16);
  EXPECT_NE(usage_error([] {
              finalized(
                  "--train-samples 100 --micro-batch-size 4 --global-batch-size 32 "
                  "--rampup-batch-size 6 2 30");
            }).find("the ramp's global batch 6 is not a multiple"),
            std::string::npos);
  EXPECT_NE(usage_error([] {
              finalized("--train-samples 100 --global-batch-size 32 --rampup-batch-size 8 7 30");
            }).find("by a multiple of INCR (7)"),
            std::string::npos);
  EXPECT_NE(usage_error([] {
              finalized("--rampup-batch-size 8 8 30 --global-batch-size 32");
            }).find("needs sample-based training"),
            std::string::npos);
  EXPECT_NE(usage_error([] {
              finalized("--train-samples 100 --rampup-batch-size 8 8");
            }).find("three values"),
            std::string::npos);
}

TEST(SampleBasedTraining, IterationAndSampleOptionsDoNotMix) {
  for (const char* line :
       {"--train-samples 100 --train-iters 10", "--train-samples 100 --lr-decay-iters 10",
        "--train-samples 100 --lr-warmup-iters 10", "--train-iters 10 --lr-warmup-samples 10",
        "--train-iters 10 --lr-decay-samples 10", "--lr-wsd-decay-samples 10",
        "--train-samples 100 --lr-warmup-fraction 0.1 --lr-warmup-samples 10"})
    EXPECT_FALSE(usage_error([line] { finalized(line); }).empty()) << line;
  // A batch larger than the samples: no whole step.
  EXPECT_NE(usage_error([] {
              finalized("--train-samples 5 --global-batch-size 8");
            }).find("holds no whole step"),
            std::string::npos);
}

}  // namespace
}  // namespace omni
