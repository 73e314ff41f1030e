// Flash attention on the GPU (backend/gpu/attention_*.cu) against the CPU's attention
// (ops::attention_forward/backward<float>) on the same
// T-rounded inputs: output, lse and the three gradients, for causal attention, grouped-query
// and multi-query heads, packed documents (key_start) and ring-attention key blocks (q_index).
//
// Tolerances, as |gpu - cpu| <= rtol |cpu| + rtol * max|cpu| per tensor (an absolute floor
// scaled to the tensor, since gradients mix signs and cancel). Measured in the emulator, the
// worst errors are ~2.7e-3 for bf16, below 1.5e-3 for f16 and below 1e-5 for float; the
// tolerances leave about 4x for other shapes and the device's approximate exp2:
//   float: 5e-5. The same math in another order (online softmax, exp2 of pre-scaled scores,
//          tiles of keys).
//   bf16:  1e-2. Outputs are rounded to bf16 (2^-9); the tensor-core path also rounds the
//          probabilities P and the score gradients dS to bf16 before their matmuls (2^-9
//          each, averaged over the keys) and the backward reads the bf16-rounded output for
//          D = dO . O, whose error is multiplied by P in every dS.
//   f16:   4e-3. The same roundings with f16's 2^-12 (plus f16's smaller range of exponents
//          for small gradients).
#include <cstring>

#include "gpu/attention_reference.h"

namespace omni::gpu_test {
namespace {

template <typename T>
void expect_matches_cpu(const Case& c) {
  const Inputs<T> in(c);
  const Result want = cpu_attention<T>(c, in), got = gpu_attention<T>(c, in);
  const double tol = attention_tol<T>();
  EXPECT_TRUE(close_scaled(got.out, want.out, tol)) << "out";
  // lse is float on both sides; only the inputs' rounding is shared, so float's tolerance.
  EXPECT_TRUE(close(got.lse, want.lse, 1e-4, 1e-4)) << "lse";
  EXPECT_TRUE(close_scaled(got.dq, want.dq, tol)) << "dq";
  EXPECT_TRUE(close_scaled(got.dk, want.dk, tol)) << "dk";
  EXPECT_TRUE(close_scaled(got.dv, want.dv, tol)) << "dv";
}

template <typename T>
class GpuFlashAttention : public ::testing::Test {};
using StorageTypes = ::testing::Types<float, bf16, f16>;
TYPED_TEST_SUITE(GpuFlashAttention, StorageTypes);

// Sequences not a multiple of any tile (70), two samples, 4 query heads on 2 key heads.
TYPED_TEST(GpuFlashAttention, CausalGroupedQueryHeadDim64) {
  OMNI_REQUIRE_GPU();
  expect_matches_cpu<TypeParam>({{2, 70, 4, 2, 64}, {}, {}, 1});
}

// Multi-query (one key head), head_dim 128.
TYPED_TEST(GpuFlashAttention, CausalMultiQueryHeadDim128) {
  OMNI_REQUIRE_GPU();
  expect_matches_cpu<TypeParam>({{1, 77, 2, 1, 128}, {}, {}, 11});
}

// A head_dim the tensor-core path does not take: the scalar path for every storage type.
TYPED_TEST(GpuFlashAttention, CausalOddHeadDim) {
  OMNI_REQUIRE_GPU();
  expect_matches_cpu<TypeParam>({{2, 45, 2, 2, 40}, {}, {}, 21});
}

// One row: the degenerate softmax over a single key.
TYPED_TEST(GpuFlashAttention, SingleRow) {
  OMNI_REQUIRE_GPU();
  expect_matches_cpu<TypeParam>({{1, 1, 2, 1, 64}, {}, {}, 31});
}

// Documents packed in a sample (Megatron's --reset-attention-mask): row n sees keys from its
// document's first token; documents start inside tiles and span several.
TYPED_TEST(GpuFlashAttention, PackedDocumentsKeyStart) {
  OMNI_REQUIRE_GPU();
  const int seq = 100;
  Case c{{2, seq, 4, 2, 64}, std::vector<int32_t>(2 * seq), {}, 41};
  const std::vector<std::vector<int>> starts = {{0, 23, 30, 71}, {0, 64, 65}};
  for (int b = 0; b < 2; ++b)
    for (int i = 0; i < seq; ++i) {
      int s = 0;
      for (int x : starts[b])
        if (x <= i) s = x;
      c.key_start[b * seq + i] = s;
    }
  expect_matches_cpu<TypeParam>(c);
}

// Ring attention, a key block from an earlier rank: every row sees every key.
TYPED_TEST(GpuFlashAttention, RingBlockFullyVisible) {
  OMNI_REQUIRE_GPU();
  const int seq = 70;
  Case c{{1, seq, 2, 1, 64}, {}, std::vector<int32_t>(seq, seq - 1), 51};
  expect_matches_cpu<TypeParam>(c);
}

// Ring attention with packed documents: rows see keys [key_start, q_index], and rows whose
// range is empty (q_index -1, or a document starting after the block) get zero output,
// lse = -inf and zero gradients.
TYPED_TEST(GpuFlashAttention, RingBlockWithEmptyRows) {
  OMNI_REQUIRE_GPU();
  const int seq = 80;
  Case c{{2, seq, 4, 2, 128}, std::vector<int32_t>(2 * seq), std::vector<int32_t>(2 * seq), 61};
  for (int b = 0; b < 2; ++b)
    for (int i = 0; i < seq; ++i) {
      const int n = b * seq + i;
      c.q_index[n] = b == 0 ? std::max(-1, i - 37) : seq - 1;
      c.key_start[n] = b == 0 ? 0 : (i < 50 ? 10 : 79 + (i >= 60));  // rows 60+ see no key
    }
  expect_matches_cpu<TypeParam>(c);
}

// Two backward runs give the same bits (no atomics whose order depends on scheduling).
TYPED_TEST(GpuFlashAttention, BackwardIsDeterministic) {
  OMNI_REQUIRE_GPU();
  using T = TypeParam;
  const Case c{{2, 70, 4, 2, 64}, {}, {}, 71};
  const Inputs<T> in(c);
  const Result a = gpu_attention<T>(c, in), b = gpu_attention<T>(c, in);
  for (auto [x, y] : {std::pair{&a.dq, &b.dq}, {&a.dk, &b.dk}, {&a.dv, &b.dv}})
    EXPECT_EQ(0, std::memcmp(x->data(), y->data(), x->size() * sizeof(float)));
}

}  // namespace
}  // namespace omni::gpu_test
