#include "train/trainer.h"

#include <chrono>
#include <cmath>

#include "base/error.h"
#include "optim/lr_schedule.h"
#include "train/flops.h"

namespace omni {

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
  for (int64_t it = 1; it <= opts_.train_iters; ++it) {
    const auto t0 = clock::now();
    double grad_norm = 0, lr = 0;
    const double loss = train_step(it, &grad_norm, &lr);
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
  }
  result.seconds = std::chrono::duration<double>(clock::now() - run_start).count();
  result.tokens_per_sec = tokens_per_iter * opts_.train_iters / train_seconds;
  return result;
}

}  // namespace omni
