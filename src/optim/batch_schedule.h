// The global batch of each step, as Megatron's number-of-micro-batches calculator sets it:
// constant (--global-batch-size), or ramped up with --rampup-batch-size START INCR SAMPLES
// from START by INCR over the first SAMPLES training samples, each of the
// (global - START) / INCR increments lasting SAMPLES / increments samples. The number of
// micro-batches per step is that batch / (--micro-batch-size x data-parallel size).
//
// (Megatron-LM replaced this calculator by --step-batch-size-schedule in April 2026 and now
// ignores --rampup-batch-size with a deprecation warning; this is the meaning the flag had
// in every release that honoured it: RampupBatchsizeNumMicroBatchesCalculator and
// update_train_iters before Megatron-LM commit 532ad92.)
#pragma once

#include <cstdint>

namespace omni {

struct BatchSchedule {
  int global_batch_size = 0;  // the batch after the ramp (and throughout without one)
  // --rampup-batch-size; start 0: no ramp.
  int rampup_start = 0, rampup_increment = 0;
  int64_t rampup_samples = 0;

  bool ramps() const { return rampup_start > 0; }
  // The global batch of the step that starts after `consumed` training samples.
  int batch_at(int64_t consumed) const;
  // Megatron's update_train_iters for --train-samples: the steps that fit in `train_samples`
  // (the ramp's steps while at most rampup_samples, and at most train_samples, were consumed,
  // then whole constant batches; a partial last batch is dropped).
  int64_t iterations_for(int64_t train_samples) const;
  // Samples consumed by the first `iterations` steps.
  int64_t samples_after(int64_t iterations) const;
};

}  // namespace omni
