// Mixed precision on the CPU: stored values and gradients rounded as base/dtype.h converts
// them, inf/NaN (and f16 overflow) detection, exact unscaling, and small least-squares
// trainings: fp16 with Megatron's dynamic scaler from 2^32 skips its first steps and then
// converges; bf16 tracks fp32.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include "optim/loss_scaler.h"
#include "optim/mixed_precision.h"
#include "optim/optimizer.h"

namespace {

using omni::DType;
using omni::MixedPrecision;
using omni::ParameterSet;

constexpr float kInf = std::numeric_limits<float>::infinity();

ParameterSet<float> vector_params(int64_t n) {
  return ParameterSet<float>({{"w", {n}}});
}

// Values around every corner of both formats: ties, subnormals, the largest finite values and
// what lies just past them, signed zeros.
std::vector<float> awkward_values() {
  std::vector<float> v = {0.0f,           -0.0f,           1.0f,
                          1.0f + 0x1p-8f, 1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f,
                          65504.0f,       65519.0f,        65520.0f,
                          -70000.0f,      0x1p-24f,        0x1p-25f,
                          0x1.8p-25f,     3e-8f,           0x1.fefffep127f,
                          1e-40f,         -3.14159f,       kInf};
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 100.0f);
  for (int i = 0; i < 200; ++i) v.push_back(normal(rng) * std::ldexp(1.0f, i % 40 - 20));
  return v;
}

TEST(MixedPrecision, RoundToDtypeMatchesBaseConversions) {
  const std::vector<float> v = awkward_values();
  const auto n = static_cast<int64_t>(v.size());
  std::vector<float> bf(v.size()), h(v.size());
  EXPECT_TRUE(omni::round_to_dtype(v.data(), bf.data(), n, DType::BF16));  // inf, rounded max
  EXPECT_TRUE(omni::round_to_dtype(v.data(), h.data(), n, DType::F16));
  for (size_t i = 0; i < v.size(); ++i) {
    EXPECT_EQ(std::bit_cast<uint32_t>(bf[i]),
              std::bit_cast<uint32_t>(omni::bf16_to_f32(omni::f32_to_bf16(v[i]))))
        << v[i];
    EXPECT_EQ(std::bit_cast<uint32_t>(h[i]),
              std::bit_cast<uint32_t>(omni::f16_to_f32(omni::f32_to_f16(v[i]))))
        << v[i];
  }
  EXPECT_EQ(h[7], 65504.0f);  // 65519 rounds down, 65520 overflows
  EXPECT_EQ(h[8], kInf);
}

TEST(MixedPrecision, ModelHoldsRoundedValuesAndMasterTheirFp32Copy) {
  for (DType t : {DType::BF16, DType::F16}) {
    ParameterSet<float> model = vector_params(64);
    model.initialize(3, 0.5, 0.5);
    const std::vector<float> init(model.values(), model.values() + model.size());
    MixedPrecision mp(model, t, t);
    std::vector<float> expect(init.size());
    omni::round_to_dtype(init.data(), expect.data(), model.size(), t);
    int changed = 0;
    for (int64_t i = 0; i < model.size(); ++i) {
      EXPECT_EQ(model.values()[i], expect[i]);
      EXPECT_EQ(mp.master().values()[i], expect[i]);  // Megatron clones the half parameters
      changed += expect[i] != init[i];
    }
    EXPECT_GT(changed, 32) << omni::dtype_name(t);  // normal draws are rarely representable
  }
}

TEST(MixedPrecision, CopyMasterToModelRounds) {
  ParameterSet<float> model = vector_params(4);
  MixedPrecision mp(model, DType::BF16, DType::F32);
  const float master[4] = {1.0f + 0x1p-9f, 1.0f + 3 * 0x1p-9f, -2.5e-3f, 1e30f};
  std::copy_n(master, 4, mp.master().values());
  mp.copy_master_to_model();
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(model.values()[i], omni::bf16_to_f32(omni::f32_to_bf16(master[i])));
    EXPECT_EQ(mp.master().values()[i], master[i]);  // the master keeps its precision
  }
  EXPECT_EQ(model.values()[0], 1.0f);  // tie to even
  EXPECT_EQ(model.values()[1], 1.0f + 0x1p-7f);
}

