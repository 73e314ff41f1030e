// LR schedules against Megatron's formulas, and the optimizers against hand-computed
// updates.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "optim/lr_schedule.h"
#include "optim/optimizer.h"

namespace {

using omni::LRDecayStyle;
using omni::LRScheduleConfig;

LRScheduleConfig schedule(LRDecayStyle style) {
  LRScheduleConfig c;
  c.lr = 1.0;
  c.min_lr = 0.1;
  c.warmup_steps = 10;
  c.decay_steps = 110;
  c.style = style;
  return c;
}

TEST(LRSchedule, WarmupIsLinearFromZero) {
  auto c = schedule(LRDecayStyle::Cosine);
  EXPECT_DOUBLE_EQ(omni::learning_rate(c, 0), 0.0);
  EXPECT_DOUBLE_EQ(omni::learning_rate(c, 5), 0.5);
  EXPECT_DOUBLE_EQ(omni::learning_rate(c, 10), 1.0);
}

TEST(LRSchedule, CosineReachesMinLrAtTheEndOfDecay) {
  auto c = schedule(LRDecayStyle::Cosine);
  EXPECT_NEAR(omni::learning_rate(c, 60), 0.1 + 0.9 * 0.5, 1e-12);  // halfway: cos(pi/2) = 0
  EXPECT_NEAR(omni::learning_rate(c, 35), 0.1 + 0.9 * 0.5 * (std::cos(std::numbers::pi / 4) + 1),
              1e-12);
  EXPECT_DOUBLE_EQ(omni::learning_rate(c, 110), 0.1);
  EXPECT_DOUBLE_EQ(omni::learning_rate(c, 500), 0.1);
}

TEST(LRSchedule, LinearDecaysProportionally) {
  auto c = schedule(LRDecayStyle::Linear);
  EXPECT_NEAR(omni::learning_rate(c, 35), 0.1 + 0.9 * 0.75, 1e-12);
}

TEST(LRSchedule, ConstantStaysAtLrAfterWarmup) {
  auto c = schedule(LRDecayStyle::Constant);
  EXPECT_DOUBLE_EQ(omni::learning_rate(c, 1000), 1.0);
}

TEST(LRSchedule, InverseSquareRootScalesBySqrtWarmupOverStep) {
  auto c = schedule(LRDecayStyle::InverseSquareRoot);
  EXPECT_NEAR(omni::learning_rate(c, 40), std::sqrt(10.0 / 40.0), 1e-12);
  c.decay_steps = 1000000;
  EXPECT_DOUBLE_EQ(omni::learning_rate(c, 100000), 0.1);  // floored at min_lr
  // Megatron: past the decay's end every style but constant is min_lr.
  c.min_lr = 0.01, c.decay_steps = 110;
  EXPECT_NEAR(omni::learning_rate(c, 110), std::sqrt(10.0 / 110.0), 1e-12);
  EXPECT_DOUBLE_EQ(omni::learning_rate(c, 111), 0.01);
}

TEST(LRSchedule, WsdHoldsThenDecaysOverTheLastIterations) {
  auto c = schedule(LRDecayStyle::WSD);
  c.wsd_decay_steps = 20;
  c.wsd_style = omni::WSDDecayStyle::Linear;
  EXPECT_DOUBLE_EQ(omni::learning_rate(c, 90), 1.0);
  EXPECT_NEAR(omni::learning_rate(c, 100), 0.1 + 0.9 * 0.5, 1e-12);
  c.wsd_style = omni::WSDDecayStyle::Exponential;
  EXPECT_NEAR(omni::learning_rate(c, 100), 0.1 + 0.9 * (2 * std::pow(0.5, 0.5) - 1), 1e-12);
  EXPECT_NEAR(omni::learning_rate(c, 110), 0.1, 1e-12);
}

omni::ParameterSet<double> two_params() {
  omni::ParameterSet<double> p(
      {{"w", {2}, omni::ParamInit::Zeros, true}, {"b", {1}, omni::ParamInit::Zeros, false}});
  p.value("w")[0] = 1.0, p.value("w")[1] = -2.0, p.value("b")[0] = 0.5;
  p.grad("w")[0] = 0.1, p.grad("w")[1] = 0.2, p.grad("b")[0] = -0.3;
  return p;
}

TEST(Optimizer, AdamWFirstStepMovesByLrTimesSignPlusDecoupledDecay) {
  auto p = two_params();
  omni::OptimizerConfig c;
  c.weight_decay = 0.1;
  c.adam_eps = 0;
  omni::Optimizer<double> opt(c, p);
  opt.step(p, 0.01);
  // Step 1: m_hat = g, v_hat = g^2, so the Adam step is lr * sign(g); decay lr*wd*w first.
  EXPECT_NEAR(p.value("w")[0], 1.0 - 0.01 * 0.1 * 1.0 - 0.01, 1e-15);
  EXPECT_NEAR(p.value("w")[1], -2.0 + 0.01 * 0.1 * 2.0 - 0.01, 1e-15);
  EXPECT_NEAR(p.value("b")[0], 0.5 + 0.01, 1e-15);  // no decay on a bias
}

TEST(Optimizer, MegatronsAdamDecaysTheWeightsNotTheGradient) {
  // --optimizer adam in Megatron is Adam with decoupled weight decay (its OptimizerConfig's
  // decoupled_weight_decay is true, and no flag turns it off). By hand, step 1 with eps 0:
  //   decoupled: w <- w - lr*wd*w - lr*sign(g)      = 1 - 0.001 - 0.01 = 0.989
  //   L2 (what an L2-coupled Adam gives): g' = g + wd*w = 0.2, w <- w - lr*sign(g') = 0.99
  auto p = two_params();
  omni::OptimizerConfig c;
  c.kind = omni::parse_optimizer("adam");
  c.weight_decay = 0.1;
  c.adam_eps = 0;
  omni::Optimizer<double> opt(c, p);
  opt.step(p, 0.01);
  EXPECT_NEAR(p.value("w")[0], 0.989, 1e-15);
}

TEST(Optimizer, AdamWSecondStepUsesBiasCorrectedMoments) {
  auto p = two_params();
  omni::OptimizerConfig c;
  c.weight_decay = 0;
  c.adam_beta1 = 0.9, c.adam_beta2 = 0.99, c.adam_eps = 1e-8;
  omni::Optimizer<double> opt(c, p);
  opt.step(p, 0.01);
  const double w1 = p.value("w")[0];
  p.grad("w")[0] = 0.3;
  opt.step(p, 0.01);
  const double m = 0.9 * (0.1 * 0.1) + 0.1 * 0.3, v = 0.99 * (0.01 * 0.01) + 0.01 * 0.09;
  const double m_hat = m / (1 - 0.81), v_hat = v / (1 - 0.99 * 0.99);
  EXPECT_NEAR(p.value("w")[0], w1 - 0.01 * m_hat / (std::sqrt(v_hat) + 1e-8), 1e-14);
}

TEST(Optimizer, SgdWithMomentumAccumulatesVelocity) {
  auto p = two_params();
  omni::OptimizerConfig c;
  c.kind = omni::OptimizerKind::SGD;
  c.weight_decay = 0;
  c.sgd_momentum = 0.5;
  omni::Optimizer<double> opt(c, p);
  opt.step(p, 0.1);
  opt.step(p, 0.1);
  // v1 = g, v2 = 0.5 g + g: w = w0 - 0.1 (g + 1.5 g).
  EXPECT_NEAR(p.value("w")[0], 1.0 - 0.1 * 2.5 * 0.1, 1e-15);
}

// A weight of 1003 elements (the vector loop and its remainder) and a bias of 17, each followed
// by padding in the flat buffer; values sin(0.7 i).
omni::ParameterSet<float> weight_and_bias() {
  omni::ParameterSet<float> p({{"w", {1003}, omni::ParamInit::Zeros, true},
                               {"b", {17}, omni::ParamInit::Zeros, false}});
  for (int64_t i = 0; i < p.size(); ++i) p.values()[i] = float(std::sin(0.7 * double(i)));
  return p;
}

// The trainer's clipping folded into the update (Optimizer::step's grad_scale) gives the
// bits scale_gradients then step gives, for AdamW (fused) and SGD (scaled first); 1003
// elements take the vector loop and its remainder.
TEST(GradientClipping, ScaleInTheUpdateEqualsScalingTheGradientsFirst) {
  for (omni::OptimizerKind kind : {omni::OptimizerKind::AdamW, omni::OptimizerKind::SGD}) {
    omni::ParameterSet<float> a = weight_and_bias(), b = weight_and_bias();
    omni::OptimizerConfig c;
    c.kind = kind;
    c.weight_decay = 0.1;
    omni::Optimizer<float> first(c, a), fused(c, b);
    const double scales[] = {0.37, 1.0, 0.0123};
    for (int step = 0; step < 3; ++step) {
      for (int64_t i = 0; i < a.size(); ++i)
        a.grads()[i] = b.grads()[i] = float(std::cos(1.3 * double(i) + step) * (1 + i % 7));
      omni::scale_gradients(a, scales[step]);
      first.step(a, 1e-2);
      fused.step(b, 1e-2, scales[step]);
      for (int64_t i = 0; i < a.size(); ++i)
        ASSERT_EQ(a.values()[i], b.values()[i]) << "element " << i << ", step " << step;
    }
  }
}

// Optimizer::step's zero_grads: AdamW on the CPU leaves the same values and states and every
// gradient zero, the padding after each parameter too (to the next 16-element boundary), and
// says so; SGD updates as before and leaves its gradients.
TEST(Optimizer, AdamWZeroesTheGradientsItReadWhenAsked) {
  for (omni::OptimizerKind kind : {omni::OptimizerKind::AdamW, omni::OptimizerKind::SGD}) {
    omni::ParameterSet<float> a = weight_and_bias(), b = weight_and_bias();
    ASSERT_GT(b.info("b").offset, 1003);  // a gap the zeroing covers
    omni::OptimizerConfig c;
    c.kind = kind;
    omni::Optimizer<float> plain(c, a), zeroing(c, b);
    for (int step = 0; step < 3; ++step) {
      for (int64_t i = 0; i < a.size(); ++i)
        a.grads()[i] = b.grads()[i] = float(std::cos(1.3 * double(i) + step) * (1 + i % 7));
      EXPECT_FALSE(plain.step(a, 1e-2, 0.5));
      const bool zeroed = zeroing.step(b, 1e-2, 0.5, true);
      EXPECT_EQ(zeroed, kind == omni::OptimizerKind::AdamW);
      for (int64_t i = 0; i < a.size(); ++i) {
        ASSERT_EQ(a.values()[i], b.values()[i]) << "element " << i << ", step " << step;
        ASSERT_EQ(b.grads()[i], zeroed ? 0.0f : a.grads()[i]) << "element " << i;
      }
      for (const std::string& state : plain.state_names())
        for (int64_t i = 0; i < a.size(); ++i)
          ASSERT_EQ(plain.state_buffer(state)[i], zeroing.state_buffer(state)[i]) << state;
    }
  }
}

TEST(GradientClipping, NormIsTheGlobalL2NormOverAllParameters) {
  auto p = two_params();
  EXPECT_NEAR(omni::gradient_norm(p), std::sqrt(0.01 + 0.04 + 0.09), 1e-15);
  omni::scale_gradients(p, 0.5);
  EXPECT_NEAR(omni::gradient_norm(p), 0.5 * std::sqrt(0.14), 1e-15);
}

}  // namespace
