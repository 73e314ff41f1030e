#include "train/trainer.h"

#include <chrono>
#include <cmath>
#include <csignal>

#include "base/error.h"
#include "checkpoint/checkpoint.h"
#include "optim/lr_schedule.h"
#include "train/flops.h"

namespace omni {

namespace {

// Megatron's --exit-signal-handler: the handler only records the signal; the training
// loop checks after each step, saves and returns (library code never exits the process).
volatile std::sig_atomic_t g_exit_signal = 0;
struct sigaction g_previous_term, g_previous_int;

extern "C" void record_exit_signal(int signal) {
  g_exit_signal = signal;
}

void install_exit_signal_handler() {
  g_exit_signal = 0;
  struct sigaction sa = {};
  sa.sa_handler = record_exit_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, &g_previous_term);
  sigaction(SIGINT, &sa, &g_previous_int);
}

void restore_signal_handlers() {
  sigaction(SIGTERM, &g_previous_term, nullptr);
  sigaction(SIGINT, &g_previous_int, nullptr);
}

}  // namespace

Trainer::Trainer(const Options& opts, std::unique_ptr<TrainingData> data, double peak_gflops,
                 std::optional<int32_t> eod)
    : opts_(opts),
      data_(std::move(data)),
      peak_gflops_(peak_gflops),
      model_(opts.model, opts.micro_batch_size, static_cast<uint64_t>(opts.seed)),
      optimizer_(opts.optim, model_.params()) {
  const size_t n = size_t(opts.micro_batch_size) * opts.model.seq_length;
  tokens_.resize(n);
  labels_.resize(n);
  doc_masks_ = {eod.value_or(-1), opts.reset_position_ids, opts.reset_attention_mask,
                opts.eod_mask_loss};
  if (doc_masks_.any()) {
    OMNI_REQUIRE(eod.has_value(), "--eod-mask-loss, --reset-position-ids and "
                 "--reset-attention-mask need a tokenizer with an end-of-document token "
                 "(--tokenizer-type)");
    positions_.resize(n);
    key_start_.resize(n);
    loss_mask_.resize(n);
  }
  if (!opts_.load.empty()) {
    // --finetune takes the weights only; --no-load-optim keeps the position but starts
    // the optimizer afresh. (--no-load-rng: there is no RNG state; see checkpoint.h.)
    const bool resume = !opts_.finetune;
    const TrainingProgress p = load_checkpoint(
        opts_.load, model_.params(), resume && !opts_.no_load_optim ? &optimizer_ : nullptr);
    if (resume) {
      iteration_ = p.iteration;
      consumed_samples_ = p.consumed_samples;
    }
  }
  if (opts_.exit_signal_handler) {
    install_exit_signal_handler();
    signal_handler_installed_ = true;
  }
}

Trainer::~Trainer() {
  if (signal_handler_installed_) restore_signal_handlers();
}

std::string Trainer::save(MetricsSink& sink) {
  OMNI_REQUIRE(!opts_.save.empty(), "saving a checkpoint needs --save DIR");
  const std::string dir = save_checkpoint(opts_.save, opts_, {iteration_, consumed_samples_},
                                          model_.params(), optimizer_);
  last_saved_ = iteration_;
  sink.message("saved checkpoint at iteration " + std::to_string(iteration_) + " to " + dir);
  return dir;
}

MicroBatch Trainer::micro_batch() {
  const int mb = opts_.micro_batch_size, seq = opts_.model.seq_length;
  if (!doc_masks_.any()) return {tokens_.data(), labels_.data(), nullptr, mb, seq};
  document_masks(tokens_.data(), mb, seq, doc_masks_, positions_.data(), key_start_.data(),
                 loss_mask_.data());
  return {tokens_.data(),    labels_.data(),
          loss_mask_.data(), mb,
          seq,               doc_masks_.reset_position_ids ? positions_.data() : nullptr,
          doc_masks_.reset_attention_mask ? key_start_.data() : nullptr};
}

double Trainer::train_step(int64_t iteration, double* grad_norm, double* lr) {
  const int mb = opts_.micro_batch_size, seq = opts_.model.seq_length;
  const int accum = opts_.grad_accumulation_steps();
  model_.params().zero_grads();
  double loss = 0;
  for (int m = 0; m < accum; ++m) {
    data_->train_samples(micro_batch_first_sample(consumed_samples_, m, mb,
                                                  opts_.data_parallel_rank,
                                                  opts_.data_parallel_size),
                         mb, seq, tokens_.data(), labels_.data());
    // Each micro-batch's mean loss is scaled by 1/accum, so the accumulated gradient is
    // that of the global batch's mean loss.
    loss += model_.forward_backward(micro_batch(), 1.0 / accum);
  }
  consumed_samples_ += opts_.global_batch_size;
  loss /= accum;
  *grad_norm = gradient_norm(model_.params());
  OMNI_REQUIRE(std::isfinite(*grad_norm), "iteration ", iteration,
               ": the gradient norm is not finite (lm loss ", loss,
               "); lower --lr or enable --clip-grad");
  // Megatron: clip_coeff = max_norm / (total_norm + 1e-6), applied when below 1.
  if (opts_.optim.clip_grad > 0) {
    const double coeff = opts_.optim.clip_grad / (*grad_norm + 1e-6);
    if (coeff < 1.0) scale_gradients(model_.params(), coeff);
  }
  *lr = learning_rate(opts_.lr_schedule, iteration - 1);
  optimizer_.step(model_.params(), *lr);
  return loss;
}

