// Background prefetch: while the model computes on micro-batch k, a thread reads the
// samples of micro-batch k + 1 (the trainer reads them in order), so reading data never
// stalls a step. Any other access pattern is served directly, with the same result.
#pragma once

#include <future>
#include <memory>
#include <mutex>
#include <vector>

#include "data/datasets/dataset.h"

namespace omni {

class PrefetchingData final : public TrainingData {
 public:
  explicit PrefetchingData(std::unique_ptr<TrainingData> inner);
  ~PrefetchingData() override;

  void train_samples(int64_t first, int count, int seq, int32_t* tokens,
                     int32_t* labels) const override;
  void valid_samples(int64_t first, int count, int seq, int32_t* tokens,
                     int32_t* labels) const override {
    inner_->valid_samples(first, count, seq, tokens, labels);
  }
  std::string describe() const override { return inner_->describe(); }
  std::string train_sample_origin(int64_t k) const override {
    return inner_->train_sample_origin(k);
  }

 private:
  struct Batch {
    int64_t first = -1;
    int count = 0, seq = 0;
    std::vector<int32_t> tokens, labels;
  };
  void start(int64_t first, int count, int seq) const;

  std::unique_ptr<TrainingData> inner_;
  mutable std::future<void> pending_;
  mutable Batch next_;  // written only by the pending task until it is waited for
};

}  // namespace omni
