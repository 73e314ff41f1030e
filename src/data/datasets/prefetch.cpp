#include "data/datasets/prefetch.h"

#include <algorithm>

namespace omni {

PrefetchingData::PrefetchingData(std::unique_ptr<TrainingData> inner) : inner_(std::move(inner)) {}

PrefetchingData::~PrefetchingData() {
  if (pending_.valid()) pending_.wait();
}

void PrefetchingData::start(int64_t first, int count, int seq) const {
  next_.first = first, next_.count = count, next_.seq = seq;
  next_.tokens.resize(static_cast<size_t>(count) * seq);
  next_.labels.resize(static_cast<size_t>(count) * seq);
  pending_ = std::async(std::launch::async, [this] {
    inner_->train_samples(next_.first, next_.count, next_.seq, next_.tokens.data(),
                          next_.labels.data());
  });
}

void PrefetchingData::train_samples(int64_t first, int count, int seq, int32_t* tokens,
                                    int32_t* labels) const {
  bool hit = false;
  if (pending_.valid()) {
    // get() rethrows what the background read threw (e.g. past the end of the data); a
    // failed prefetch of a batch that is not wanted is ignored.
    try {
      pending_.get();
      hit = next_.first == first && next_.count == count && next_.seq == seq;
    } catch (...) {
      if (next_.first == first && next_.count == count && next_.seq == seq) throw;
    }
  }
  if (hit) {
    std::copy(next_.tokens.begin(), next_.tokens.end(), tokens);
    std::copy(next_.labels.begin(), next_.labels.end(), labels);
  } else {
    inner_->train_samples(first, count, seq, tokens, labels);
  }
  start(first + count, count, seq);
}

}  // namespace omni