TEST(MixedPrecision, FindsInfAndNaNInGradients) {
  for (DType grads : {DType::F16, DType::F32}) {
    for (float bad : {kInf, -kInf, std::numeric_limits<float>::quiet_NaN()}) {
      ParameterSet<float> model = vector_params(40);
      MixedPrecision mp(model, DType::F16, grads);
      std::fill_n(model.grads(), 40, 0.25f);
      EXPECT_FALSE(mp.unscale_and_check(1.0f));
      model.grads()[33] = bad;
      EXPECT_TRUE(mp.unscale_and_check(1.0f)) << bad << " in " << omni::dtype_name(grads);
    }
  }
}

TEST(MixedPrecision, GradientThatOverflowsF16IsFound) {
  ParameterSet<float> model = vector_params(16);
  MixedPrecision f16(model, DType::F16, DType::F16);
  model.grads()[5] = 65519.0f;  // rounds to 65504: finite
  EXPECT_FALSE(f16.unscale_and_check(1.0f));
  EXPECT_EQ(model.grads()[5], 65504.0f);
  model.grads()[5] = -70000.0f;
  EXPECT_TRUE(f16.unscale_and_check(1.0f));
  EXPECT_EQ(model.grads()[5], -kInf);  // stored as fp16 would hold it
  // The same gradient is fine in bf16 storage and in fp32 gradient accumulation.
  ParameterSet<float> other = vector_params(16);
  MixedPrecision bf16(other, DType::BF16, DType::BF16);
  other.grads()[5] = -70000.0f;
  EXPECT_FALSE(bf16.unscale_and_check(1.0f));
  MixedPrecision f16_fp32_grads(other, DType::F16, DType::F32);
  EXPECT_FALSE(f16_fp32_grads.unscale_and_check(1.0f));
}

// Asked to, the unscaling zeroes the model's gradients instead of rounding them in place: the
// master's gradients and the inf/NaN flag are the same; with only a shard of the master kept
// (keep_only) it leaves them rounded and says so.
TEST(MixedPrecision, UnscalingCanZeroTheModelsGradients) {
  for (DType grads : {DType::F16, DType::F32}) {
    ParameterSet<float> a = vector_params(1000), b = vector_params(1000);
    MixedPrecision plain(a, DType::F16, grads), zeroing(b, DType::F16, grads);
    std::mt19937 rng(5);
    std::normal_distribution<float> normal(0.0f, 300.0f);
    std::generate_n(a.grads(), 1000, [&] { return normal(rng); });
    std::copy_n(a.grads(), 1000, b.grads());
    b.grads()[999] = a.grads()[999] = 1e6f;  // inf in fp16
    bool zeroed = false;
    EXPECT_EQ(plain.unscale_and_check(8.0f), grads == DType::F16);
    EXPECT_EQ(zeroing.unscale_and_check(8.0f, &zeroed), grads == DType::F16);
    EXPECT_TRUE(zeroed);
    for (int i = 0; i < 1000; ++i) {
      ASSERT_EQ(b.grads()[i], 0.0f) << i;
      ASSERT_EQ(std::bit_cast<uint32_t>(zeroing.master().grads()[i]),
                std::bit_cast<uint32_t>(plain.master().grads()[i]))
          << i;
    }
    zeroing.keep_only({{0, 500}});
    std::copy_n(a.grads(), 1000, b.grads());
    EXPECT_FALSE(zeroing.unscale_and_check(8.0f, &zeroed));
    EXPECT_FALSE(zeroed);
    EXPECT_EQ(b.grads()[3], a.grads()[3]);  // rounded in place already: unchanged
  }
}

