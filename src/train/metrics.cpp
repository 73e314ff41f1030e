#include "train/metrics.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <sstream>

#include "base/error.h"
#include "train/tensorboard.h"

namespace omni {

ProcessMemory process_memory() {
  // VmHWM and VmRSS are read together, so the peak is never below the current figure (the
  // kernel folds the current RSS into VmHWM when it reports it).
  ProcessMemory m;
  if (FILE* f = std::fopen("/proc/self/status", "r")) {
    char line[256];
    long long kb = 0;
    while (std::fgets(line, sizeof line, f)) {
      if (std::sscanf(line, "VmRSS: %lld kB", &kb) == 1) m.rss_bytes = kb * 1024;
      if (std::sscanf(line, "VmHWM: %lld kB", &kb) == 1) m.max_rss_bytes = kb * 1024;
    }
    std::fclose(f);
  }
  if (m.max_rss_bytes == 0) {
    rusage usage{};
    if (getrusage(RUSAGE_SELF, &usage) == 0) m.max_rss_bytes = int64_t(usage.ru_maxrss) * 1024;
  }
  return m;
}

MetricsSink::MetricsSink(const std::string& metrics_file, bool progress, FILE* out)
    : out_(out), jsonl_path_(metrics_file) {
  live_ = progress && out && isatty(fileno(out));
  if (!metrics_file.empty()) {
    jsonl_.open(metrics_file, std::ios::out | std::ios::trunc);
    OMNI_REQUIRE(jsonl_, "--metrics-file: cannot write '", metrics_file, "'");
  }
}

MetricsSink::MetricsSink(const Options& opts, FILE* out)
    : MetricsSink(opts.metrics_file, opts.progress, out) {
  OMNI_REQUIRE(opts.tensorboard_log_interval > 0,
               "--tensorboard-log-interval must be positive (got ", opts.tensorboard_log_interval,
               ")");
  OMNI_REQUIRE(opts.log_avg_skip_iterations >= 0, "--log-avg-skip-iterations must be >= 0 (got ",
               opts.log_avg_skip_iterations, ")");
  OMNI_REQUIRE(opts.log_avg_reset_interval >= 0, "--log-avg-reset-interval must be >= 0 (got ",
               opts.log_avg_reset_interval, ")");
  log_interval_ = opts.log_interval;
  tensorboard_log_interval_ = opts.tensorboard_log_interval;
  log_memory_to_tensorboard_ = opts.log_memory_to_tensorboard;
  log_loss_scale_to_tensorboard_ = opts.log_loss_scale_to_tensorboard;
  log_validation_ppl_to_tensorboard_ = opts.log_validation_ppl_to_tensorboard;
  log_throughput_ = opts.log_throughput;
  log_avg_skip_iterations_ = opts.log_avg_skip_iterations;
  log_avg_reset_interval_ = opts.log_avg_reset_interval;
  if (!opts.tensorboard_dir.empty()) {
    tensorboard_ = std::make_unique<TensorBoardWriter>(opts.tensorboard_dir);
    if (opts.logging_level <= 20) message("  tensorboard: " + tensorboard_->path());
  }
}

MetricsSink::~MetricsSink() = default;

std::string MetricsSink::tensorboard_file() const {
  return tensorboard_ ? tensorboard_->path() : std::string();
}

void MetricsSink::clear_progress() {
  if (progress_shown_) std::fputs("\r\033[K", out_);
  progress_shown_ = false;
}

void MetricsSink::message(const std::string& line) {
  if (!out_) return;
  clear_progress();
  std::fprintf(out_, "%s\n", line.c_str());
  std::fflush(out_);
}

namespace {

std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

// printf onto the end of a string.
[[gnu::format(printf, 2, 3)]] void appendf(std::string& s, const char* format, ...) {
  char buf[256];
  va_list args;
  va_start(args, format);
  std::vsnprintf(buf, sizeof buf, format, args);
  va_end(args);
  s += buf;
}

}  // namespace

// Primus (MegatronTrainer's throughput average): the window restarts at the first counted
// line and whenever it holds reset_interval values (0: never); lines before the first
// counted one are left out.
std::optional<double> MetricsSink::RunningAverage::add(double v, bool counted, bool restart,
                                                       int reset_interval) {
  if (!counted) return std::nullopt;
  if (restart || (reset_interval > 0 && int(values.size()) >= reset_interval)) values.clear();
  values.push_back(v);
  double sum = 0;
  for (double x : values) sum += x;
  return sum / double(values.size());
}

void MetricsSink::write_tensorboard(const StepMetrics& m, const ProcessMemory& mem) {
  // Megatron's tags: each scalar against the iteration, and again against the samples
  // consumed ("... vs samples").
  const auto both = [&](const std::string& tag, double v) {
    tensorboard_->add_scalar(tag, v, m.iteration);
    tensorboard_->add_scalar(tag + " vs samples", v, m.consumed_samples);
  };
  both("learning-rate", m.lr);
  both("batch-size", m.global_batch_size);
  if (m.iterations > m.skipped_iterations) both("lm loss", m.lm_loss);
  for (const auto& [name, value] : m.moe.losses) tensorboard_->add_scalar(name, value, m.iteration);
  if (log_loss_scale_to_tensorboard_) both("loss-scale", m.loss_scale);
  both("grad-norm", m.grad_norm);
  if (m.num_zeros_in_grad) both("num-zeros", double(*m.num_zeros_in_grad));
  if (m.params_norm) both("params-norm", *m.params_norm);
  if (log_memory_to_tensorboard_) {
    tensorboard_->add_scalar("mem-rss-bytes", double(mem.rss_bytes), m.iteration);
    tensorboard_->add_scalar("mem-max-rss-bytes", double(mem.max_rss_bytes), m.iteration);
  }
}

void MetricsSink::log(const StepMetrics& m) {
  OMNI_CHECK(m.iterations > 0 && m.skipped_iterations <= m.iterations &&
                 m.nan_iterations <= m.skipped_iterations,
             "a report covers ", m.iterations, " steps with ", m.skipped_iterations, " skipped, ",
             m.nan_iterations, " NaN");
  const double seconds = m.ms_per_iter / 1000.0 * double(m.iterations);
  const int64_t advanced = m.iterations - m.skipped_iterations;
  window_.loss_sum += m.lm_loss * double(advanced);
  for (const auto& [name, value] : m.moe.losses) {
    auto& sums = window_.moe_loss_sums;
    auto it =
        std::find_if(sums.begin(), sums.end(), [&](const auto& s) { return s.first == name; });
    if (it == sums.end()) it = sums.insert(sums.end(), {name, 0.0});
    it->second += value * double(advanced);
  }
  window_.advanced += advanced;
  window_.iterations += m.iterations;
  window_.skipped += m.skipped_iterations;
  window_.nan += m.nan_iterations;
  window_.seconds += seconds;
  window_.tokens += m.tokens_per_sec * seconds;
  window_.flop += m.tflops * seconds;
  window_.mfu_seconds += m.mfu * seconds;
  iterations_seen_ += m.iterations;

  const bool to_tensorboard = tensorboard_ && m.iteration % tensorboard_log_interval_ == 0;
  const bool log_line = m.iteration % log_interval_ == 0 || m.iteration == m.train_iters;
  if (to_tensorboard) write_tensorboard(m, process_memory());
  if (log_line) log_window(m);
  if (tensorboard_ && (to_tensorboard || log_line)) tensorboard_->flush();
}

void MetricsSink::log_window(const StepMetrics& last) {
  const Window w = window_;
  window_ = Window{};
  const double seconds = w.seconds / double(w.iterations);
  const double tokens_per_sec = w.seconds > 0 ? w.tokens / w.seconds : 0.0;
  const double tflops = w.seconds > 0 ? w.flop / w.seconds : 0.0;
  const double mfu = w.seconds > 0 ? w.mfu_seconds / w.seconds : 0.0;
  // NaN (null in the metrics file) when every update of the window was skipped.
  const double loss = w.advanced > 0 ? w.loss_sum / double(w.advanced) : NAN;
  const bool counted = iterations_seen_ > log_avg_skip_iterations_;
  const bool restart = counted && !averaging_;
  averaging_ = averaging_ || counted;
  const auto avg_tokens =
      avg_tokens_.add(tokens_per_sec, counted, restart, log_avg_reset_interval_);
  const auto avg_tflops = avg_tflops_.add(tflops, counted, restart, log_avg_reset_interval_);
  const ProcessMemory mem = process_memory();

  // Megatron's fields in Megatron's order, then ours (tokens/s, TFLOP/s with Primus's
  // running average after the slash, MFU, memory).
  std::string line;
  appendf(line, " iteration %8lld/%8lld | consumed samples: %12lld |", (long long)last.iteration,
          (long long)last.train_iters, (long long)last.consumed_samples);
  appendf(line, " elapsed time per iteration (ms): %.1f |", 1000.0 * seconds);
  appendf(line, " learning rate: %.6E | global batch size: %5d |", last.lr, last.global_batch_size);
  if (w.advanced > 0) appendf(line, " lm loss: %.6E |", loss);
  if (w.advanced > 0)  // Megatron's total_loss_dict entries beside lm loss
    for (const auto& [name, sum] : w.moe_loss_sums)
      appendf(line, " %s: %.6E |", name.c_str(), sum / double(w.advanced));
  appendf(line, " loss scale: %.1f | grad norm: %.3f |", last.loss_scale, last.grad_norm);
  if (last.num_zeros_in_grad)
    appendf(line, " num zeros: %lld |", (long long)*last.num_zeros_in_grad);
  if (last.params_norm) appendf(line, " params norm: %.3f |", *last.params_norm);
  appendf(line, " number of skipped iterations: %3lld | number of nan iterations: %3lld |",
          (long long)w.skipped, (long long)w.nan);
  appendf(line, " tokens/s: %.0f", tokens_per_sec);
  if (avg_tokens) appendf(line, "/%.0f", *avg_tokens);
  appendf(line, " | TFLOP/s: %.4f", tflops);
  if (avg_tflops) appendf(line, "/%.4f", *avg_tflops);
  appendf(line, " | MFU: %.1f%% | max RSS (MB): %.0f |", 100.0 * mfu,
          double(mem.max_rss_bytes) / (1 << 20));
  message(line);
  std::string moe_json;
  log_moe_window(last, w, moe_json);

  if (tensorboard_) {
    tensorboard_->add_scalar("iteration-time", seconds, last.iteration);
    if (log_throughput_) tensorboard_->add_scalar("throughput", tflops, last.iteration);
    for (const auto& [name, value] : last.timers)
      tensorboard_->add_scalar(name + "-time", value, last.iteration);
  }
  if (!jsonl_.is_open()) return;
  std::ostringstream json;
  json << "{\"iteration\": " << last.iteration
       << ", \"consumed_samples\": " << last.consumed_samples
       << ", \"lm_loss\": " << json_number(loss) << ", \"lr\": " << json_number(last.lr)
       << ", \"grad_norm\": " << json_number(last.grad_norm)
       << ", \"loss_scale\": " << json_number(last.loss_scale)
       << ", \"skipped_iterations\": " << w.skipped << ", \"nan_iterations\": " << w.nan
       << ", \"ms_per_iter\": " << json_number(1000.0 * seconds)
       << ", \"tokens_per_sec\": " << json_number(tokens_per_sec)
       << ", \"tflops\": " << json_number(tflops) << ", \"mfu\": " << json_number(mfu);
  if (last.params_norm) json << ", \"params_norm\": " << json_number(*last.params_norm);
  if (last.num_zeros_in_grad) json << ", \"num_zeros_in_grad\": " << *last.num_zeros_in_grad;
  if (avg_tokens) json << ", \"avg_tokens_per_sec\": " << json_number(*avg_tokens);
  if (avg_tflops) json << ", \"avg_tflops\": " << json_number(*avg_tflops);
  json << moe_json;
  json << ", \"rss_bytes\": " << mem.rss_bytes << ", \"max_rss_bytes\": " << mem.max_rss_bytes
       << "}";
  write_json(json.str());
}

// The window's mean MoE losses (JSON) and the last step's expert token counts: a console
// line, TensorBoard's moe/ scalars, and JSON, for every MoE layer.
void MetricsSink::log_moe_window(const StepMetrics& last, const Window& w, std::string& json) {
  if (w.advanced > 0)
    for (const auto& [name, sum] : w.moe_loss_sums)
      json += ", \"" + name + "\": " + json_number(sum / double(w.advanced));
  if (last.moe.tokens.empty()) return;
  std::string line = " MoE tokens per expert (min/max, max/mean) |";
  json += ", \"moe_tokens_per_expert\": [";
  for (size_t i = 0; i < last.moe.tokens.size(); ++i) {
    const MoEStepMetrics::LayerTokens& t = last.moe.tokens[i];
    const double imbalance = t.mean > 0 ? t.max / t.mean : 0.0;
    appendf(line, " layer %d: %.0f/%.0f, %.2f |", t.layer, t.min, t.max, imbalance);
    json += std::string(i ? ", " : "") + "{\"layer\": " + std::to_string(t.layer) +
            ", \"min\": " + json_number(t.min) + ", \"max\": " + json_number(t.max) +
            ", \"imbalance\": " + json_number(imbalance) + "}";
    if (tensorboard_) {
      const std::string layer = "_layer_" + std::to_string(t.layer);
      tensorboard_->add_scalar("moe/tokens_per_expert_min" + layer, t.min, last.iteration);
      tensorboard_->add_scalar("moe/tokens_per_expert_max" + layer, t.max, last.iteration);
    }
  }
  json += "]";
  message(line);
}

void MetricsSink::write_json(const std::string& object) {
  if (!jsonl_.is_open()) return;
  jsonl_ << object << "\n";
  jsonl_.flush();
  OMNI_REQUIRE(jsonl_, "--metrics-file: writing '", jsonl_path_, "' failed");
}

void MetricsSink::log_validation(const StepMetrics& m) {
  char line[256];
  std::snprintf(line, sizeof line,
                " validation loss at iteration %lld | lm loss value: %.6E | lm loss PPL: %.6E |",
                (long long)m.iteration, *m.val_loss, std::exp(*m.val_loss));
  message(line);
  if (tensorboard_) {
    tensorboard_->add_scalar("lm loss validation", *m.val_loss, m.iteration);
    tensorboard_->add_scalar("lm loss validation vs samples", *m.val_loss, m.consumed_samples);
    if (log_validation_ppl_to_tensorboard_) {  // Megatron caps the exponent at 20
      const double ppl = std::exp(std::min(20.0, *m.val_loss));
      tensorboard_->add_scalar("lm loss validation ppl", ppl, m.iteration);
      tensorboard_->add_scalar("lm loss validation ppl vs samples", ppl, m.consumed_samples);
    }
    tensorboard_->flush();
  }
  write_json("{\"iteration\": " + std::to_string(m.iteration) +
             ", \"val_loss\": " + json_number(*m.val_loss) + "}");
}

void MetricsSink::log_task(const TaskMetrics& m) {
  char line[512];
  std::snprintf(line, sizeof line,
                " downstream task %s at iteration %lld | examples: %lld | acc: %.4f +- %.4f | "
                "acc_norm: %.4f +- %.4f |",
                m.task.c_str(), (long long)m.iteration, (long long)m.examples, m.acc, m.acc_stderr,
                m.acc_norm, m.acc_norm_stderr);
  message(line);
  if (tensorboard_) {
    for (const auto& [name, value] :
         {std::pair{" acc", m.acc}, std::pair{" acc_norm", m.acc_norm}}) {
      tensorboard_->add_scalar(m.task + name, value, m.iteration);
      tensorboard_->add_scalar(m.task + name + " vs samples", value, m.consumed_samples);
    }
    tensorboard_->flush();
  }
  write_json("{\"iteration\": " + std::to_string(m.iteration) +
             ", \"consumed_samples\": " + std::to_string(m.consumed_samples) + ", \"task\": \"" +
             m.task + "\", \"examples\": " + std::to_string(m.examples) +
             ", \"acc\": " + json_number(m.acc) + ", \"acc_stderr\": " + json_number(m.acc_stderr) +
             ", \"acc_norm\": " + json_number(m.acc_norm) +
             ", \"acc_norm_stderr\": " + json_number(m.acc_norm_stderr) + "}");
}

void MetricsSink::progress(int64_t it, int64_t total, double loss, double sec_per_iter) {
  if (!live_) return;
  constexpr int kWidth = 30;
  const int filled = static_cast<int>(kWidth * double(it) / double(total));
  std::string bar(filled, '#');
  bar.resize(kWidth, '.');
  const long eta = static_cast<long>(sec_per_iter * double(total - it));
  std::fprintf(out_, "\r\033[K[%s] %lld/%lld  loss %.4f  %.2f s/it  ETA %ldm%02lds", bar.c_str(),
               (long long)it, (long long)total, loss, sec_per_iter, eta / 60, eta % 60);
  std::fflush(out_);
  progress_shown_ = true;
}

}  // namespace omni
