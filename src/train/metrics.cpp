#include "train/metrics.h"

#include <unistd.h>

#include <cmath>

#include "base/error.h"

namespace omni {

MetricsSink::MetricsSink(const std::string& metrics_file, bool progress, FILE* out)
    : out_(out), jsonl_path_(metrics_file) {
  live_ = progress && out && isatty(fileno(out));
  if (!metrics_file.empty()) {
    jsonl_.open(metrics_file, std::ios::out | std::ios::trunc);
    OMNI_REQUIRE(jsonl_, "--metrics-file: cannot write '", metrics_file, "'");
  }
}

MetricsSink::MetricsSink(const Options& opts, FILE* out)
    : MetricsSink(opts.metrics_file, opts.progress, out) {}

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

static std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

void MetricsSink::write_json(const StepMetrics& m, bool train_fields) {
  if (!jsonl_.is_open()) return;
  jsonl_ << "{\"iteration\": " << m.iteration;
  if (train_fields) {
    jsonl_ << ", \"consumed_samples\": " << m.consumed_samples
           << ", \"lm_loss\": " << json_number(m.lm_loss) << ", \"lr\": " << json_number(m.lr)
           << ", \"grad_norm\": " << json_number(m.grad_norm)
           << ", \"ms_per_iter\": " << json_number(m.ms_per_iter)
           << ", \"tokens_per_sec\": " << json_number(m.tokens_per_sec)
           << ", \"tflops\": " << json_number(m.tflops) << ", \"mfu\": " << json_number(m.mfu);
  }
  if (m.val_loss) jsonl_ << ", \"val_loss\": " << json_number(*m.val_loss);
  jsonl_ << "}\n";
  jsonl_.flush();
  OMNI_REQUIRE(jsonl_, "--metrics-file: writing '", jsonl_path_, "' failed");
}

void MetricsSink::log(const StepMetrics& m) {
  char line[512];
  std::snprintf(line, sizeof line,
                " iteration %8lld/%8lld | consumed samples: %10lld | elapsed time per iteration "
                "(ms): %.1f | learning rate: %.6E | global batch size: %5d | lm loss: %.6E | "
                "grad norm: %.3f | tokens/s: %.0f | TFLOP/s: %.4f | MFU: %.1f%% |",
                (long long)m.iteration, (long long)m.train_iters, (long long)m.consumed_samples,
                m.ms_per_iter, m.lr, m.global_batch_size, m.lm_loss, m.grad_norm, m.tokens_per_sec,
                m.tflops, 100.0 * m.mfu);
  message(line);
  write_json(m, true);
}

void MetricsSink::log_validation(const StepMetrics& m) {
  char line[256];
  std::snprintf(line, sizeof line,
                " validation loss at iteration %lld | lm loss value: %.6E | lm loss PPL: %.6E |",
                (long long)m.iteration, *m.val_loss, std::exp(*m.val_loss));
  message(line);
  write_json(m, false);
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
