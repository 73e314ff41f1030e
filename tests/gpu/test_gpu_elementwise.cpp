// Element-wise GPU ops against the CPU ops.
#include "backend/ops.h"
#include "gpu/gpu_test.h"

namespace omni::gpu_test {
namespace {

template <typename T>
class GpuElementwise : public ::testing::Test {};
using StorageTypes = ::testing::Types<float, bf16, f16>;
TYPED_TEST_SUITE(GpuElementwise, StorageTypes);

TYPED_TEST(GpuElementwise, ConversionRoundsToNearestEvenLikeTheHost) {
  OMNI_REQUIRE_GPU();
  using T = TypeParam;
  // Ties, NaN, infinities, overflow, subnormals.
  std::vector<float> x = random_vector(1000, 1, -70000.0f, 70000.0f);
  const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 65504.0f, 65520.0f, 1e-8f,
                            -3e-7f, 1.00390625f, 1.01171875f, 3.4e38f, 1e-40f};
  x.insert(x.end(), std::begin(specials), std::end(specials));
  gpu::DeviceArray<float> src(x.size());
  gpu::copy_to_device(src.data(), x.data(), x.size() * sizeof(float));
  Device<T> dst(x.size());
  gpu::convert_from_float(dst.get(), src.data(), x.size());
  const std::vector<float> got = dst.host();
  for (size_t i = 0; i < x.size(); ++i) {
    const float want = from_storage(to_storage<T>(x[i]));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got[i])) << i;
    } else {
      EXPECT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want))
          << "element " << i << " = " << x[i];
    }
  }
}

TYPED_TEST(GpuElementwise, AddMatchesCpu) {
  OMNI_REQUIRE_GPU();
  using T = TypeParam;
  const size_t n = 3001;
  const auto a = rounded<T>(random_vector(n, 2)), b = rounded<T>(random_vector(n, 3));
  std::vector<float> want(n);
  ops::add(want.data(), a.data(), b.data(), n);
  Device<T> da(a), db(b), out(n);
  gpu::add(out.get(), da.get(), db.get(), n);
  EXPECT_TRUE(close(out.host(), want, default_rtol<T>(), 1e-6));
}

}  // namespace
}  // namespace omni::gpu_test
