#include "optim/batch_schedule.h"

namespace omni {

int BatchSchedule::batch_at(int64_t consumed) const {
  if (!ramps() || consumed > rampup_samples) return global_batch_size;
  const int increments = (global_batch_size - rampup_start) / rampup_increment;
  // Megatron divides in floating point: samples per increment need not be whole.
  const double per_increment = static_cast<double>(rampup_samples) / increments;
  const auto steps = static_cast<int64_t>(static_cast<double>(consumed) / per_increment);
  return rampup_start + static_cast<int>(steps) * rampup_increment;
}

int64_t BatchSchedule::iterations_for(int64_t train_samples) const {
  if (!ramps()) return train_samples / global_batch_size;
  int64_t iterations = 0, consumed = 0;
  while (consumed <= rampup_samples && consumed <= train_samples) {
    consumed += batch_at(consumed);
    ++iterations;
  }
  if (train_samples > consumed) iterations += (train_samples - consumed) / global_batch_size;
  return iterations;
}

int64_t BatchSchedule::samples_after(int64_t iterations) const {
  int64_t consumed = 0;
  for (int64_t i = 0; i < iterations; ++i) {
    if (!ramps() || consumed > rampup_samples)
      return consumed + (iterations - i) * global_batch_size;
    consumed += batch_at(consumed);
  }
  return consumed;
}

}  // namespace omni
