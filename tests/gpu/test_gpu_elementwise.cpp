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
  const float specials[] = {0.0f,  -0.0f,  INFINITY,    -INFINITY,   NAN,     65504.0f, 65520.0f,
                            1e-8f, -3e-7f, 1.00390625f, 1.01171875f, 3.4e38f, 1e-40f};
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

// The kernels take 16-byte packs when the pointers are aligned and the size allows, single
// elements otherwise. Each op is run both ways: on whole arrays (packs plus a tail of
// n % pack elements) and on sub-arrays starting one element in (misaligned: the scalar path).
constexpr size_t kOffsets[] = {0, 1};

// Tolerances: float results differ from the CPU only by exp's last bit and FMA contraction
// (a few ulp, rtol 1e-5); bf16/f16 outputs are rounded once more (default_rtol). atol 1e-6
// covers results that cancel to near 0 (GELU's derivative around x = -0.75, f16 subnormals).
constexpr double kAtol = 1e-6;

TYPED_TEST(GpuElementwise, AddOnMisalignedArraysMatchesCpu) {
  OMNI_REQUIRE_GPU();
  using T = TypeParam;
  const size_t n = 1001;
  const auto a = rounded<T>(random_vector(n + 1, 4)), b = rounded<T>(random_vector(n + 1, 5));
  std::vector<float> want(n);
  ops::add(want.data(), a.data() + 1, b.data() + 1, n);
  Device<T> da(a), db(b), out(n + 1);
  gpu::add(out.get() + 1, da.get() + 1, db.get() + 1, n);
  const std::vector<float> got = out.host();
  EXPECT_EQ(got[0], 0.0f) << "wrote before the output";
  EXPECT_TRUE(close({got.begin() + 1, got.end()}, want, default_rtol<T>(), kAtol));
}

TYPED_TEST(GpuElementwise, AddBiasMatchesCpu) {
  OMNI_REQUIRE_GPU();
  using T = TypeParam;
  // Widths that are and are not a multiple of the pack; one row; many rows (grid-stride).
  for (auto [M, N] : {std::pair{7, 40}, std::pair{5, 13}, std::pair{1, 24}, std::pair{300, 8}}) {
    const auto y = rounded<T>(random_vector(size_t(M) * N, 6)),
               bias = rounded<T>(random_vector(N, 7));
    std::vector<float> want = y;
    ops::add_bias(want.data(), bias.data(), M, N);
    Device<T> dy(y), db(bias);
    gpu::add_bias(dy.get(), db.get(), M, N);
    EXPECT_TRUE(close(dy.host(), want, default_rtol<T>(), kAtol)) << M << "x" << N;
  }
}

// Both forms: Megatron's default erf GELU and --openai-gelu's tanh.
constexpr GeluForm kGeluForms[] = {GeluForm::Erf, GeluForm::Tanh};

TYPED_TEST(GpuElementwise, GeluForwardMatchesCpuInBothForms) {
  OMNI_REQUIRE_GPU();
  using T = TypeParam;
  for (GeluForm form : kGeluForms)
    for (size_t offset : kOffsets) {
      // 3001: not a multiple of any pack width; [-12, 12] reaches exp's overflow (x -> -inf: 0).
      const size_t n = 3001;
      const auto x = rounded<T>(random_vector(n + offset, 8, -12.0f, 12.0f));
      std::vector<float> want(n);
      ops::gelu_forward(want.data(), x.data() + offset, n, form);
      Device<T> dx(x), out(n + offset);
      gpu::gelu_forward(out.get() + offset, dx.get() + offset, n, form);
      const std::vector<float> got = out.host();
      EXPECT_TRUE(close({got.begin() + offset, got.end()}, want, default_rtol<T>(), kAtol))
          << to_string(form) << " offset " << offset;
    }
}

