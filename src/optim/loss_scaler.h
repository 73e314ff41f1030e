// Loss scaling for fp16 training, with Megatron-Core's semantics (optimizer/grad_scaler.py).
//
// fp16 holds magnitudes from 2^-24 to 65504 only, so small gradients underflow to zero. The
// trainer multiplies the loss by scale() before backward, and the gradients by inv_scale()
// after it (MixedPrecision::unscale_and_check does both the unscaling and the inf/NaN check);
// a step whose scaled gradients overflowed is skipped and reported to update().
//
//   auto scaler = omni::make_grad_scaler(loss_scale_config, omni::DType::F16);
//   ... backward of loss * scaler->scale() ...
//   const bool found_inf = mp.unscale_and_check(scaler->scale());
//   scaler->update(found_inf);     // before deciding on the step, as Megatron does
//   if (!found_inf) optimizer.step(mp.master(), lr); else log the skipped iteration
//
// DynamicGradScaler on update(found_inf):
//   overflow:  growth tracker := 0; hysteresis tracker -= 1; when the hysteresis tracker is
//              <= 0 the scale is multiplied by backoff_factor, but not below min_scale. The
//              hysteresis tracker is not reset there: once it is spent, every further
//              overflow backs off at once.
//   clean:     growth tracker += 1; when it reaches growth_interval, the scale is multiplied by
//              growth_factor and both trackers are reset (growth 0, hysteresis := hysteresis).
//              Clean steps alone never restore the hysteresis tracker, so overflows need not
//              be consecutive to use it up.
// The scale is an fp32 number, as Megatron keeps it in a one-element float tensor.
#pragma once

#include <cstdint>
#include <memory>

#include "base/dtype.h"

namespace omni {

// Megatron's options, with its defaults.
struct LossScaleConfig {
  double loss_scale = 0;                     // --loss-scale: > 0 fixes the scale; 0: dynamic
  double initial_loss_scale = 4294967296.0;  // --initial-loss-scale (2^32)
  double min_loss_scale = 1.0;               // --min-loss-scale
  int64_t loss_scale_window = 1000;          // --loss-scale-window: clean steps per growth
  int64_t hysteresis = 2;                    // --hysteresis: overflows before a backoff
};

// What a checkpoint saves to resume the scaler exactly (Megatron's state_dict keys).
struct GradScalerState {
  float scale = 1;
  int64_t growth_tracker = 0;
  int64_t hysteresis_tracker = 0;
};

class GradScaler {
 public:
  virtual ~GradScaler() = default;
  float scale() const { return scale_; }
  // 1/scale computed in f64 and rounded to f32, as Megatron's inv_scale.
  float inv_scale() const { return static_cast<float>(1.0 / double(scale_)); }
  // Called once per iteration with whether the scaled gradients held an inf or NaN.
  virtual void update(bool found_inf) = 0;
  virtual GradScalerState state() const = 0;
  virtual void load_state(const GradScalerState& state) = 0;

 protected:
  explicit GradScaler(double initial_scale);
  float scale_;
};

// --loss-scale: never changes; its state is the scale alone and loading a state leaves the
// scale from the option (Megatron's ConstantGradScaler saves an empty state).
class ConstantGradScaler final : public GradScaler {
 public:
  explicit ConstantGradScaler(double scale);
  void update(bool) override {}
  GradScalerState state() const override { return {scale_, 0, 0}; }
  void load_state(const GradScalerState&) override {}
};

class DynamicGradScaler final : public GradScaler {
 public:
  // growth_factor > 1, 0 < backoff_factor < 1, 0 < min_scale <= initial_scale,
  // growth_interval >= 1, hysteresis >= 1; otherwise UsageError naming Megatron's flag.
  DynamicGradScaler(double initial_scale, double min_scale, double growth_factor,
                    double backoff_factor, int64_t growth_interval, int64_t hysteresis);
  void update(bool found_inf) override;
  GradScalerState state() const override;
  // Takes a saved state; throws UsageError for a non-positive scale or growth tracker < 0.
  void load_state(const GradScalerState& state) override;

  float min_scale() const { return min_scale_; }
  int64_t growth_interval() const { return growth_interval_; }
  int64_t hysteresis() const { return hysteresis_; }

 private:
  float min_scale_, growth_factor_, backoff_factor_;
  int64_t growth_interval_, hysteresis_;
  int64_t growth_tracker_ = 0, hysteresis_tracker_;
};

// Megatron's choice of scaler: --loss-scale gives a ConstantGradScaler whatever the dtype;
// otherwise fp16 (`dtype` F16) gets a DynamicGradScaler with growth factor 2 and backoff 0.5,
// and bf16 or fp32 get none (null: train unscaled, scale 1).
std::unique_ptr<GradScaler> make_grad_scaler(const LossScaleConfig& config, DType dtype);

}  // namespace omni
