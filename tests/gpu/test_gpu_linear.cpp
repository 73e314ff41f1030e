// The GEMM wrapper (backend/gpu/blas.h) and the linear layers on the GPU against the CPU ops
// (ops::gemm, ops::linear_forward / linear_backward, ops::gelu_forward) on T-rounded inputs.
//
// Tolerances. Inputs lie in [-1, 1] and K <= 40, so a float sum of K products is off from
// another order by at most K 2^-24 sum|x w| <= 40 * 6e-8 * 40 = 1e-4: kSumAtol. Outputs stored
// as T are rounded once more (default_rtol<T>, several ulps of T). dw and dbias are float
// whatever T is (the inputs are exact in float), so they get float tolerances. GELU's slope is
// at most 1.13 in magnitude, so the pre-activation's rounding carries over to gelu_out nearly
// unchanged; near gelu's minimum (y ~ -0.75, output ~ -0.17) that error is absolute, hence an
// absolute slack of default_rtol / 8 there. cuBLASLt's GELU epilogue may evaluate tanh with
// the hardware approximation (PTX tanh.approx.f32, relative error about 2^-11), so gelu_out
// gets at least 1e-3 relative even for float.
#include <algorithm>
#include <bit>
#include <cstring>

#include "backend/gpu/blas.h"
#include "backend/ops.h"
#include "gpu/gpu_test.h"

namespace omni::gpu_test {
namespace {

namespace blas = gpu::blas;

constexpr double kSumAtol = 1e-4;

template <typename T>
class GpuGemm : public ::testing::Test {};
template <typename T>
class GpuLinear : public ::testing::Test {};
using StorageTypes = ::testing::Types<float, bf16, f16>;
TYPED_TEST_SUITE(GpuGemm, StorageTypes);
TYPED_TEST_SUITE(GpuLinear, StorageTypes);

struct Shape {
  int M, K, N;
};
// Not multiples of 8 or 16 (the epilogue falls back to kernels), multiples of 8 (cuBLASLt's
// fused GELU epilogue; the emulated GEMM keeps its ld_aux % 8 rule), one row.
constexpr Shape kShapes[] = {{5, 13, 7}, {17, 24, 16}, {1, 3, 33}, {9, 40, 24}};

// Every transpose combination, padded leading dimensions, alpha and beta, D as T and as float:
// the row-major to column-major mapping of blas.cu against ops::gemm.
TYPED_TEST(GpuGemm, EveryTransposeAndLeadingDimensionMatchesCpu) {
  OMNI_REQUIRE_GPU();
  using T = TypeParam;
  const int M = 7, N = 10, K = 13, pad = 3;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      for (bool float_out : {false, true}) {
        const int lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldd = N + pad;
        const auto a = rounded<T>(random_vector(size_t(ta ? K : M) * lda, 1));
        const auto b = rounded<T>(random_vector(size_t(tb ? N : K) * ldb, 2));
        auto d0 = random_vector(size_t(M) * ldd, 3);
        if (!float_out) d0 = rounded<T>(d0);
        std::vector<float> want = d0;
        ops::gemm<float>(ta, tb, M, N, K, 0.5f, a.data(), lda, b.data(), ldb, 1.0f, want.data(),
                         ldd);
        Device<T> da(a), db(b);
        Device<T> dd_t(d0);
        Device<float> dd_f(d0);
        blas::GemmProblem p;
        p.M = M, p.N = N, p.K = K, p.trans_a = ta, p.trans_b = tb;
        p.ab_type = dtype_of<T>();
        p.d_type = float_out ? DType::F32 : p.ab_type;
        p.A = da.get(), p.lda = lda, p.B = db.get(), p.ldb = ldb;
        p.D = float_out ? static_cast<void*>(dd_f.get()) : dd_t.get(), p.ldd = ldd;
        p.alpha = 0.5f, p.beta = 1.0f;
        ASSERT_EQ(blas::Gemm::can_implement(p), "") << blas::describe(p);
        blas::gemm(p, nullptr);
        const auto got = float_out ? dd_f.host() : dd_t.host();
        EXPECT_TRUE(close(got, want, float_out ? 1e-5 : default_rtol<T>(), kSumAtol))
            << blas::describe(p) << " lda " << lda << " ldb " << ldb;
      }
    }
  }
}

