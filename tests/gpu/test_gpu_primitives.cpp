// The portability header's building blocks, each on its own (see primitives_check.h).
#include "backend/gpu/primitives_check.h"

#include <algorithm>
#include <numeric>

#include "gpu/gpu_test.h"

namespace omni::gpu_test {
namespace {

TEST(GpuPrimitives, BlockSumAndMaxAtEveryBlockSize) {
  OMNI_REQUIRE_GPU();
  const int blocks = 3, n = 1000;
  // Small integers: every summation order gives the exact sum.
  std::vector<float> x = random_vector(size_t{blocks} * n, 7, -8.0f, 8.0f);
  for (auto& v : x) v = std::round(v);
  for (int threads : {32, 64, 128, 256, 1024}) {
    Device<float> dx(x), out(2 * blocks);
    gpu::block_reduce_check(out.get(), dx.get(), blocks, n, threads);
    const auto got = out.host();
    for (int b = 0; b < blocks; ++b) {
      const auto first = x.begin() + b * n, last = first + n;
      EXPECT_EQ(got[b], std::accumulate(first, last, 0.0f)) << threads << " threads";
      EXPECT_EQ(got[blocks + b], *std::max_element(first, last)) << threads << " threads";
    }
  }
}

template <typename T>
class GpuMma : public ::testing::Test {};
using MmaTypes = ::testing::Types<bf16, f16>;
TYPED_TEST_SUITE(GpuMma, MmaTypes);

TYPED_TEST(GpuMma, FragmentLayoutMultipliesLikeTheCpu) {
  OMNI_REQUIRE_GPU();
  using T = TypeParam;
  // Small integers are exact in bf16/f16 and their products sum exactly in float, so the
  // result must be exact: any fragment mixed up shows.
  auto ints = [](size_t n, uint32_t seed) {
    auto v = random_vector(n, seed, -4.0f, 4.0f);
    for (auto& x : v) x = std::round(x);
    return v;
  };
  const auto a = ints(16 * 16, 11), b = ints(16 * 8, 12);
  Device<T> da(a), db(b);
  Device<float> dc(16 * 8);
  if (!gpu::mma_16x8x16_check(dc.get(), da.get(), db.get()))
    GTEST_SKIP() << "this build has no m16n8k16 tensor-core instruction (AMD: scalar path)";
  const auto c = dc.host();
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 8; ++j) {
      float want = 0;
      for (int k = 0; k < 16; ++k) want += a[i * 16 + k] * b[k * 8 + j];
      EXPECT_EQ(c[i * 8 + j], want) << "C[" << i << "][" << j << "]";
    }
}

}  // namespace
}  // namespace omni::gpu_test
