// The loss scalers against sequences of overflow flags worked by hand from Megatron-Core's
// grad_scaler.py: backoff after `hysteresis` overflows (tracker not reset by the backoff),
// growth after `growth_interval` clean steps (which resets both trackers), min-scale clamp.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "base/error.h"
#include "optim/loss_scaler.h"

namespace {

using omni::DynamicGradScaler;
using omni::GradScalerState;

// Feeds `flags` ('x' overflow, '.' clean) and returns the scale after each update.
std::vector<float> walk(omni::GradScaler& s, const std::string& flags) {
  std::vector<float> scales;
  for (char c : flags) {
    s.update(c == 'x');
    scales.push_back(s.scale());
  }
  return scales;
}

float p2(int e) {
  return std::ldexp(1.0f, e);
}

TEST(ConstantGradScaler, NeverChangesAndSavesOnlyItsScale) {
  omni::ConstantGradScaler s(1024);
  EXPECT_EQ(walk(s, "xx..x...xxxx"), std::vector<float>(12, 1024.0f));
  EXPECT_EQ(s.inv_scale(), 1.0f / 1024);
  s.load_state({8, 3, -1});
  EXPECT_EQ(s.scale(), 1024.0f);  // the option wins, as Megatron saves no state for it
}

TEST(DynamicGradScaler, StartsWithFullHysteresisAndNoGrowth) {
  DynamicGradScaler s(p2(32), 1, 2, 0.5, 1000, 2);
  const GradScalerState st = s.state();
  EXPECT_EQ(st.scale, p2(32));
  EXPECT_EQ(st.growth_tracker, 0);
  EXPECT_EQ(st.hysteresis_tracker, 2);
}

TEST(DynamicGradScaler, BacksOffOnceHysteresisIsSpentAndOnEveryOverflowAfter) {
  DynamicGradScaler s(p2(32), 1, 2, 0.5, 1000, 2);
  // 1st overflow: tracker 2 -> 1, no change; 2nd: 0, halve; 3rd and 4th: -1, -2, halve each.
  EXPECT_EQ(walk(s, "xxxx"), (std::vector<float>{p2(32), p2(31), p2(30), p2(29)}));
  EXPECT_EQ(s.state().hysteresis_tracker, -2);
}

TEST(DynamicGradScaler, CleanStepsBetweenOverflowsDoNotRestoreHysteresis) {
  DynamicGradScaler s(p2(20), 1, 2, 0.5, 1000, 3);
  // Trackers 3 -> 2 -> 1 -> 0: the third overflow backs off although none were consecutive.
  EXPECT_EQ(walk(s, "x...x...x"), (std::vector<float>{p2(20), p2(20), p2(20), p2(20), p2(20),
                                                      p2(20), p2(20), p2(20), p2(19)}));
  EXPECT_EQ(s.state().growth_tracker, 0);  // the overflow reset it
}

TEST(DynamicGradScaler, GrowsAfterGrowthIntervalCleanStepsAndResetsBothTrackers) {
  DynamicGradScaler s(p2(10), 1, 2, 0.5, 3, 2);
  // Overflow (hysteresis 1), then clean, clean, overflow: the growth tracker restarts, and
  // the second overflow spends the hysteresis: halve. Three clean steps then double.
  EXPECT_EQ(walk(s, "x..x..."),
            (std::vector<float>{p2(10), p2(10), p2(10), p2(9), p2(9), p2(9), p2(10)}));
  EXPECT_EQ(s.state().growth_tracker, 0);
  EXPECT_EQ(s.state().hysteresis_tracker, 2);
  // Restored hysteresis: one overflow is tolerated again, the next halves.
  EXPECT_EQ(walk(s, "xx"), (std::vector<float>{p2(10), p2(9)}));
}

TEST(DynamicGradScaler, NeverBacksOffBelowMinScale) {
  DynamicGradScaler s(16, 4, 2, 0.5, 1000, 1);
  EXPECT_EQ(walk(s, "xxxx"), (std::vector<float>{8, 4, 4, 4}));
  // A min scale that is not a power-of-two step away is reached exactly, not undershot.
  DynamicGradScaler t(16, 3, 2, 0.5, 1000, 1);
  EXPECT_EQ(walk(t, "xxx"), (std::vector<float>{8, 4, 3}));
}

TEST(DynamicGradScaler, WalksMegatronDefaultsFromTwoToThe32) {
  // --initial-loss-scale 2^32, --hysteresis 2 and a short window of 4: twenty overflows at
  // the start bring the scale to 2^13 (the first one only spends hysteresis), four clean
  // steps grow it to 2^14, one overflow is absorbed, the second halves it.
  DynamicGradScaler s(p2(32), 1, 2, 0.5, 4, 2);
  const std::vector<float> start = walk(s, std::string(20, 'x'));
  for (int i = 0; i < 20; ++i) EXPECT_EQ(start[i], p2(i == 0 ? 32 : 32 - i)) << "step " << i;
  EXPECT_EQ(s.scale(), p2(13));
  EXPECT_EQ(walk(s, "....x.x"),
            (std::vector<float>{p2(13), p2(13), p2(13), p2(14), p2(14), p2(14), p2(13)}));
  EXPECT_EQ(s.inv_scale(), p2(-13));
}

TEST(DynamicGradScaler, ResumesFromSavedStateExactly) {
  DynamicGradScaler a(p2(16), 1, 2, 0.5, 5, 3);
  walk(a, "x..x..");
  DynamicGradScaler b(p2(16), 1, 2, 0.5, 5, 3);
  b.load_state(a.state());
  const std::string rest = "..x.....xxx.";
  EXPECT_EQ(walk(a, rest), walk(b, rest));
  EXPECT_THROW(b.load_state({0, 0, 1}), omni::UsageError);
  EXPECT_THROW(b.load_state({1, -1, 1}), omni::UsageError);
}

TEST(MakeGradScaler, FollowsMegatronsChoiceOfScaler) {
  omni::LossScaleConfig c;
  EXPECT_EQ(c.initial_loss_scale, 4294967296.0);
  EXPECT_EQ(c.min_loss_scale, 1.0);
  EXPECT_EQ(c.loss_scale_window, 1000);
  EXPECT_EQ(c.hysteresis, 2);
  auto fp16 = omni::make_grad_scaler(c, omni::DType::F16);
  auto* dynamic = dynamic_cast<DynamicGradScaler*>(fp16.get());
  ASSERT_NE(dynamic, nullptr);
  EXPECT_EQ(dynamic->scale(), p2(32));
  EXPECT_EQ(dynamic->min_scale(), 1.0f);
  EXPECT_EQ(dynamic->growth_interval(), 1000);
  EXPECT_EQ(dynamic->hysteresis(), 2);
  EXPECT_EQ(omni::make_grad_scaler(c, omni::DType::BF16), nullptr);
  c.loss_scale = 128;
  for (omni::DType t : {omni::DType::F16, omni::DType::BF16}) {
    auto constant = omni::make_grad_scaler(c, t);
    ASSERT_NE(dynamic_cast<omni::ConstantGradScaler*>(constant.get()), nullptr);
    EXPECT_EQ(constant->scale(), 128.0f);
  }
}

TEST(MakeGradScaler, RejectsBadOptionsNamingTheFlag) {
  auto message = [](omni::LossScaleConfig c) {
    try {
      omni::make_grad_scaler(c, omni::DType::F16);
    } catch (const omni::UsageError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  omni::LossScaleConfig c;
  c.min_loss_scale = 0;
  EXPECT_NE(message(c).find("--min-loss-scale"), std::string::npos) << message(c);
  c = {};
  c.min_loss_scale = 2 * c.initial_loss_scale;
  EXPECT_NE(message(c).find("--min-loss-scale"), std::string::npos) << message(c);
  c = {};
  c.loss_scale_window = 0;
  EXPECT_NE(message(c).find("--loss-scale-window"), std::string::npos) << message(c);
  c = {};
  c.hysteresis = 0;
  EXPECT_NE(message(c).find("--hysteresis"), std::string::npos) << message(c);
  c = {};
  c.loss_scale = -1;
  EXPECT_NE(message(c).find("--loss-scale"), std::string::npos) << message(c);
  c = {};
  c.initial_loss_scale = 1e39;  // beyond fp32
  EXPECT_NE(message(c).find("--initial-loss-scale"), std::string::npos) << message(c);
}

}  // namespace