TYPED_TEST(GpuGemm, GeluEpilogueNeedsItsAuxLeadingDimensionToBeAMultipleOf8) {
  OMNI_REQUIRE_GPU();
  using T = TypeParam;
  Device<T> a(std::vector<float>(4 * 8, 1.0f)), b(std::vector<float>(8 * 8, 1.0f)), d(4 * 8),
      aux(4 * 8);
  blas::GemmProblem p;
  p.M = 4, p.N = 7, p.K = 8;
  p.ab_type = p.d_type = dtype_of<T>();
  p.A = a.get(), p.lda = 8, p.B = b.get(), p.ldb = 8, p.D = d.get(), p.ldd = 8;
  p.epilogue = blas::Epilogue::GeluAux, p.aux = aux.get(), p.ld_aux = 7;
  EXPECT_NE(blas::Gemm::can_implement(p), "");
  p.K = 0;
  EXPECT_NE(blas::Gemm::can_implement(p), "");
}

TYPED_TEST(GpuLinear, ForwardMatchesCpuWithAndWithoutBias) {
  OMNI_REQUIRE_GPU();
  using T = TypeParam;
  for (const Shape& s : kShapes) {
    for (bool with_bias : {false, true}) {
      const auto x = rounded<T>(random_vector(size_t(s.M) * s.K, 10));
      const auto w = rounded<T>(random_vector(size_t(s.N) * s.K, 11));
      const auto bias = rounded<T>(random_vector(s.N, 12));
      std::vector<float> want(size_t(s.M) * s.N);
      ops::linear_forward<float>(want.data(), x.data(), w.data(), with_bias ? bias.data() : nullptr,
                                 s.M, s.K, s.N);
      Device<T> dx(x), dw(w), db(bias), y(want.size());
      gpu::linear_forward(y.get(), dx.get(), dw.get(), with_bias ? db.get() : nullptr, s.M, s.K,
                          s.N);
      EXPECT_TRUE(close(y.host(), want, default_rtol<T>(), kSumAtol))
          << s.M << "x" << s.K << "x" << s.N << (with_bias ? " with bias" : "");
    }
  }
}

// The bias-GELU epilogue: y keeps the pre-activation, gelu_out = ops::gelu_forward(y), in
// both forms (tanh: cuBLASLt's epilogue; erf, Megatron's default: a kernel after the GEMM).
TYPED_TEST(GpuLinear, GeluEpilogueWritesPreActivationAndGeluInBothForms) {
  OMNI_REQUIRE_GPU();
  using T = TypeParam;
  for (GeluForm form : {GeluForm::Erf, GeluForm::Tanh}) {
    for (const Shape& s : kShapes) {
      for (bool with_bias : {false, true}) {
        const auto x = rounded<T>(random_vector(size_t(s.M) * s.K, 20));
        const auto w = rounded<T>(random_vector(size_t(s.N) * s.K, 21));
        const auto bias = rounded<T>(random_vector(s.N, 22));
        std::vector<float> y_want(size_t(s.M) * s.N), gelu_want(y_want.size());
        ops::linear_forward<float>(y_want.data(), x.data(), w.data(),
                                   with_bias ? bias.data() : nullptr, s.M, s.K, s.N);
        ops::gelu_forward<float>(gelu_want.data(), y_want.data(), y_want.size(), form);
        Device<T> dx(x), dw(w), db(bias), y(y_want.size()), gelu_out(y_want.size());
        gpu::linear_forward(y.get(), dx.get(), dw.get(), with_bias ? db.get() : nullptr, s.M, s.K,
                            s.N, nullptr, gelu_out.get(), form);
        const std::string what = std::string(to_string(form)) + " " + std::to_string(s.M) + "x" +
                                 std::to_string(s.K) + "x" + std::to_string(s.N) +
                                 (with_bias ? " with bias" : "");
        EXPECT_TRUE(close(y.host(), y_want, default_rtol<T>(), kSumAtol)) << what;
        EXPECT_TRUE(
            close(gelu_out.host(), gelu_want, default_rtol<T>(), kSumAtol + default_rtol<T>() / 8))
            << what;
      }
    }
  }
}

