// Learning-rate schedules as Megatron's OptimizerParamScheduler defines them: linear
// warm-up from --lr-warmup-init (0) to --lr over the warm-up iterations, then decay to
// --min-lr.
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
  int64_t warmup_iters = 0;
  double warmup_init = 0.0;  // the learning rate the warm-up starts from
  int64_t decay_iters = 0;   // the iteration where the decay ends (Megatron: --lr-decay-iters)
  LRDecayStyle style = LRDecayStyle::Linear;
  int64_t wsd_decay_iters = 0;  // WSD: length of the final decay phase
  WSDDecayStyle wsd_style = WSDDecayStyle::Exponential;
};

// The learning rate for `iteration` (0-based count of completed steps).
double learning_rate(const LRScheduleConfig& c, int64_t iteration);

}  // namespace omni
