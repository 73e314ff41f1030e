// Dropout on the GPU against the CPU: the hidden-dropout kernel (backend/gpu/dropout.cu) gives
// the CPU's bits (the same Philox masks, the same float product rounded once to T), and the
// flash attention kernels with attention dropout (mask drawn in the forward and again in the
// backward from the key) match the CPU's attention with the same key within
// test_gpu_attention.cpp's tolerances, and miss it with another key.
#include "gpu/attention_reference.h"

namespace omni::gpu_test {
namespace {

template <typename T>
class GpuDropout : public ::testing::Test {};
using StorageTypes = ::testing::Types<float, bf16, f16>;
TYPED_TEST_SUITE(GpuDropout, StorageTypes);

// Rows of a sequence-parallel rank's share of a context-parallel micro-batch: positions in
// the full sequence, a row offset and a width not divisible by four.
TYPED_TEST(GpuDropout, HiddenDropoutKernelGivesTheCpusBits) {
  OMNI_REQUIRE_GPU();
  using T = TypeParam;
  for (int width : {64, 30}) {
    const int rows = 40, seq = 16;
    ops::DropoutKey k = ops::dropout_key(0.25, 77, 9, 3, ops::DropoutSite::MlpOutput);
    k.first_sample = 11, k.cp = 2, k.cp_rank = 1, k.first_row = 8;
    const std::vector<float> x = rounded<T>(random_vector(size_t(rows) * width, 5, -3.0f, 3.0f));
    std::vector<float> want = x;
    ops::dropout(want.data(), rows, width, seq, k);
    want = rounded<T>(want);  // the float product, rounded once to T
    Device<T> d(x);
    gpu::dropout(d.get(), rows, width, seq, k);
    const std::vector<float> got = d.host();
    size_t zeros = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_EQ(got[i], want[i]) << "element " << i << " of width " << width;
      zeros += got[i] == 0.0f;
    }
    EXPECT_GT(zeros, x.size() / 8);  // the mask drops about a quarter
    EXPECT_LT(zeros, x.size() * 3 / 8);
  }
}

template <typename T>
void expect_attention_dropout_matches_cpu(Case c) {
  const Inputs<T> in(c);
  const Result got = gpu_attention<T>(c, in), want = cpu_attention<T>(c, in);
  const double tol = attention_tol<T>();
  EXPECT_TRUE(close_scaled(got.out, want.out, tol)) << "out";
  EXPECT_TRUE(close(got.lse, want.lse, 1e-4, 1e-4)) << "lse";
  EXPECT_TRUE(close_scaled(got.dq, want.dq, tol)) << "dq";
  EXPECT_TRUE(close_scaled(got.dk, want.dk, tol)) << "dk";
  EXPECT_TRUE(close_scaled(got.dv, want.dv, tol)) << "dv";
  // Another sample's mask is far outside the tolerance: the comparison sees the mask.
  Case other = c;
  other.d.dropout.first_sample += 1;
  EXPECT_FALSE(close_scaled(got.out, cpu_attention<T>(other, in).out, tol));
}

// head_dim 64: the tensor-core path for bf16/f16, the scalar one for float; tensor-parallel
// heads from 4 on.
TYPED_TEST(GpuDropout, FlashAttentionWithDropoutMatchesTheCpu) {
  OMNI_REQUIRE_GPU();
  Case c{{2, 70, 4, 2, 64}, {}, {}, 81};
  c.d.dropout = ops::dropout_key(0.2, 13, 6, 1, ops::DropoutSite::Attention);
  c.d.dropout.first_sample = 5, c.d.dropout.head_offset = 4;
  expect_attention_dropout_matches_cpu<TypeParam>(c);
}

// A head_dim the tensor-core path does not take: the scalar kernels for every type.
TYPED_TEST(GpuDropout, FlashAttentionWithDropoutOddHeadDim) {
  OMNI_REQUIRE_GPU();
  Case c{{1, 45, 2, 2, 40}, {}, {}, 82};
  c.d.dropout = ops::dropout_key(0.3, 14, 2, 0, ops::DropoutSite::Attention);
  expect_attention_dropout_matches_cpu<TypeParam>(c);
}

// Ring attention: rank 1 of 2's queries against rank 0's key block (fully visible), whose
// keys sit at other positions of the full sequence.
TYPED_TEST(GpuDropout, FlashAttentionWithDropoutOnARingBlock) {
  OMNI_REQUIRE_GPU();
  const int seq = 64;
  Case c{{1, seq, 2, 1, 64}, {}, std::vector<int32_t>(seq, seq - 1), 83};
  c.d.dropout = ops::dropout_key(0.1, 15, 3, 2, ops::DropoutSite::Attention);
  c.d.dropout.cp = 2, c.d.dropout.cp_rank = 1, c.d.dropout.key_rank = 0;
  expect_attention_dropout_matches_cpu<TypeParam>(c);
}

}  // namespace
}  // namespace omni::gpu_test