TEST(MixedPrecision, UnscalingByAPowerOfTwoIsExact) {
  for (DType grads : {DType::F16, DType::BF16, DType::F32}) {
    const DType params = grads == DType::F32 ? DType::BF16 : grads;
    ParameterSet<float> model = vector_params(1000);
    MixedPrecision mp(model, params, grads);
    std::mt19937 rng(11);
    std::normal_distribution<float> normal(0.0f, 300.0f);
    for (int e : {0, 7, 15, 24, 32}) {
      std::generate_n(model.grads(), 1000, [&] { return normal(rng); });
      std::vector<float> stored(1000);
      omni::round_to_dtype(model.grads(), stored.data(), 1000, grads);
      ASSERT_FALSE(mp.unscale_and_check(std::ldexp(1.0f, e)));
      for (int i = 0; i < 1000; ++i) {
        EXPECT_EQ(model.grads()[i], stored[i]);
        ASSERT_EQ(mp.master().grads()[i], std::ldexp(stored[i], -e)) << "scale 2^" << e;
      }
    }
  }
}

// Least squares 0.5/m * |A w - b|^2 with b = A w*, so the optimum is w* and loss 0.
struct LeastSquares {
  static constexpr int m = 32, n = 8;
  std::vector<float> a, b, w_star;
  LeastSquares() : a(m * n), b(m), w_star(n) {
    std::mt19937 rng(5);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float& x : a) x = normal(rng);
    for (int j = 0; j < n; ++j) w_star[j] = 0.9f * std::sin(1.7f * float(j) + 0.3f);
    for (int i = 0; i < m; ++i) {
      b[i] = 0;
      for (int j = 0; j < n; ++j) b[i] += a[i * n + j] * w_star[j];
    }
  }
  // The loss at w, and gradient * scale added into g: fp32 arithmetic throughout.
  float loss_and_grad(const float* w, float* g, float scale) const {
    float loss = 0;
    for (int i = 0; i < m; ++i) {
      float r = -b[i];
      for (int j = 0; j < n; ++j) r += a[i * n + j] * w[j];
      loss += 0.5f * r * r / m;
      for (int j = 0; j < n; ++j) g[j] += scale * r * a[i * n + j] / m;
    }
    return loss;
  }
  float distance(const float* w) const {
    float d = 0;
    for (int j = 0; j < n; ++j) d = std::max(d, std::abs(w[j] - w_star[j]));
    return d;
  }
};

omni::OptimizerConfig sgd() {
  omni::OptimizerConfig c;
  c.kind = omni::OptimizerKind::SGD;
  c.sgd_momentum = 0.5;
  c.weight_decay = 0;
  return c;
}
constexpr double kLr = 0.2;
constexpr int kSteps = 200;

// Loss before each step of plain fp32 training from w = 0.
std::vector<float> fp32_losses(const LeastSquares& p) {
  ParameterSet<float> params = vector_params(LeastSquares::n);
  omni::Optimizer<float> opt(sgd(), params);
  std::vector<float> losses;
  for (int s = 0; s < kSteps; ++s) {
    params.zero_grads();
    losses.push_back(p.loss_and_grad(params.values(), params.grads(), 1.0f));
    opt.step(params, kLr);
  }
  return losses;
}

struct Fp16Run {
  std::vector<bool> skipped;  // per iteration
  float final_loss = 0, distance = 0, scale = 0;
  int64_t optimizer_steps = 0;
};

// The trainer's loop as mixed_precision.h describes it, with fp16 storage and gradients.
Fp16Run train_fp16(const LeastSquares& p, const omni::LossScaleConfig& loss_scale) {
  ParameterSet<float> model = vector_params(LeastSquares::n);
  MixedPrecision mp(model, DType::F16, DType::F16);
  omni::Optimizer<float> opt(sgd(), mp.master());
  auto scaler = omni::make_grad_scaler(loss_scale, DType::F16);
  Fp16Run run;
  for (int s = 0; s < kSteps; ++s) {
    model.zero_grads();
    const float scale = scaler->scale();
    run.final_loss = p.loss_and_grad(model.values(), model.grads(), scale);
    const std::vector<float> before(mp.master().values(), mp.master().values() + model.size());
    const bool found_inf = mp.unscale_and_check(scale);
    scaler->update(found_inf);
    run.skipped.push_back(found_inf);
    if (found_inf) {
      EXPECT_TRUE(std::equal(before.begin(), before.end(), mp.master().values()));
      continue;
    }
    opt.step(mp.master(), kLr);
    mp.copy_master_to_model();
  }
  run.distance = p.distance(mp.master().values());
  run.scale = scaler->scale();
  run.optimizer_steps = opt.steps();
  return run;
}