// dx overwritten or accumulated, dw accumulated in float onto a non-zero dw, dbias summed
// onto a non-zero dbias or skipped, dx skipped.
TYPED_TEST(GpuLinear, BackwardMatchesCpu) {
  OMNI_REQUIRE_GPU();
  using T = TypeParam;
  for (const Shape& s : kShapes) {
    for (int variant = 0; variant < 3; ++variant) {
      const bool accumulate = variant == 1, with_dx = variant != 2, with_dbias = variant != 2;
      const auto dy = rounded<T>(random_vector(size_t(s.M) * s.N, 30));
      const auto x = rounded<T>(random_vector(size_t(s.M) * s.K, 31));
      const auto w = rounded<T>(random_vector(size_t(s.N) * s.K, 32));
      const auto dx0 = rounded<T>(random_vector(size_t(s.M) * s.K, 33));
      const auto dw0 = random_vector(size_t(s.N) * s.K, 34);
      const auto db0 = random_vector(s.N, 35);
      std::vector<float> dx_want = dx0, dw_want = dw0, db_want = db0;
      ops::linear_backward<float>(with_dx ? dx_want.data() : nullptr, dw_want.data(),
                                  with_dbias ? db_want.data() : nullptr, dy.data(), x.data(),
                                  w.data(), s.M, s.K, s.N, accumulate);
      Device<T> ddy(dy), dx_(x), dw_(w), ddx(dx0);
      Device<float> ddw(dw0), ddb(db0);
      gpu::linear_backward(with_dx ? ddx.get() : nullptr, ddw.get(),
                           with_dbias ? ddb.get() : nullptr, ddy.get(), dx_.get(), dw_.get(), s.M,
                           s.K, s.N, accumulate);
      const std::string what = std::to_string(s.M) + "x" + std::to_string(s.K) + "x" +
                               std::to_string(s.N) + " variant " + std::to_string(variant);
      // dx += dy w with dx stored as T: cuBLASLt may round dy w to T before adding it (the
      // beta = 1 path of some of its algorithms), so the error scales with the terms' size,
      // |dx0| + |dy w|, not with their sum's, which cancels towards 0 in places.
      double atol = kSumAtol;
      if (accumulate) {
        std::vector<float> product(dx0.size());
        ops::linear_backward<float>(product.data(), std::vector<float>(dw0.size()).data(), nullptr,
                                    dy.data(), x.data(), w.data(), s.M, s.K, s.N);
        double terms = 0;
        for (size_t i = 0; i < product.size(); ++i)
          terms = std::max(terms, double(std::abs(product[i])) + std::abs(dx0[i]));
        atol += default_rtol<T>() * terms;
      }
      EXPECT_TRUE(close(ddx.host(), with_dx ? dx_want : dx0, default_rtol<T>(), atol)) << what;
      EXPECT_TRUE(close(ddw.host(), dw_want, 1e-5, kSumAtol)) << what;
      EXPECT_TRUE(close(ddb.host(), db_want, 1e-5, 1e-5)) << what;
    }
  }
}

// More rows than one block of the column sum takes (256) and more columns than one block
// covers (64): the partials of several blocks are added in order.
TYPED_TEST(GpuLinear, BiasGradientSpansSeveralBlocks) {
  OMNI_REQUIRE_GPU();
  using T = TypeParam;
  const int M = 600, K = 3, N = 70;
  const auto dy = rounded<T>(random_vector(size_t(M) * N, 40));
  const auto x = rounded<T>(random_vector(size_t(M) * K, 41));
  const auto w = rounded<T>(random_vector(size_t(N) * K, 42));
  std::vector<float> dw_want(size_t(N) * K), db_want(N, 0.25f);
  ops::linear_backward<float>(nullptr, dw_want.data(), db_want.data(), dy.data(), x.data(),
                              w.data(), M, K, N);
  Device<T> ddy(dy), dx_(x), dw_(w);
  Device<float> ddw(dw_want.size()), ddb(std::vector<float>(N, 0.25f));
  gpu::linear_backward<T>(nullptr, ddw.get(), ddb.get(), ddy.get(), dx_.get(), dw_.get(), M, K, N);
  // 600 terms in [-1, 1]: a float sum in another order is off by <= 600 * 600 * 6e-8 = 2e-2 at
  // worst, ~1e-5 in practice.
  EXPECT_TRUE(close(ddb.host(), db_want, 1e-5, 1e-4));
  EXPECT_TRUE(close(ddw.host(), dw_want, 1e-5, 1e-4));
}

// The same inputs give the same bits (fixed algorithm per shape, no atomics).
TYPED_TEST(GpuLinear, BackwardIsBitwiseReproducible) {
  OMNI_REQUIRE_GPU();
  using T = TypeParam;
  const int M = 33, K = 24, N = 40;
  const auto dy = random_vector(size_t(M) * N, 50), x = random_vector(size_t(M) * K, 51),
             w = random_vector(size_t(N) * K, 52);
  std::vector<float> first[3];
  for (int run = 0; run < 2; ++run) {
    Device<T> ddy(dy), dx_(x), dw_(w), ddx(size_t(M) * K);
    Device<float> ddw(size_t(N) * K), ddb(N);
    gpu::linear_backward(ddx.get(), ddw.get(), ddb.get(), ddy.get(), dx_.get(), dw_.get(), M, K, N);
    const std::vector<float> got[3] = {ddx.host(), ddw.host(), ddb.host()};
    for (int i = 0; i < 3; ++i) {
      if (run == 0) {
        first[i] = got[i];
      } else {
        EXPECT_EQ(std::memcmp(first[i].data(), got[i].data(), got[i].size() * sizeof(float)), 0)
            << "output " << i;
      }
    }
  }
}

}  // namespace
}  // namespace omni::gpu_test
