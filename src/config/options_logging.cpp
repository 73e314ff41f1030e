// Megatron's logging and validation groups: console, metrics, TensorBoard, evaluation.
#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "config/option_rows.h"

namespace omni::option_rows {

void add_logging_options(std::vector<OptionDef>& t) {
  const std::string G = "logging";
  t.push_back(number<int>("--log-interval", "N", G, "console and metrics line every N steps",
                          [](Options& o) -> int& { return o.log_interval; }));
  t.push_back(number<int>("--eval-interval", "N", G,
                          "validation every N steps (0: only at the end)",
                          [](Options& o) -> int& { return o.eval_interval; }));
  t.push_back(number<int>("--eval-iters", "N", G,
                          "validation iterations of a global batch each per evaluation",
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
  t.push_back(toggle("--log-params-norm", G,
                     "the parameters' L2 norm on each logged line and in TensorBoard",
                     [](Options& o) -> bool& { return o.log_params_norm; }));
  t.push_back(toggle("--log-num-zeros-in-grad", G,
                     "how many gradient elements are zero, on each logged line and in TensorBoard",
                     [](Options& o) -> bool& { return o.log_num_zeros_in_grad; }));
  t.push_back(toggle("--log-timers-to-tensorboard", G,
                     "the step phases' times (forward-backward, all-grads-sync, optimizer, ...) "
                     "and iteration-time in TensorBoard",
                     [](Options& o) -> bool& { return o.log_timers_to_tensorboard; }));
  t.push_back(toggle("--log-validation-ppl-to-tensorboard", G,
                     "validation perplexity in TensorBoard (lm loss validation ppl)",
                     [](Options& o) -> bool& { return o.log_validation_ppl_to_tensorboard; }));
  t.push_back(number<int>("--logging-level", "N", G,
                          "Python's levels: 10 adds debug lines, 30 hides the set-up lines, 40 "
                          "also the notes (default: MEGATRON_LOGGING_LEVEL, else 20)",
                          [](Options& o) -> int& { return o.logging_level; }));

  const std::string P = "profiling";
  t.push_back(toggle("--profile", P,
                     "write a Chrome trace (chrome://tracing, Perfetto) of the step phases of "
                     "steps --profile-step-start+1 .. --profile-step-end",
                     [](Options& o) -> bool& { return o.profile; }));
  t.push_back(toggle("--use-pytorch-profiler", P,
                     "Megatron's trace format switch; --profile writes omnitron's Chrome trace "
                     "either way, to TENSORBOARD_DIR/../torch_profile as Megatron's",
                     [](Options& o) -> bool& { return o.use_pytorch_profiler; }));
  t.push_back(number<int64_t>("--profile-step-start", "N", P,
                              "profile from the step after iteration N (Megatron's default 10)",
                              [](Options& o) -> int64_t& { return o.profile_step_start; }));
  t.push_back(number<int64_t>("--profile-step-end", "N", P,
                              "profile up to iteration N (Megatron's default 12)",
                              [](Options& o) -> int64_t& { return o.profile_step_end; }));
  OptionDef ranks{"--profile-ranks",
                  "R...",
                  P,
                  "global ranks to profile (default: every rank)",
                  [](Options& o, const std::string& v) {
                    o.profile_ranks.clear();
                    std::istringstream in(v);
                    for (std::string r; in >> r;)
                      o.profile_ranks.push_back(parse_number<int>("--profile-ranks", r));
                  },
                  [](const Options& o) {
                    std::string s;
                    for (int r : o.profile_ranks) {
                      if (!s.empty()) s += ' ';
                      s += std::to_string(r);
                    }
                    return s;
                  }};
  ranks.many = true;
  t.push_back(std::move(ranks));
}

}  // namespace omni::option_rows

namespace omni::option_rows {

void finalize_logging_and_profiling(Options& o) {
  if (o.logging_level == 0) {  // Megatron reads the environment when the flag is absent
    if (const char* env = std::getenv("MEGATRON_LOGGING_LEVEL"); env && *env)
      o.logging_level = parse_number<int>("MEGATRON_LOGGING_LEVEL", env);
  }
  OMNI_REQUIRE(o.logging_level >= 0,
               "--logging-level must be one of Python's levels (10 debug, "
               "20 info, 30 warning, 40 error), got ",
               o.logging_level);
  OMNI_REQUIRE(o.distributed_timeout_minutes >= 0,
               "--distributed-timeout-minutes must be 0 (wait forever) or positive, got ",
               o.distributed_timeout_minutes);
  OMNI_REQUIRE(o.hang_report_seconds >= 0,
               "--hang-report-seconds must be 0 (no first report) or positive, got ",
               o.hang_report_seconds);
  if (o.overlap_param_gather) {
    // Megatron's own checks of the flag.
    OMNI_REQUIRE(o.use_distributed_optimizer,
                 "--overlap-param-gather needs --use-distributed-optimizer (as in Megatron)");
    OMNI_REQUIRE(o.overlap_grad_reduce,
                 "--overlap-param-gather needs --overlap-grad-reduce (as in Megatron)");
  }
  if (!o.profile) return;
  OMNI_REQUIRE(o.profile_step_start >= 0 && o.profile_step_end > o.profile_step_start,
               "--profile-step-start (", o.profile_step_start, ") and --profile-step-end (",
               o.profile_step_end, "): the range must hold a step (0 <= start < end)");
  for (int r : o.profile_ranks) OMNI_REQUIRE(r >= 0, "--profile-ranks: ", r, " is not a rank");
  // Where Megatron's PyTorch profiler writes its traces: beside the TensorBoard directory.
  o.profile_dir = o.tensorboard_dir.empty()
                      ? std::string("torch_profile")
                      : (std::filesystem::path(o.tensorboard_dir) / ".." / "torch_profile")
                            .lexically_normal()
                            .string();
}

}  // namespace omni::option_rows
