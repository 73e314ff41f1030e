// Megatron's logging and validation groups: console, metrics, TensorBoard, evaluation.
#include "config/option_rows.h"

namespace omni::option_rows {

void add_logging_options(std::vector<OptionDef>& t) {
  const std::string G = "logging";
  t.push_back(number<int>("--log-interval", "N", G, "console and metrics line every N steps",
                          [](Options& o) -> int& { return o.log_interval; }));
  t.push_back(number<int>("--eval-interval", "N", G,
                          "validation every N steps (0: only at the end)",
                          [](Options& o) -> int& { return o.eval_interval; }));
  t.push_back(number<int>("--eval-iters", "N", G, "validation micro-batches per evaluation",
                          [](Options& o) -> int& { return o.eval_iters; }));
  t.push_back(number<int64_t>("--start-eval-at-iter", "N", G, "no validation before iteration N",
                              [](Options& o) -> int64_t& { return o.start_eval_at_iter; }));
  t.push_back(number<int>("--eval-global-batch-size", "N", G,
                          "validation batch (0: --global-batch-size, the only one built)",
                          [](Options& o) -> int& { return o.eval_global_batch_size; }));
  t.push_back(number<int>("--eval-micro-batch-size", "N", G,
                          "validation micro batch (0: --micro-batch-size, the only one built)",
                          [](Options& o) -> int& { return o.eval_micro_batch_size; }));
  t.push_back(text("--tensorboard-dir", "DIR", G, "write TensorBoard event files here",
                   [](Options& o) -> std::string& { return o.tensorboard_dir; }));
  t.push_back(number<int>("--tensorboard-log-interval", "N", G, "TensorBoard scalars every N steps",
                          [](Options& o) -> int& { return o.tensorboard_log_interval; }));
  t.push_back(toggle("--log-memory-to-tensorboard", G, "memory use in TensorBoard",
                     [](Options& o) -> bool& { return o.log_memory_to_tensorboard; }));
  for (const char* flag :
       {"--no-log-loss-scale-to-tensorboard", "--disable-log-loss-scale-to-tensorboard"})
    t.push_back(toggle(
        flag, G, "no loss-scale scalar in TensorBoard",
        [](Options& o) -> bool& { return o.log_loss_scale_to_tensorboard; }, false));
  t.push_back(toggle("--log-throughput", G, "TFLOP/s per GPU in TensorBoard",
                     [](Options& o) -> bool& { return o.log_throughput; }));
  t.push_back(number<int>("--log-avg-skip-iterations", "N", G,
                          "leave the first N iterations out of averaged throughput (Primus)",
                          [](Options& o) -> int& { return o.log_avg_skip_iterations; }));
  t.push_back(number<int>("--log-avg-reset-interval", "N", G,
                          "restart the throughput average every N iterations (Primus; 0: never)",
                          [](Options& o) -> int& { return o.log_avg_reset_interval; }));
  t.push_back(text("--metrics-file", "PATH", G, "write one JSON object per logged step",
                   [](Options& o) -> std::string& { return o.metrics_file; }));
  t.push_back(toggle(
      "--no-progress", G, "no live progress line on a terminal",
      [](Options& o) -> bool& { return o.progress; }, false));
}

}  // namespace omni::option_rows
