// Megatron's --profile (a Chrome trace of the step phases, read back with our JSON reader) and
// its logging flags: --log-params-norm and --log-num-zeros-in-grad checked against the
// trained model, the TensorBoard timers and validation perplexity, --logging-level.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "base/json.h"
#include "cli/process.h"
#include "config/options.h"
#include "data/datasets/dataset.h"
#include "event_file_reader.h"
#include "train/trainer.h"

namespace {

namespace fs = std::filesystem;

std::string temp_dir(const std::string& name) {
  const fs::path p = fs::path(::testing::TempDir()) / name;
  fs::remove_all(p);
  return p.string();
}

const std::string kTiny =
    "train --mock-data --vocab-size 40 --num-layers 1 --hidden-size 16 --num-attention-heads 2 "
    "--seq-length 8 --micro-batch-size 1 --global-batch-size 2 --no-progress --max-new-tokens 0 ";

struct TraceEvent {
  std::string name;
  double ts, dur;
  int iteration, microbatch = -1;
};

std::vector<TraceEvent> read_trace(const std::string& path) {
  const omni::json::Value doc = omni::json::parse(read_text(path), path);
  const omni::json::Value* events = doc.find("traceEvents");
  EXPECT_TRUE(events && events->is_array()) << path;
  std::vector<TraceEvent> out;
  if (!events || !events->is_array()) return out;
  for (const omni::json::Value& e : events->arr()) {
    if (e.find("ph")->str() != "X") continue;
    for (const char* key : {"name", "ph", "ts", "dur", "pid", "tid"})
      EXPECT_NE(e.find(key), nullptr) << key;
    TraceEvent t{e.find("name")->str(), e.find("ts")->num(), e.find("dur")->num(),
                 int(e.find("args")->find("iteration")->num())};
    if (const omni::json::Value* mb = e.find("args")->find("microbatch"))
      t.microbatch = int(mb->num());
    EXPECT_EQ(e.find("pid")->num(), 0);
    out.push_back(t);
  }
  return out;
}

// The trace's times are microseconds since 1970 as doubles, whose resolution there is 0.25 µs:
// an event that ends as the next begins may read as ending up to half a microsecond after it,
// so every comparison of two events' times allows 1 µs (before, the forward-before-backward
// check allowed 1 ns and failed 26 runs in 150).
constexpr double kTraceResolutionUs = 1.0;

TEST(Profile, WritesAChromeTraceOfEachPhaseOfTheStepRange) {
  const std::string dir = temp_dir("profile_trace");
  const ProcessResult r =
      run_omnitron(kTiny +
                   "--train-iters 6 --eval-iters 1 --eval-interval 2 --profile "
                   "--profile-step-start 2 --profile-step-end 4 --tensorboard-dir " +
                   dir + "/tb");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Beside the TensorBoard directory, where Megatron's PyTorch profiler writes.
  const std::string path = dir + "/torch_profile/rank-0.json";
  EXPECT_NE(r.output.find("profile: wrote " + path), std::string::npos) << r.output;
  const std::vector<TraceEvent> events = read_trace(path);
  // Megatron's range: iterations 3 and 4 (after the counter reached 2, up to 4).
  std::map<int, TraceEvent> steps;
  for (const TraceEvent& e : events) {
    EXPECT_TRUE(e.iteration == 3 || e.iteration == 4) << e.name << " " << e.iteration;
    if (e.name == "train-step") steps.emplace(e.iteration, e);
  }
  ASSERT_EQ(steps.size(), 2u);
  std::map<std::pair<int, std::string>, int> count;  // (iteration, name) -> events
  for (const TraceEvent& e : events) {
    ++count[{e.iteration, e.name}];
    const TraceEvent& step = steps.at(e.iteration);
    EXPECT_GE(e.ts, step.ts) << e.name;
    EXPECT_LE(e.ts + e.dur, step.ts + step.dur + kTraceResolutionUs) << e.name;
  }
  for (int it : {3, 4}) {
    SCOPED_TRACE(it);
    // Two micro-batches a step (global batch 2, micro batch 1): each read, run forward and
    // backward; the step's phases once each.
    EXPECT_EQ((count[{it, "batch-generator"}]), 2);
    EXPECT_EQ((count[{it, "forward-compute"}]), 2);
    EXPECT_EQ((count[{it, "backward-compute"}]), 2);
    for (const char* phase : {"forward-backward", "all-grads-sync", "optimizer"})
      EXPECT_EQ((count[{it, phase}]), 1) << phase;
    EXPECT_GE((count[{it, "grad-bucket-start"}]), 1);
  }
  // The phases in order: forward-backward, then the gradients' reduction, then the optimizer.
  std::map<std::pair<int, std::string>, TraceEvent> phase;
  for (const TraceEvent& e : events) phase.emplace(std::make_pair(e.iteration, e.name), e);
  for (int it : {3, 4}) {
    const TraceEvent &fb = phase.at({it, "forward-backward"}),
                     &sync = phase.at({it, "all-grads-sync"}), &opt = phase.at({it, "optimizer"});
    // One phase ends as the next begins.
    EXPECT_LE(fb.ts + fb.dur, sync.ts + kTraceResolutionUs);
    EXPECT_LE(sync.ts + sync.dur, opt.ts + kTraceResolutionUs);
  }
  // Each micro-batch's forward ends before its backward starts.
  for (const TraceEvent& f : events) {
    for (const TraceEvent& b : events) {
      if (f.name == "forward-compute" && b.name == "backward-compute" &&
          f.iteration == b.iteration && f.microbatch == b.microbatch) {
        EXPECT_LE(f.ts + f.dur, b.ts + kTraceResolutionUs);
      }
    }
  }
}

TEST(Profile, ARangeThatDoesNotRunWritesNoTraceAndSaysSo) {
  const std::string dir = temp_dir("profile_none");
  const ProcessResult r =
      run_omnitron_env("cd " + (fs::create_directories(dir), dir) + " &&",
                       kTiny + "--train-iters 3 --eval-iters 0 --profile");  // Megatron's 10-12
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("profile: iterations 11-12 of every rank as Chrome traces in "
                          "torch_profile/rank-R.json"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("profile: no trace from rank 0: iterations 11-12 did not run"),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(dir + "/torch_profile/rank-0.json"));
}

TEST(Profile, AnEmptyRangeIsAnErrorNamingBothFlags) {
  const ProcessResult r =
      run_omnitron(kTiny + "--train-iters 3 --profile --profile-step-start 5 --profile-step-end 5");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--profile-step-start (5) and --profile-step-end (5)"), std::string::npos)
      << r.output;
}

TEST(LoggingFlags, ParamsNormAndZerosInGradAreThoseOfTheTrainedModel) {
  omni::Options o;
  omni::parse_options({"--mock-data",
                       "--vocab-size",
                       "97",
                       "--num-layers",
                       "1",
                       "--hidden-size",
                       "16",
                       "--num-attention-heads",
                       "2",
                       "--seq-length",
                       "8",
                       "--micro-batch-size",
                       "2",
                       "--train-iters",
                       "3",
                       "--eval-iters",
                       "0",
                       "--log-interval",
                       "3",
                       "--no-progress",
                       "--log-params-norm",
                       "--log-num-zeros-in-grad"},
                      o);
  omni::finalize(o);
  omni::Trainer t(o, omni::make_mock_data(97, 1));
  const std::string metrics = temp_dir("params_norm.jsonl");
  omni::Options logging = o;
  logging.metrics_file = metrics;
  {
    omni::MetricsSink sink(logging, nullptr);
    t.run(sink);
  }
  const omni::ParameterSet<float>& p = t.model().params();
  double sum = 0;
  int64_t zeros = 0;
  for (int64_t i = 0; i < p.size(); ++i) {
    sum += double(p.values()[i]) * p.values()[i];
    zeros += p.grads()[i] == 0.0f;
  }
  const omni::json::Value line = omni::json::parse(read_text(metrics), metrics);
  ASSERT_NE(line.find("params_norm"), nullptr) << read_text(metrics);
  EXPECT_NEAR(line.find("params_norm")->num(), std::sqrt(sum), 1e-4 * std::sqrt(sum));
  // The embedding rows of the tokens the batch did not hold get no gradient.
  ASSERT_NE(line.find("num_zeros_in_grad"), nullptr);
  EXPECT_EQ(line.find("num_zeros_in_grad")->num(), double(zeros));
  EXPECT_GT(zeros, 0);
}

TEST(LoggingFlags, ConsoleAndTensorBoardCarryThemUnderMegatronsNames) {
  const std::string dir = temp_dir("logging_flags");
  const ProcessResult r =
      run_omnitron(kTiny +
                   "--train-iters 4 --log-interval 2 --eval-iters 1 --eval-interval 2 "
                   "--log-params-norm --log-num-zeros-in-grad --log-timers-to-tensorboard "
                   "--log-validation-ppl-to-tensorboard --tensorboard-dir " +
                   dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(" | num zeros: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(" | params norm: "), std::string::npos) << r.output;
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir)) files.push_back(entry.path());
  ASSERT_EQ(files.size(), 1u);
  const auto events = event_file::read_event_file(files[0].string());
  const auto steps = [&](const std::string& tag) {
    std::vector<int64_t> s;
    for (const auto& [step, value] : event_file::series(events, tag)) s.push_back(step);
    return s;
  };
  EXPECT_EQ(steps("params-norm"), (std::vector<int64_t>{1, 2, 3, 4}));
  EXPECT_EQ(steps("num-zeros vs samples"), (std::vector<int64_t>{2, 4, 6, 8}));
  // Timers on each logged line, in seconds per iteration.
  for (const char* timer :
       {"forward-backward-time", "forward-compute-time", "backward-compute-time",
        "batch-generator-time", "all-grads-sync-time", "optimizer-time"}) {
    SCOPED_TRACE(timer);
    EXPECT_EQ(steps(timer), (std::vector<int64_t>{2, 4}));
    for (const auto& [step, seconds] : event_file::series(events, timer))
      EXPECT_TRUE(seconds >= 0 && seconds < 10);
  }
  // No pipeline: no receive timers (Megatron creates none either).
  EXPECT_TRUE(event_file::series(events, "forward-recv-time").empty());
  const auto loss = event_file::series(events, "lm loss validation");
  const auto ppl = event_file::series(events, "lm loss validation ppl");
  ASSERT_EQ(ppl.size(), 2u);
  ASSERT_EQ(loss.size(), 2u);
  EXPECT_NEAR(ppl[1].second, std::exp(loss[1].second), 1e-3 * ppl[1].second);
  EXPECT_EQ(event_file::series(events, "lm loss validation ppl vs samples").size(), 2u);
}

TEST(LoggingFlags, WithoutThemNothingIsAdded) {
  const std::string dir = temp_dir("logging_flags_off");
  const ProcessResult r = run_omnitron(
      kTiny + "--train-iters 2 --log-interval 2 --eval-iters 0 --tensorboard-dir " + dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("params norm"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("num zeros"), std::string::npos) << r.output;
  const auto events = event_file::read_event_file(fs::directory_iterator(dir)->path().string());
  EXPECT_TRUE(event_file::series(events, "optimizer-time").empty());
  EXPECT_TRUE(event_file::series(events, "params-norm").empty());
}

TEST(LoggingFlags, LoggingLevelHidesSetUpLinesAtWarningAndAddsDebugLines) {
  const std::string run = kTiny + "--train-iters 2 --log-interval 2 --eval-iters 0 ";
  const ProcessResult info = run_omnitron(run);
  ASSERT_EQ(info.exit_code, 0) << info.output;
  EXPECT_NE(info.output.find("  data: "), std::string::npos) << info.output;
  const ProcessResult warning = run_omnitron(run + "--logging-level 30");
  ASSERT_EQ(warning.exit_code, 0) << warning.output;
  EXPECT_EQ(warning.output.find("  data: "), std::string::npos) << warning.output;
  EXPECT_EQ(warning.output.find("  device: "), std::string::npos) << warning.output;
  EXPECT_NE(warning.output.find(" iteration        2/       2 |"), std::string::npos)
      << warning.output;
  // Megatron reads the environment when the flag is absent.
  const ProcessResult env = run_omnitron_env("MEGATRON_LOGGING_LEVEL=30", run);
  EXPECT_EQ(env.output.find("  data: "), std::string::npos) << env.output;
  const ProcessResult debug = run_omnitron(run + "--logging-level 10");
  EXPECT_NE(debug.output.find("  debug: collective timeout 600 s"), std::string::npos)
      << debug.output;
}

}  // namespace
