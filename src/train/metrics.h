// What a training run reports, as Megatron's training_log does: a console line every
// --log-interval, TensorBoard scalars every --tensorboard-log-interval (--tensorboard-dir),
// one JSON object per logged line in --metrics-file, and a live progress line when stdout is
// a terminal. Throughput is also shown as Primus's running average, which leaves out the
// first --log-avg-skip-iterations iterations and restarts every --log-avg-reset-interval
// logged lines.
#pragma once

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "config/options.h"

namespace omni {

class TensorBoardWriter;

// A step's mixture-of-experts figures: Megatron's aux-loss tracker values (its console and
// TensorBoard names "load_balancing_loss", "z_loss": each MoE layer's loss without its
// coefficient, averaged over the MoE layers, micro-batches and data-parallel ranks), and per
// MoE layer the tokens each expert received over the global batch (routing collapse shows as
// a minimum of 0 and a maximum near all of them).
struct MoEStepMetrics {
  std::vector<std::pair<std::string, double>> losses;
  struct LayerTokens {
    int layer = 0;  // global index, as in decoder.layers.<layer>
    double min = 0, max = 0, mean = 0;
  };
  std::vector<LayerTokens> tokens;
};

// One report from the trainer. It covers `iterations` steps ending at `iteration` (one step
// when the trainer reports every step, or a --log-interval window); its values are their
// means (lm_loss over the steps whose update was not skipped) and lr, grad_norm and
// loss_scale those of the last step.
struct StepMetrics {
  int64_t iteration = 0, train_iters = 0, consumed_samples = 0;
  int global_batch_size = 0;
  double lm_loss = 0, lr = 0, grad_norm = 0;
  double ms_per_iter = 0, tokens_per_sec = 0, tflops = 0, mfu = 0;
  double loss_scale = 1;  // the fp16 loss scaler's scale; 1 without one (Megatron logs 1.0)
  int64_t iterations = 1;
  // Of those steps: updates skipped for inf/NaN gradients, and skipped steps whose loss was
  // NaN or infinite (Megatron's "number of nan iterations").
  int64_t skipped_iterations = 0, nan_iterations = 0;
  std::optional<double> val_loss;
  // --log-params-norm, --log-num-zeros-in-grad: the last step's (none for a skipped step).
  std::optional<double> params_norm;
  std::optional<int64_t> num_zeros_in_grad;
  // --log-timers-to-tensorboard, on a logged line's report: each phase's seconds per
  // iteration over the window (train/profiler.h).
  std::vector<std::pair<std::string, double>> timers;
  MoEStepMetrics moe;  // empty for a dense model
};

// A downstream task's scores (train/downstream_eval.h) at one iteration.
struct TaskMetrics {
  int64_t iteration = 0, consumed_samples = 0;
  std::string task;
  int64_t examples = 0;
  double acc = 0, acc_stderr = 0, acc_norm = 0, acc_norm_stderr = 0;
};

// Resident memory of this process (Linux /proc and getrusage); 0 where unknown.
struct ProcessMemory {
  int64_t rss_bytes = 0, max_rss_bytes = 0;
};
ProcessMemory process_memory();

class MetricsSink {
 public:
  // out = nullptr: no console output (the metrics file is still written). Every report
  // makes a logged line; no TensorBoard.
  MetricsSink(const std::string& metrics_file, bool progress, FILE* out = stdout);
  // What the options ask for: --metrics-file, --no-progress, --log-interval,
  // --tensorboard-dir and the other logging flags.
  explicit MetricsSink(const Options& opts, FILE* out = stdout);
  ~MetricsSink();
  MetricsSink(const MetricsSink&) = delete;
  MetricsSink& operator=(const MetricsSink&) = delete;

  // A report (see StepMetrics). Reports accumulate until an iteration that is a multiple
  // of --log-interval (or the last one), which prints the console line and writes the JSON
  // object for the whole window; TensorBoard gets the report's own values when its
  // iteration is a multiple of --tensorboard-log-interval.
  void log(const StepMetrics& m);
  // A validation result; `m` carries iteration, consumed_samples and val_loss.
  void log_validation(const StepMetrics& m);
  // A downstream task's scores: a console line, TensorBoard "<task> acc" and "<task>
  // acc_norm" (and "vs samples"), and a metrics-file object with "task".
  void log_task(const TaskMetrics& m);
  // Live progress after every step (terminal only).
  void progress(int64_t iteration, int64_t total, double loss, double sec_per_iter);
  void message(const std::string& line);  // a plain console line, progress kept intact
  // The event file being written, empty without --tensorboard-dir.
  std::string tensorboard_file() const;

 private:
  // Megatron's total_loss_dict: what the reports since the last logged line add up to.
  struct Window {
    double loss_sum = 0, seconds = 0, tokens = 0, flop = 0, mfu_seconds = 0;
    int64_t iterations = 0, advanced = 0, skipped = 0, nan = 0;
    std::vector<std::pair<std::string, double>> moe_loss_sums;  // over advanced steps
  };
  void log_moe_window(const StepMetrics& last, const Window& w, std::string& json);
  void clear_progress();
  void write_tensorboard(const StepMetrics& m, const ProcessMemory& mem);
  void log_window(const StepMetrics& last);
  void write_json(const std::string& object);  // one line of --metrics-file
  // Primus's running average of one throughput figure over the logged lines.
  struct RunningAverage {
    std::vector<double> values;
    std::optional<double> add(double v, bool counted, bool restart, int reset_interval);
  };

  FILE* out_;
  std::ofstream jsonl_;
  std::string jsonl_path_;
  bool live_ = false, progress_shown_ = false;
  int log_interval_ = 1, tensorboard_log_interval_ = 1;
  bool log_memory_to_tensorboard_ = false, log_throughput_ = false;
  bool log_loss_scale_to_tensorboard_ = true, log_validation_ppl_to_tensorboard_ = false;
  int log_avg_skip_iterations_ = 0, log_avg_reset_interval_ = 0;
  std::unique_ptr<TensorBoardWriter> tensorboard_;
  Window window_;
  int64_t iterations_seen_ = 0;  // steps reported since this sink was made
  bool averaging_ = false;       // past the skipped iterations
  RunningAverage avg_tokens_, avg_tflops_;
};

}  // namespace omni
