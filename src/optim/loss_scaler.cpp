#include "optim/loss_scaler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "base/error.h"

namespace omni {

namespace {

bool positive_f32(double x) {
  return x > 0 && x <= double(std::numeric_limits<float>::max());
}

}  // namespace

GradScaler::GradScaler(double initial_scale) : scale_(static_cast<float>(initial_scale)) {}

ConstantGradScaler::ConstantGradScaler(double scale) : GradScaler(scale) {
  OMNI_REQUIRE(positive_f32(scale), "--loss-scale: ", scale,
               " is not a positive number within fp32 range");
}

DynamicGradScaler::DynamicGradScaler(double initial_scale, double min_scale, double growth_factor,
                                     double backoff_factor, int64_t growth_interval,
                                     int64_t hysteresis)
    : GradScaler(initial_scale),
      min_scale_(static_cast<float>(min_scale)),
      growth_factor_(static_cast<float>(growth_factor)),
      backoff_factor_(static_cast<float>(backoff_factor)),
      growth_interval_(growth_interval),
      hysteresis_(hysteresis),
      hysteresis_tracker_(hysteresis) {
  OMNI_REQUIRE(positive_f32(initial_scale), "--initial-loss-scale: ", initial_scale,
               " is not a positive number within fp32 range");
  OMNI_REQUIRE(positive_f32(min_scale) && min_scale <= initial_scale,
               "--min-loss-scale: ", min_scale,
               " must be positive and at most --initial-loss-scale (", initial_scale, ")");
  OMNI_REQUIRE(growth_interval >= 1, "--loss-scale-window: ", growth_interval,
               " must be at least 1");
  OMNI_REQUIRE(hysteresis >= 1, "--hysteresis: ", hysteresis, " must be at least 1");
  OMNI_CHECK(growth_factor > 1 && backoff_factor > 0 && backoff_factor < 1,
             "[loss scaler] growth factor ", growth_factor, ", backoff factor ", backoff_factor);
}

void DynamicGradScaler::update(bool found_inf) {
  if (found_inf) {
    growth_tracker_ = 0;
    --hysteresis_tracker_;
    if (hysteresis_tracker_ <= 0) scale_ = std::max(scale_ * backoff_factor_, min_scale_);
    return;
  }
  // ">=" where Megatron has "==": a tracker loaded from a run with a longer window still grows.
  if (++growth_tracker_ >= growth_interval_) {
    growth_tracker_ = 0;
    hysteresis_tracker_ = hysteresis_;
    scale_ *= growth_factor_;
  }
}

GradScalerState DynamicGradScaler::state() const {
  return {scale_, growth_tracker_, hysteresis_tracker_};
}

void DynamicGradScaler::load_state(const GradScalerState& state) {
  // The trackers may come from a run with another --loss-scale-window or --hysteresis; the
  // hysteresis tracker may be below zero (overflows after it was spent).
  OMNI_REQUIRE(std::isfinite(state.scale) && state.scale > 0 && state.growth_tracker >= 0,
               "loss scaler state: scale ", state.scale, " and growth tracker ",
               state.growth_tracker, " must be positive and non-negative");
  scale_ = state.scale;
  growth_tracker_ = state.growth_tracker;
  hysteresis_tracker_ = state.hysteresis_tracker;
}

std::unique_ptr<GradScaler> make_grad_scaler(const LossScaleConfig& config, DType dtype) {
  if (config.loss_scale != 0) return std::make_unique<ConstantGradScaler>(config.loss_scale);
  if (dtype != DType::F16) return nullptr;
  return std::make_unique<DynamicGradScaler>(config.initial_loss_scale, config.min_loss_scale, 2.0,
                                             0.5, config.loss_scale_window, config.hysteresis);
}

}  // namespace omni