TEST(MixedPrecisionTraining, Fp16WithDynamicScalerSkipsFirstStepsThenConverges) {
  const LeastSquares p;
  const Fp16Run run = train_fp16(p, omni::LossScaleConfig{});  // Megatron's: from 2^32
  // The first gradient is O(1): scale * |g| < 65504 needs the scale down to about 2^16, so
  // a run of skips from the start (the first one only spends hysteresis), then none, since
  // the gradients only shrink and the window of 1000 clean steps is never reached.
  const auto first_ok =
      std::find(run.skipped.begin(), run.skipped.end(), false) - run.skipped.begin();
  const int skips = int(std::count(run.skipped.begin(), run.skipped.end(), true));
  std::printf("fp16: %d skipped steps, then scale 2^%d; final loss %.3g, max |w - w*| %.3g\n",
              skips, std::ilogb(run.scale), run.final_loss, run.distance);
  EXPECT_GE(first_ok, 10);
  EXPECT_EQ(skips, first_ok);
  EXPECT_EQ(run.scale, std::ldexp(1.0f, 32 - int(first_ok) + 1));
  EXPECT_EQ(run.optimizer_steps, kSteps - skips);
  // f16 holds w* to 2^-11 relative; the master converges to within a few of its ulps.
  EXPECT_LT(run.distance, 2e-3f);
  EXPECT_LT(run.final_loss, 1e-5f);
}

TEST(MixedPrecisionTraining, Fp16RecoversFromOverflowsAfterTheScaleGrows) {
  // A window of 10 clean steps: the scale keeps growing as the gradients shrink, until a
  // product overflows again; those steps are skipped too, and the run still converges.
  const LeastSquares p;
  omni::LossScaleConfig c;
  c.loss_scale_window = 10;
  const Fp16Run run = train_fp16(p, c);
  const auto first_ok =
      std::find(run.skipped.begin(), run.skipped.end(), false) - run.skipped.begin();
  const int later = int(std::count(run.skipped.begin() + first_ok, run.skipped.end(), true));
  std::printf(
      "fp16, window 10: %d skipped at the start, %d later; final scale 2^%d, loss %.3g, "
      "max |w - w*| %.3g\n",
      int(first_ok), later, std::ilogb(run.scale), run.final_loss, run.distance);
  EXPECT_GT(later, 0);
  EXPECT_LT(run.distance, 2e-3f);
  EXPECT_LT(run.final_loss, 1e-5f);
}

TEST(MixedPrecisionTraining, Bf16TracksFp32) {
  const LeastSquares p;
  const std::vector<float> reference = fp32_losses(p);
  ParameterSet<float> model = vector_params(LeastSquares::n);
  MixedPrecision mp(model, DType::BF16, DType::F32);  // Megatron's bf16: fp32 gradients
  omni::Optimizer<float> opt(sgd(), mp.master());
  double worst = 0;
  for (int s = 0; s < kSteps; ++s) {
    model.zero_grads();
    const float loss = p.loss_and_grad(model.values(), model.grads(), 1.0f);
    worst = std::max(worst, double(std::abs(loss - reference[s])) / reference[0]);
    ASSERT_FALSE(mp.unscale_and_check(1.0f));
    opt.step(mp.master(), kLr);
    mp.copy_master_to_model();
  }
  std::printf("bf16: largest |loss - fp32 loss| / initial loss %.3g; max |w - w*| %.3g\n", worst,
              p.distance(mp.master().values()));
  EXPECT_LT(worst, 1e-3);
  EXPECT_LT(p.distance(mp.master().values()), 1e-2f);
}

}  // namespace
