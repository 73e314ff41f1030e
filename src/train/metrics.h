// What a training run reports: a Megatron-style console line every --log-interval, a
// live progress line when stdout is a terminal, and one JSON object per logged step in
// --metrics-file.
#pragma once

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>

#include "config/options.h"

namespace omni {

struct StepMetrics {
  int64_t iteration = 0, train_iters = 0, consumed_samples = 0;
  int global_batch_size = 0;
  double lm_loss = 0, lr = 0, grad_norm = 0;
  double ms_per_iter = 0, tokens_per_sec = 0, tflops = 0, mfu = 0;
  std::optional<double> val_loss;
};

class MetricsSink {
 public:
  // out = nullptr: no console output (the metrics file is still written).
  MetricsSink(const std::string& metrics_file, bool progress, FILE* out = stdout);
  // What the options ask for: --metrics-file, progress, and the logging flags.
  explicit MetricsSink(const Options& opts, FILE* out = stdout);
  // A logged step (console line + JSON object).
  void log(const StepMetrics& m);
  // A validation result; `m` carries iteration and val_loss.
  void log_validation(const StepMetrics& m);
  // Live progress after every step (terminal only).
  void progress(int64_t iteration, int64_t total, double loss, double sec_per_iter);
  void message(const std::string& line);  // a plain console line, progress kept intact

 private:
  void clear_progress();
  void write_json(const StepMetrics& m, bool train_fields);
  FILE* out_;
  std::ofstream jsonl_;
  std::string jsonl_path_;
  bool live_ = false, progress_shown_ = false;
};

}  // namespace omni
