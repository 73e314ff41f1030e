// The kernels' element types and conversions are base/dtype.h's: the device widens every
// 16-bit pattern to the host's float bits, and the GEMM takes only the types it can multiply.
#include <bit>
#include <cstdint>
#include <vector>

#include "backend/gpu/blas.h"
#include "gpu/gpu_test.h"

namespace omni::gpu_test {
namespace {

namespace blas = gpu::blas;

template <typename T>
class GpuDType : public ::testing::Test {};
using HalfTypes = ::testing::Types<bf16, f16>;
TYPED_TEST_SUITE(GpuDType, HalfTypes);

TYPED_TEST(GpuDType, DeviceWidensEveryBitPatternLikeTheHost) {
  OMNI_REQUIRE_GPU();
  using T = TypeParam;
  static_assert(std::is_same_v<T, gpu::bf16> || std::is_same_v<T, gpu::f16>);
  std::vector<T> all(65536);
  for (uint32_t h = 0; h < all.size(); ++h) all[h] = T{static_cast<uint16_t>(h)};
  gpu::DeviceArray<T> src(all.size());
  gpu::copy_to_device(src.data(), all.data(), all.size() * sizeof(T));
  gpu::DeviceArray<float> dst(all.size());
  gpu::convert_to_float(dst.data(), src.data(), all.size());
  gpu::synchronize();
  std::vector<float> got(all.size());
  gpu::copy_to_host(got.data(), dst.data(), got.size() * sizeof(float));
  for (uint32_t h = 0; h < all.size(); ++h)
    ASSERT_EQ(std::bit_cast<uint32_t>(got[h]), std::bit_cast<uint32_t>(to_float(all[h])))
        << std::hex << "pattern 0x" << h;
}

TEST(GpuDType, GemmRefusesF64AndNamesTheTypes) {
  OMNI_REQUIRE_GPU();
  gpu::DeviceArray<double> a(64), b(64), d(64);
  blas::GemmProblem p;
  p.M = p.N = p.K = 8;
  p.ab_type = p.d_type = DType::F64;
  p.A = a.data(), p.lda = 8, p.B = b.data(), p.ldb = 8, p.D = d.data(), p.ldd = 8;
  EXPECT_EQ(blas::Gemm::can_implement(p), "matrices must be f32, bf16 or f16");
  EXPECT_EQ(blas::describe(p), "[gemm] 8x8x8 f64 x f64 -> f64 (N,N)");
  p.ab_type = DType::BF16, p.d_type = DType::F32;
  EXPECT_EQ(blas::Gemm::can_implement(p), "");
}

}  // namespace
}  // namespace omni::gpu_test
