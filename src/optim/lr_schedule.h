// Learning-rate schedules as Megatron's OptimizerParamScheduler defines them: linear
// warm-up from --lr-warmup-init (0) to --lr over the warm-up steps, then decay to --min-lr.
// Like Megatron's, the schedule counts steps in samples: each successful update advances it
// by that step's global batch, so iteration-based options are multiplied by
// --global-batch-size and sample-based ones (--lr-warmup-samples ...) are used as given,
// and a ramping batch (--rampup-batch-size) moves it by each step's own batch.
#pragma once

#include <cstdint>
#include <string>

namespace omni {

enum class LRDecayStyle { Constant, Linear, Cosine, InverseSquareRoot, WSD };
enum class WSDDecayStyle { Linear, Cosine, Exponential, MinusSqrt };

LRDecayStyle parse_lr_decay_style(const std::string& s);
WSDDecayStyle parse_wsd_decay_style(const std::string& s);

struct LRScheduleConfig {
  double lr = 1e-4;
  double min_lr = 0.0;
  double warmup_steps = 0;   // Megatron's lr_warmup_steps (a fraction of the decay may be
                             // fractional)
  double warmup_init = 0.0;  // the learning rate the warm-up starts from
  int64_t decay_steps = 0;   // where the decay ends (Megatron's lr_decay_steps)
  LRDecayStyle style = LRDecayStyle::Linear;
  int64_t wsd_decay_steps = 0;  // WSD: length of the final decay phase
  WSDDecayStyle wsd_style = WSDDecayStyle::Exponential;
};

// The learning rate after `steps` (Megatron's num_steps: samples of the completed updates).
double learning_rate(const LRScheduleConfig& c, int64_t steps);

}  // namespace omni