double Trainer::evaluate() {
  const int mb = opts_.micro_batch_size, seq = opts_.model.seq_length;
  double sum = 0;
  for (int i = 0; i < opts_.eval_iters; ++i) {
    data_->valid_samples(int64_t(i) * mb, mb, seq, tokens_.data(), labels_.data());
    sum += model_.forward_loss(micro_batch());
  }
  return opts_.eval_iters ? sum / opts_.eval_iters : NAN;
}

TrainResult Trainer::run(MetricsSink& sink) {
  using clock = std::chrono::steady_clock;
  TrainResult result;
  const double flops_per_iter = megatron_flops_per_iteration(opts_.model, opts_.global_batch_size);
  const double tokens_per_iter = double(opts_.global_batch_size) * opts_.model.seq_length;
  const auto run_start = clock::now();
  double window_loss = 0, window_seconds = 0, train_seconds = 0;
  int window_iters = 0;
  result.first_iteration = iteration_ + 1;
  for (int64_t it = iteration_ + 1; it <= opts_.train_iters; ++it) {
    const auto t0 = clock::now();
    double grad_norm = 0, lr = 0;
    const double loss = train_step(it, &grad_norm, &lr);
    iteration_ = it;
    const double step_seconds = std::chrono::duration<double>(clock::now() - t0).count();
    train_seconds += step_seconds;
    window_seconds += step_seconds;
    result.train_losses.push_back(loss);
    result.step_seconds.push_back(step_seconds);
    window_loss += loss;
    ++window_iters;
    sink.progress(it, opts_.train_iters, loss, step_seconds);

    StepMetrics m;
    m.iteration = it;
    m.train_iters = opts_.train_iters;
    m.consumed_samples = consumed_samples_;
    m.global_batch_size = opts_.global_batch_size;
    if (it % opts_.log_interval == 0 || it == opts_.train_iters) {
      const double seconds = window_seconds / window_iters;
      m.lm_loss = window_loss / window_iters;
      m.lr = lr;
      m.grad_norm = grad_norm;
      m.ms_per_iter = 1000.0 * seconds;
      m.tokens_per_sec = tokens_per_iter / seconds;
      m.tflops = flops_per_iter / seconds / 1e12;
      m.mfu = peak_gflops_ > 0 ? flops_per_iter / seconds / (peak_gflops_ * 1e9) : 0.0;
      sink.log(m);
      window_loss = window_seconds = 0;
      window_iters = 0;
    }
    const bool eval_now =
        opts_.eval_iters > 0 &&
        ((opts_.eval_interval > 0 && it % opts_.eval_interval == 0) || it == opts_.train_iters);
    if (eval_now) {
      m.val_loss = evaluate();
      result.val_losses.emplace_back(it, *m.val_loss);
      sink.log_validation(m);
    }
    if (!opts_.save.empty() && opts_.save_interval > 0 && it % opts_.save_interval == 0)
      result.saved.push_back(save(sink));
    const double minutes = std::chrono::duration<double>(clock::now() - run_start).count() / 60;
    if (opts_.exit_interval > 0 && it % opts_.exit_interval == 0)
      result.exit_reason = "exit interval";
    else if (opts_.exit_duration_in_mins > 0 && minutes >= opts_.exit_duration_in_mins)
      result.exit_reason = "exit duration";
    else if (signal_handler_installed_ && g_exit_signal != 0)
      result.exit_reason = "signal";
    if (!result.exit_reason.empty() && it < opts_.train_iters) {
      sink.message("exiting at iteration " + std::to_string(it) + " (" + result.exit_reason + ")");
      break;
    }
    result.exit_reason.clear();
  }
  // Megatron saves at the end unless the last step was just saved.
  const int64_t steps_run = int64_t(result.train_losses.size());
  if (!opts_.save.empty() && steps_run > 0 && last_saved_ != iteration_)
    result.saved.push_back(save(sink));
  result.last_iteration = iteration_;
  result.seconds = std::chrono::duration<double>(clock::now() - run_start).count();
  result.tokens_per_sec = steps_run > 0 ? tokens_per_iter * steps_run / train_seconds : 0.0;
  return result;
}

}  // namespace omni
