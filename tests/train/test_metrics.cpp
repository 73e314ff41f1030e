// MetricsSink as Megatron's training_log: the interval line (console and --metrics-file),
// TensorBoard scalars under Megatron's tags, Primus's throughput average and the memory
// figures. Reports are built by hand so each expectation is computed here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "base/json.h"
#include "config/options.h"
#include "event_file_reader.h"
#include "train/metrics.h"

namespace {

namespace fs = std::filesystem;

// A per-step report: step `it` of 8, 4 samples a step, `ms` milliseconds.
omni::StepMetrics step(int64_t it, double loss, double ms = 100) {
  omni::StepMetrics m;
  m.iteration = it;
  m.train_iters = 8;
  m.consumed_samples = 4 * it;
  m.global_batch_size = 4;
  m.lm_loss = loss;
  m.lr = 1e-3 * double(it);
  m.grad_norm = 0.5 + double(it);
  m.ms_per_iter = ms;
  m.tokens_per_sec = 4 * 16 / (ms / 1000);  // 4 samples of 16 tokens
  m.tflops = 2.0 / ms;
  m.loss_scale = 65536;
  return m;
}

// Console output into a string.
class Console {
 public:
  Console() : file_(open_memstream(&buf_, &size_)) {}
  ~Console() {
    std::fclose(file_);
    std::free(buf_);
  }
  FILE* file() { return file_; }
  std::string text() {
    std::fflush(file_);
    return std::string(buf_, size_);
  }

 private:
  char* buf_ = nullptr;
  size_t size_ = 0;
  FILE* file_;
};

std::vector<omni::json::Value> read_jsonl(const std::string& path) {
  std::ifstream in(path);
  std::vector<omni::json::Value> out;
  for (std::string line; std::getline(in, line);) out.push_back(omni::json::parse(line, path));
  return out;
}

double number(const omni::json::Value& v, const char* key) {
  const omni::json::Value* x = v.find(key);
  EXPECT_TRUE(x && x->is_number()) << key;
  return x && x->is_number() ? x->num() : NAN;
}

std::string temp_path(const std::string& name) {
  const fs::path p = fs::path(::testing::TempDir()) / name;
  fs::remove_all(p);
  return p.string();
}

TEST(Metrics, PerStepReportsMakeOneLinePerLogIntervalWithMegatronsAverages) {
  omni::Options o;
  o.metrics_file = temp_path("metrics_window.jsonl");
  o.log_interval = 4;
  o.progress = false;
  Console console;
  {
    omni::MetricsSink sink(o, console.file());
    sink.log(step(1, 4.0, 100));
    omni::StepMetrics skipped = step(2, 0.0, 300);  // fp16 overflow: update skipped, loss NaN
    skipped.skipped_iterations = skipped.nan_iterations = 1;
    sink.log(skipped);
    sink.log(step(3, 3.0, 100));
    sink.log(step(4, 2.0, 100));
  }
  const std::string text = console.text();
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 1) << text;
  // Loss over the three updates that happened; time over all four steps.
  EXPECT_NE(text.find("iteration        4/       8 |"), std::string::npos) << text;
  EXPECT_NE(text.find("consumed samples:           16 |"), std::string::npos) << text;
  EXPECT_NE(text.find("elapsed time per iteration (ms): 150.0 |"), std::string::npos) << text;
  EXPECT_NE(text.find("lm loss: 3.000000E+00 |"), std::string::npos) << text;
  EXPECT_NE(text.find("learning rate: 4.000000E-03 |"), std::string::npos) << text;
  EXPECT_NE(text.find("loss scale: 65536.0 |"), std::string::npos) << text;
  EXPECT_NE(text.find("grad norm: 4.500 |"), std::string::npos) << text;
  EXPECT_NE(text.find("number of skipped iterations:   1 |"), std::string::npos) << text;
  EXPECT_NE(text.find("number of nan iterations:   1 |"), std::string::npos) << text;

  const auto lines = read_jsonl(o.metrics_file);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(number(lines[0], "iteration"), 4);
  EXPECT_EQ(number(lines[0], "lm_loss"), 3.0);
  EXPECT_EQ(number(lines[0], "skipped_iterations"), 1);
  EXPECT_EQ(number(lines[0], "nan_iterations"), 1);
  EXPECT_EQ(number(lines[0], "loss_scale"), 65536);
  EXPECT_DOUBLE_EQ(number(lines[0], "ms_per_iter"), 150.0);
  // Rates over the window's time: 4 steps of 64 tokens in 0.6 s; TFLOP/s weighted by time.
  EXPECT_NEAR(number(lines[0], "tokens_per_sec"), 4 * 64 / 0.6, 1e-6);
  EXPECT_NEAR(number(lines[0], "tflops"), 4 * (2.0 / 100 * 0.1) / 0.6, 1e-9);  // %.9g
}