TYPED_TEST(GpuElementwise, GeluBackwardMatchesCpuInBothForms) {
  OMNI_REQUIRE_GPU();
  using T = TypeParam;
  for (GeluForm form : kGeluForms)
    for (size_t offset : kOffsets) {
      const size_t n = 3001;
      const auto x = rounded<T>(random_vector(n + offset, 9, -12.0f, 12.0f));
      const auto dout = rounded<T>(random_vector(n + offset, 10));
      std::vector<float> want(n);
      ops::gelu_backward(want.data(), dout.data() + offset, x.data() + offset, n, form);
      Device<T> dx(x), dd(dout), out(n + offset);
      gpu::gelu_backward(out.get() + offset, dd.get() + offset, dx.get() + offset, n, form);
      const std::vector<float> got = out.host();
      EXPECT_TRUE(close({got.begin() + offset, got.end()}, want, default_rtol<T>(), kAtol))
          << to_string(form) << " offset " << offset;
    }
}

// x [N, 2F] = [gate | up] per row (Megatron's chunk order).
TYPED_TEST(GpuElementwise, SwigluForwardMatchesCpu) {
  OMNI_REQUIRE_GPU();
  using T = TypeParam;
  for (auto [N, F] : {std::pair{5, 24}, std::pair{3, 13}, std::pair{1, 8}, std::pair{70, 16}}) {
    const auto x = rounded<T>(random_vector(size_t(N) * 2 * F, 11, -8.0f, 8.0f));
    std::vector<float> want(size_t(N) * F);
    ops::swiglu_forward(want.data(), x.data(), N, F);
    Device<T> dx(x), out(size_t(N) * F);
    gpu::swiglu_forward(out.get(), dx.get(), N, F);
    EXPECT_TRUE(close(out.host(), want, default_rtol<T>(), kAtol)) << N << "x" << F;
  }
}

TYPED_TEST(GpuElementwise, SwigluBackwardMatchesCpu) {
  OMNI_REQUIRE_GPU();
  using T = TypeParam;
  for (auto [N, F] : {std::pair{5, 24}, std::pair{3, 13}, std::pair{1, 8}, std::pair{70, 16}}) {
    const auto x = rounded<T>(random_vector(size_t(N) * 2 * F, 12, -8.0f, 8.0f));
    const auto dout = rounded<T>(random_vector(size_t(N) * F, 13));
    std::vector<float> want(size_t(N) * 2 * F);
    ops::swiglu_backward(want.data(), dout.data(), x.data(), N, F);
    Device<T> dx(x), dd(dout), out(size_t(N) * 2 * F);
    gpu::swiglu_backward(out.get(), dd.get(), dx.get(), N, F);
    EXPECT_TRUE(close(out.host(), want, default_rtol<T>(), kAtol)) << N << "x" << F;
  }
}

// The strided copy Ulysses packs its all-to-all blocks with: rows of `width` floats between
// pitches that differ, against the host's row-by-row copy; what lies between rows untouched.
TEST(GpuMemory, CopyRowsMatchesARowByRowCopy) {
  OMNI_REQUIRE_GPU();
  const size_t rows = 7, width = 10, src_pitch = 13, dst_pitch = 11;
  const std::vector<float> src = random_vector(rows * src_pitch, 5);
  std::vector<float> want = random_vector(rows * dst_pitch, 6);
  gpu::DeviceArray<float> d_src(src.size()), d_dst(want.size());
  gpu::copy_to_device(d_src.data(), src.data(), src.size() * sizeof(float));
  gpu::copy_to_device(d_dst.data(), want.data(), want.size() * sizeof(float));
  gpu::copy_rows_on_device(d_dst.data(), dst_pitch * sizeof(float), d_src.data(),
                           src_pitch * sizeof(float), width * sizeof(float), rows);
  for (size_t r = 0; r < rows; ++r)
    std::copy_n(src.begin() + r * src_pitch, width, want.begin() + r * dst_pitch);
  std::vector<float> got(want.size());
  gpu::copy_to_host(got.data(), d_dst.data(), got.size() * sizeof(float));
  EXPECT_EQ(got, want);
}

}  // namespace
}  // namespace omni::gpu_test
