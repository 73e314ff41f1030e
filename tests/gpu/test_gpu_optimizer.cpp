// Optimizer GPU ops: the gradient norm's sum of squares against ops::sum_squares, the loss
// scaler's overflow check, the count of zeros (--log-num-zeros-in-grad), and the AdamW update
// against the CPU optimizer's update_elements.
#include <cmath>
#include <cstring>
#include <limits>

#include "backend/ops.h"
#include "gpu/gpu_test.h"
#include "optim/optimizer.h"

namespace omni::gpu_test {
namespace {

TEST(GpuOptimizer, SumSquaresOfSeveralArraysMatchesCpu) {
  OMNI_REQUIRE_GPU();
  // Sizes below, at and past the pack and block widths; the last array starts one float into
  // its allocation (the unpacked path).
  const std::vector<size_t> sizes = {1, 1000, 4099, 77};
  std::vector<std::vector<float>> host;
  std::vector<gpu::DeviceArray<float>> device;
  std::vector<const float*> pointers;
  double want = 0.0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const size_t offset = i + 1 == sizes.size() ? 1 : 0;
    host.push_back(random_vector(sizes[i] + offset, 30 + i, -3.0f, 3.0f));
    device.emplace_back(host[i].size());
    gpu::copy_to_device(device[i].data(), host[i].data(), host[i].size() * sizeof(float));
    pointers.push_back(device[i].data() + offset);
    want += ops::sum_squares(host[i].data() + offset, sizes[i]);
  }
  const double got = gpu::sum_squares(pointers.data(), sizes.data(), int(sizes.size()));
  // Both sum exact float squares in double, in different orders: ~1e-16 relative each add.
  EXPECT_NEAR(got, want, 1e-12 * want);
  // Same inputs, same bits.
  const double again = gpu::sum_squares(pointers.data(), sizes.data(), int(sizes.size()));
  EXPECT_EQ(std::memcmp(&got, &again, sizeof got), 0);
}

TEST(GpuOptimizer, SumSquaresOfNothingIsZero) {
  OMNI_REQUIRE_GPU();
  const size_t size = 0;
  const float* none = nullptr;
  EXPECT_EQ(gpu::sum_squares(&none, &size, 1), 0.0);
  EXPECT_EQ(gpu::sum_squares(nullptr, nullptr, 0), 0.0);
}

TEST(GpuOptimizer, CountZerosMatchesCpu) {
  OMNI_REQUIRE_GPU();
  // Zeros at the first and last element and every 7th; n past a block's reach; offset 1 takes
  // the unpacked path. -0.0 is a zero too.
  const size_t n = 70001;
  for (size_t offset : {0, 1}) {
    std::vector<float> x = random_vector(n + offset, 50, 0.5f, 2.0f);
    for (size_t i = offset; i < x.size(); i += 7) x[i] = (i % 2) ? 0.0f : -0.0f;
    x.back() = 0.0f;
    gpu::DeviceArray<float> d(x.size());
    gpu::copy_to_device(d.data(), x.data(), x.size() * sizeof(float));
    const double want = ops::count_zeros(x.data() + offset, n);
    EXPECT_EQ(gpu::count_zeros(d.data() + offset, n), want) << "offset " << offset;
    EXPECT_GT(want, n / 7.0);
  }
  EXPECT_EQ(gpu::count_zeros(nullptr, 0), 0.0);
}

TEST(GpuOptimizer, HasNonfiniteFindsInfAndNanAtTheLastElement) {
  OMNI_REQUIRE_GPU();
  // n = 1001 is not a multiple of the pack; offset 1 takes the unpacked path.
  const size_t n = 1001;
  for (size_t offset : {0, 1}) {
    for (float bad :
         {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
          std::numeric_limits<float>::quiet_NaN()}) {
      std::vector<float> x = random_vector(n + offset, 40, -1e30f, 1e30f);
      gpu::DeviceArray<float> d(x.size());
      gpu::copy_to_device(d.data(), x.data(), x.size() * sizeof(float));
      EXPECT_FALSE(gpu::has_nonfinite(d.data() + offset, n)) << "offset " << offset;
      x.back() = bad;
      gpu::copy_to_device(d.data(), x.data(), x.size() * sizeof(float));
      EXPECT_TRUE(gpu::has_nonfinite(d.data() + offset, n)) << bad << " offset " << offset;
      // Not seen when it lies past n.
      EXPECT_FALSE(gpu::has_nonfinite(d.data() + offset, n - 1)) << bad << " offset " << offset;
    }
  }
}

template <typename T>
class GpuAdamW : public ::testing::Test {};
using StorageTypes = ::testing::Types<float, bf16, f16>;
TYPED_TEST_SUITE(GpuAdamW, StorageTypes);

// Five AdamW steps with weight decay, a gradient scale and new gradients each step, against
// update_elements<float> on gradients pre-multiplied by the scale (0.5: exact). Run on a whole
// array (packs and a tail) and on one starting an element in (unpacked).
TYPED_TEST(GpuAdamW, StepsMatchCpuUpdateElements) {
  OMNI_REQUIRE_GPU();
  using T = TypeParam;
  OptimizerConfig cfg;
  cfg.kind = OptimizerKind::AdamW;
  cfg.weight_decay = 0.1;
  cfg.adam_beta1 = 0.9;
  cfg.adam_beta2 = 0.95;
  cfg.adam_eps = 1e-8;
  const float lr = 1e-2f, grad_scale = 0.5f;
  const size_t n = 1003;
  for (size_t offset : {0, 1}) {
    std::vector<float> w = random_vector(n + offset, 50), m(n + offset, 0.0f), v(n + offset, 0.0f);
    std::vector<float> want_w = w, want_m = m, want_v = v;
    gpu::DeviceArray<float> dw(n + offset), dg(n + offset), dm(n + offset), dv(n + offset);
    Device<T> copy(n + offset);
    gpu::copy_to_device(dw.data(), w.data(), w.size() * sizeof(float));
    gpu::fill_zero(dm.data(), dm.size() * sizeof(float));
    gpu::fill_zero(dv.data(), dv.size() * sizeof(float));
    for (int step = 1; step <= 5; ++step) {
      const std::vector<float> g = random_vector(n + offset, 60 + step, -2.0f, 2.0f);
      gpu::copy_to_device(dg.data(), g.data(), g.size() * sizeof(float));
      const gpu::AdamWStep s{lr,
                             float(cfg.adam_beta1),
                             float(cfg.adam_beta2),
                             float(cfg.adam_eps),
                             float(cfg.weight_decay),
                             float(1.0 - std::pow(cfg.adam_beta1, step)),
                             float(1.0 - std::pow(cfg.adam_beta2, step)),
                             grad_scale};
      gpu::adamw_update(dw.data() + offset, copy.get() + offset, dg.data() + offset,
                        dm.data() + offset, dv.data() + offset, n, s);
      std::vector<float> scaled(n);
      for (size_t i = 0; i < n; ++i) scaled[i] = g[i + offset] * grad_scale;
      update_elements<float>(cfg, step, lr, true, want_w.data() + offset, scaled.data(),
                             want_m.data() + offset, want_v.data() + offset, int64_t(n));
    }
    gpu::synchronize();
    auto host = [&](const gpu::DeviceArray<float>& d) {
      std::vector<float> h(n);
      gpu::copy_to_host(h.data(), d.data() + offset, n * sizeof(float));
      return h;
    };
    auto tail = [&](const std::vector<float>& x) {
      return std::vector<float>(x.begin() + offset, x.end());
    };
    // Float arithmetic in the same order; only FMA contraction and sqrt's last bit differ,
    // compounded over five steps: a few ulp.
    const std::vector<float> got_w = host(dw);
    EXPECT_TRUE(close(got_w, tail(want_w), 1e-5, 1e-7)) << "params, offset " << offset;
    EXPECT_TRUE(close(host(dm), tail(want_m), 1e-5, 1e-7)) << "exp_avg, offset " << offset;
    EXPECT_TRUE(close(host(dv), tail(want_v), 1e-5, 1e-9)) << "exp_avg_sq, offset " << offset;
    // The model's copy is the new master weights rounded to T, exactly.
    const std::vector<float> got_copy = tail(copy.host());
    for (size_t i = 0; i < n; ++i)
      ASSERT_EQ(got_copy[i], from_storage(to_storage<T>(got_w[i]))) << "model copy at " << i;
    if (offset) {
      EXPECT_EQ(copy.host()[0], 0.0f) << "wrote before the range";
    }
  }
}

TEST(GpuOptimizer, AdamWWithoutModelCopyUpdatesMasterWeights) {
  OMNI_REQUIRE_GPU();
  OptimizerConfig cfg;
  const size_t n = 37;
  std::vector<float> w = random_vector(n, 70), g = random_vector(n, 71);
  std::vector<float> want_w = w, want_m(n, 0.0f), want_v(n, 0.0f);
  update_elements<float>(cfg, 1, 1e-3, true, want_w.data(), g.data(), want_m.data(), want_v.data(),
                         int64_t(n));
  Device<float> dw(w), dg(g), dm(n), dv(n);
  const gpu::AdamWStep s{1e-3f,
                         float(cfg.adam_beta1),
                         float(cfg.adam_beta2),
                         float(cfg.adam_eps),
                         float(cfg.weight_decay),
                         float(1.0 - cfg.adam_beta1),
                         float(1.0 - cfg.adam_beta2),
                         1.0f};
  gpu::adamw_update(dw.get(), static_cast<bf16*>(nullptr), dg.get(), dm.get(), dv.get(), n, s);
  EXPECT_TRUE(close(dw.host(), want_w, 1e-6, 1e-8));
}

// --optimizer sgd on the GPU: momentum and weight decay as the CPU's update_elements, over
// three steps (the momentum buffer carries over).
TEST(GpuOptimizer, SgdStepsMatchCpuUpdateElements) {
  OMNI_REQUIRE_GPU();
  OptimizerConfig cfg;
  cfg.kind = OptimizerKind::SGD, cfg.sgd_momentum = 0.9, cfg.weight_decay = 0.1;
  const size_t n = 1000;
  std::vector<float> w = random_vector(n, 80), want_w = w, want_m(n, 0.0f);
  Device<float> dw(w), dm(n);
  for (int step = 1; step <= 3; ++step) {
    const std::vector<float> g = random_vector(n, 80 + step);
    update_elements<float>(cfg, step, 1e-2, true, want_w.data(), g.data(), want_m.data(), nullptr,
                           int64_t(n));
    Device<float> dg(g);
    gpu::backend().sgd_update(dw.get(), dg.get(), dm.get(), n, 1e-2, 0.9, 0.1);
  }
  EXPECT_TRUE(close(dw.host(), want_w, 1e-6, 1e-7));
  EXPECT_TRUE(close(dm.host(), want_m, 1e-6, 1e-7));
}

}  // namespace
}  // namespace omni::gpu_test