TEST(Metrics, AWindowReportLogsAsItDidBeforeSinkAveraging) {
  // The trainer may report once per interval with the interval's means.
  const std::string path = temp_path("metrics_window_report.jsonl");
  {
    omni::MetricsSink sink(path, false, nullptr);
    omni::StepMetrics m = step(2, 3.5, 120);
    m.iterations = 2;
    sink.log(m);
  }
  const auto lines = read_jsonl(path);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(number(lines[0], "lm_loss"), 3.5);
  EXPECT_DOUBLE_EQ(number(lines[0], "ms_per_iter"), 120.0);
  EXPECT_NEAR(number(lines[0], "tokens_per_sec"), 64 / 0.12, 1e-6);
}

TEST(Metrics, ThroughputAverageSkipsWarmupAndRestartsAsPrimusDoes) {
  // Primus, skip 2 and reset 3: lines 1-2 have no average; 3 starts the window; 6 finds
  // it full (3 values) and restarts it.
  omni::Options o;
  o.metrics_file = temp_path("metrics_avg.jsonl");
  o.log_interval = 1;
  o.log_avg_skip_iterations = 2;
  o.log_avg_reset_interval = 3;
  const std::vector<double> ms = {400, 300, 100, 200, 100, 50, 100};
  {
    omni::MetricsSink sink(o, nullptr);
    for (size_t i = 0; i < ms.size(); ++i) sink.log(step(int64_t(i + 1), 3.0, ms[i]));
  }
  const auto lines = read_jsonl(o.metrics_file);
  ASSERT_EQ(lines.size(), ms.size());
  const auto tps = [&](size_t i) { return 64 / (ms[i] / 1000); };
  const std::vector<std::optional<double>> expected = {std::nullopt,
                                                       std::nullopt,
                                                       tps(2),
                                                       (tps(2) + tps(3)) / 2,
                                                       (tps(2) + tps(3) + tps(4)) / 3,
                                                       tps(5),
                                                       (tps(5) + tps(6)) / 2};
  for (size_t i = 0; i < ms.size(); ++i) {
    SCOPED_TRACE(i);
    const omni::json::Value* avg = lines[i].find("avg_tokens_per_sec");
    ASSERT_EQ(avg != nullptr, expected[i].has_value());
    if (avg) {
      EXPECT_NEAR(avg->num(), *expected[i], 1e-6);
    }
    const omni::json::Value* avg_tflops = lines[i].find("avg_tflops");
    ASSERT_EQ(avg_tflops != nullptr, expected[i].has_value());
  }
}

TEST(Metrics, ConsoleShowsTheAverageAfterTheInstantValue) {
  omni::Options o;
  o.log_interval = 1;
  o.log_avg_skip_iterations = 1;
  Console console;
  {
    omni::MetricsSink sink(o, console.file());
    sink.log(step(1, 3.0, 100));
    sink.log(step(2, 3.0, 200));
    sink.log(step(3, 3.0, 100));
  }
  const std::string text = console.text();
  EXPECT_NE(text.find("tokens/s: 640 | TFLOP/s:"), std::string::npos) << text;  // skipped
  EXPECT_NE(text.find("tokens/s: 320/320 |"), std::string::npos) << text;
  EXPECT_NE(text.find("tokens/s: 640/480 |"), std::string::npos) << text;
}

TEST(Metrics, ProcessMemoryTracksThePeak) {
  const omni::ProcessMemory before = omni::process_memory();
  EXPECT_GT(before.rss_bytes, 0);
  EXPECT_GE(before.max_rss_bytes, before.rss_bytes);
  constexpr size_t kBytes = 256u << 20;
  std::vector<char> block(kBytes, 1);  // touched, so resident
  const omni::ProcessMemory during = omni::process_memory();
  EXPECT_GE(during.rss_bytes, before.rss_bytes + int64_t(kBytes) * 9 / 10);
  EXPECT_GE(during.max_rss_bytes, during.rss_bytes);
  EXPECT_EQ(block[kBytes - 1], 1);
}

TEST(Metrics, MetricsFileCarriesMemory) {
  const std::string path = temp_path("metrics_memory.jsonl");
  {
    omni::MetricsSink sink(path, false, nullptr);
    sink.log(step(1, 3.0));
  }
  const auto lines = read_jsonl(path);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_GT(number(lines[0], "rss_bytes"), 0);
  EXPECT_GE(number(lines[0], "max_rss_bytes"), number(lines[0], "rss_bytes"));
}

