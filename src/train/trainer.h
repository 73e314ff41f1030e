// The training loop: micro-batches with gradient accumulation, global-norm clipping,
// the LR schedule, the optimizer step, periodic evaluation and metrics.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "config/options.h"
#include "data/dataset.h"
#include "model/gpt_model.h"
#include "optim/optimizer.h"
#include "train/document_masks.h"
#include "train/metrics.h"

namespace omni {

struct TrainResult {
  std::vector<double> train_losses;                    // one per iteration
  std::vector<double> step_seconds;                    // one per iteration
  std::vector<std::pair<int64_t, double>> val_losses;  // (iteration, loss)
  double tokens_per_sec = 0;                           // over the whole run
  double seconds = 0;
};

class Trainer {
 public:
  // `opts` must be finalized. peak_gflops is the machine's rate MFU is measured against
  // (0: not reported). eod is the tokenizer's end-of-document id, needed by
  // --eod-mask-loss, --reset-position-ids and --reset-attention-mask.
  Trainer(const Options& opts, std::unique_ptr<TrainingData> data, double peak_gflops = 0,
          std::optional<int32_t> eod = std::nullopt);
  TrainResult run(MetricsSink& sink);
  // Mean validation loss over --eval-iters micro-batches.
  double evaluate();
  GPTModel<float>& model() { return model_; }

 private:
  double train_step(int64_t iteration, double* grad_norm, double* lr);
  // The micro-batch over tokens_/labels_, with document masks when the options ask for them.
  MicroBatch micro_batch();

  Options opts_;
  std::unique_ptr<TrainingData> data_;
  double peak_gflops_;
  GPTModel<float> model_;
  Optimizer<float> optimizer_;
  int64_t consumed_samples_ = 0;
  DocumentMaskOptions doc_masks_;
  std::vector<int32_t> tokens_, labels_, positions_, key_start_;
  std::vector<float> loss_mask_;
};

}  // namespace omni
