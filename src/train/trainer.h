// The training loop: micro-batches with gradient accumulation, global-norm clipping,
// the LR schedule, the optimizer step, periodic evaluation and metrics.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "config/options.h"
#include "data/dataset.h"
#include "model/gpt_model.h"
#include "optim/optimizer.h"
#include "train/document_masks.h"
#include "train/metrics.h"

namespace omni {

struct TrainResult {
  std::vector<double> train_losses;                    // one per iteration run
  std::vector<double> step_seconds;                    // one per iteration
  std::vector<std::pair<int64_t, double>> val_losses;  // (iteration, loss)
  double tokens_per_sec = 0;                           // over the whole run
  double seconds = 0;
  // train_losses[0] is iteration first_iteration (the step after a loaded checkpoint);
  // last_iteration is the last step run (or loaded, when none ran).
  int64_t first_iteration = 1, last_iteration = 0;
  // Why the run stopped before --train-iters: "exit interval", "exit duration" or
  // "signal"; empty when it ran to the end.
  std::string exit_reason;
  std::vector<std::string> saved;  // checkpoint directories written, in order
};

class Trainer {
 public:
  // `opts` must be finalized. peak_gflops is the machine's rate MFU is measured against
  // (0: not reported). eod is the tokenizer's end-of-document id, needed by
  // --eod-mask-loss, --reset-position-ids and --reset-attention-mask.
  // With --load, the model (and unless --finetune the optimizer, iteration and data
  // position) come from the checkpoint; with --exit-signal-handler, SIGTERM and SIGINT
  // are caught from construction to destruction.
  Trainer(const Options& opts, std::unique_ptr<TrainingData> data, double peak_gflops = 0,
          std::optional<int32_t> eod = std::nullopt);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;
  // Trains from the current iteration to --train-iters, saving every --save-interval
  // and at the end; stops early (after saving) on --exit-interval,
  // --exit-duration-in-mins or a caught signal.
  TrainResult run(MetricsSink& sink);
  // Writes a checkpoint of the current state to --save; returns its directory.
  std::string save(MetricsSink& sink);
  // Mean validation loss over --eval-iters micro-batches.
  double evaluate();
  GPTModel<float>& model() { return model_; }
  int64_t iteration() const { return iteration_; }
  int64_t consumed_samples() const { return consumed_samples_; }

 private:
  double train_step(int64_t iteration, double* grad_norm, double* lr);
  // The micro-batch over tokens_/labels_, with document masks when the options ask for them.
  MicroBatch micro_batch();

  Options opts_;
  std::unique_ptr<TrainingData> data_;
  double peak_gflops_;
  GPTModel<float> model_;
  Optimizer<float> optimizer_;
  int64_t iteration_ = 0;  // completed steps
  int64_t consumed_samples_ = 0;
  int64_t last_saved_ = -1;
  bool signal_handler_installed_ = false;
  DocumentMaskOptions doc_masks_;
  std::vector<int32_t> tokens_, labels_, positions_, key_start_;
  std::vector<float> loss_mask_;
};

}  // namespace omni