// Runs four per-step reports and a validation through a sink writing TensorBoard files, and
// reads the file back with the hand-rolled reader.
std::vector<event_file::Event> tensorboard_run(omni::Options o, const std::string& name) {
  o.tensorboard_dir = temp_path(name);
  o.progress = false;
  std::string file;
  {
    omni::MetricsSink sink(o, nullptr);
    file = sink.tensorboard_file();
    EXPECT_EQ(fs::path(file).parent_path(), fs::path(o.tensorboard_dir));
    for (int64_t it = 1; it <= 4; ++it) sink.log(step(it, 5.0 - double(it)));
    omni::StepMetrics v = step(4, 0);
    v.val_loss = 1.5;
    sink.log_validation(v);
  }
  return event_file::read_event_file(file);
}

using Series = std::vector<std::pair<int64_t, float>>;

TEST(Metrics, TensorBoardGetsMegatronsTagsEveryStepAndVsSamples) {
  omni::Options o;
  o.log_interval = 2;
  const auto events = tensorboard_run(o, "tb_tags");
  EXPECT_EQ(events.at(0).file_version, "brain.Event:2");
  EXPECT_EQ(event_file::series(events, "lm loss"),
            (Series{{1, 4.0f}, {2, 3.0f}, {3, 2.0f}, {4, 1.0f}}));
  // Against consumed samples (4 per step).
  EXPECT_EQ(event_file::series(events, "lm loss vs samples"),
            (Series{{4, 4.0f}, {8, 3.0f}, {12, 2.0f}, {16, 1.0f}}));
  EXPECT_EQ(event_file::series(events, "learning-rate"),
            (Series{{1, 1e-3f}, {2, 2e-3f}, {3, 3e-3f}, {4, 4e-3f}}));
  EXPECT_EQ(event_file::series(events, "grad-norm").size(), 4u);
  EXPECT_EQ(event_file::series(events, "loss-scale"),
            (Series{{1, 65536.f}, {2, 65536.f}, {3, 65536.f}, {4, 65536.f}}));
  EXPECT_EQ(event_file::series(events, "batch-size vs samples").size(), 4u);
  // Per logged line (every 2 steps), in seconds as Megatron writes it.
  EXPECT_EQ(event_file::series(events, "iteration-time"), (Series{{2, 0.1f}, {4, 0.1f}}));
  EXPECT_EQ(event_file::series(events, "lm loss validation"), (Series{{4, 1.5f}}));
  EXPECT_EQ(event_file::series(events, "lm loss validation vs samples"), (Series{{16, 1.5f}}));
  // Only when asked for.
  EXPECT_TRUE(event_file::series(events, "throughput").empty());
  EXPECT_TRUE(event_file::series(events, "mem-max-rss-bytes").empty());
}

TEST(Metrics, TensorBoardLogIntervalThinsTheStepScalars) {
  omni::Options o;
  o.log_interval = 1;
  o.tensorboard_log_interval = 2;
  const auto events = tensorboard_run(o, "tb_interval");
  EXPECT_EQ(event_file::series(events, "lm loss"), (Series{{2, 3.0f}, {4, 1.0f}}));
  EXPECT_EQ(event_file::series(events, "iteration-time").size(), 4u);  // every logged line
}

TEST(Metrics, ThroughputAndMemoryGoToTensorBoardWhenAskedFor) {
  omni::Options o;
  o.log_interval = 2;
  o.log_throughput = true;
  o.log_memory_to_tensorboard = true;
  const auto events = tensorboard_run(o, "tb_throughput");
  EXPECT_EQ(event_file::series(events, "throughput"), (Series{{2, 0.02f}, {4, 0.02f}}));
  const auto peak = event_file::series(events, "mem-max-rss-bytes");
  ASSERT_EQ(peak.size(), 4u);
  EXPECT_GT(peak[0].second, 1e6f);
  EXPECT_EQ(event_file::series(events, "mem-rss-bytes").size(), 4u);
}

TEST(Metrics, TheSinksTensorBoardFileAlsoPassesTheNodeReader) {
  omni::Options o;
  o.tensorboard_dir = temp_path("tb_sink_node");
  std::string file;
  {
    omni::MetricsSink sink(o, nullptr);
    file = sink.tensorboard_file();
    sink.log(step(1, 2.5));
  }
  const auto [code, out] = event_file::run_node_reader(file);
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("{\"tag\":\"lm loss\",\"simple_value\":2.5}"), std::string::npos) << out;
}

TEST(Metrics, BadLoggingOptionsAreUsageErrors) {
  omni::Options o;
  o.tensorboard_log_interval = 0;
  EXPECT_THROW((omni::MetricsSink{o, nullptr}), omni::UsageError);
  o.tensorboard_log_interval = 1;
  o.log_avg_skip_iterations = -1;
  EXPECT_THROW((omni::MetricsSink{o, nullptr}), omni::UsageError);
}

}  // namespace
