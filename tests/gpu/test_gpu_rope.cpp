// The fused-QKV split and merge and rotary position embedding on the GPU against the CPU ops
// (backend/cpu/attention.cpp) on the same T-rounded inputs.
//
// Split and merge move elements: the results must equal the CPU's bit for bit. RoPE: each
// output is x1 cos - x2 sin (or x2 cos + x1 sin) in float from the same float cos/sin tables;
// the GPU may fuse a multiply-add (one rounding fewer), so float results agree to a couple of
// ulps of the products, |x| <= 1 here: 1e-6 absolute plus default_rtol<T>, which for bf16/f16
// allows for the output's rounding to T.
#include <cmath>
#include <vector>

#include "backend/ops.h"
#include "gpu/gpu_test.h"

namespace omni::gpu_test {
namespace {

template <typename T>
class GpuRope : public ::testing::Test {};
using StorageTypes = ::testing::Types<float, bf16, f16>;
TYPED_TEST_SUITE(GpuRope, StorageTypes);

// Grouped-query attention with two groups of two heads, and multi-query (one group); head_dim
// 16 takes the 16-byte path, 6 the per-element one.
std::vector<ops::AttentionDims> qkv_dims() {
  std::vector<ops::AttentionDims> dims;
  for (int groups : {2, 1})
    for (int head_dim : {16, 6}) dims.push_back({2, 3, 4, groups, head_dim});
  return dims;
}

std::string describe(const ops::AttentionDims& d) {
  return "groups " + std::to_string(d.groups) + ", head_dim " + std::to_string(d.head_dim);
}

TYPED_TEST(GpuRope, QkvSplitMatchesCpuExactly) {
  OMNI_REQUIRE_GPU();
  using T = TypeParam;
  for (const auto& d : qkv_dims()) {
    SCOPED_TRACE(describe(d));
    const size_t N = size_t(d.batch) * d.seq;
    const auto qkv = rounded<T>(random_vector(N * d.qkv_width(), 1));
    std::vector<float> q(N * d.heads * d.head_dim), k(N * d.groups * d.head_dim), v(k.size());
    ops::qkv_split(q.data(), k.data(), v.data(), qkv.data(), d);
    Device<T> dqkv(qkv), dq(q.size()), dk(k.size()), dv(v.size());
    gpu::qkv_split(dq.get(), dk.get(), dv.get(), dqkv.get(), d);
    EXPECT_EQ(dq.host(), q);
    EXPECT_EQ(dk.host(), k);
    EXPECT_EQ(dv.host(), v);
  }
}

TYPED_TEST(GpuRope, QkvMergeMatchesCpuExactlyAndInvertsSplit) {
  OMNI_REQUIRE_GPU();
  using T = TypeParam;
  for (const auto& d : qkv_dims()) {
    SCOPED_TRACE(describe(d));
    const size_t N = size_t(d.batch) * d.seq;
    const auto q = rounded<T>(random_vector(N * d.heads * d.head_dim, 2));
    const auto k = rounded<T>(random_vector(N * d.groups * d.head_dim, 3));
    const auto v = rounded<T>(random_vector(k.size(), 4));
    std::vector<float> qkv(N * d.qkv_width());
    ops::qkv_merge(qkv.data(), q.data(), k.data(), v.data(), d);
    Device<T> dq(q), dk(k), dv(v), dqkv(qkv.size());
    gpu::qkv_merge(dqkv.get(), dq.get(), dk.get(), dv.get(), d);
    EXPECT_EQ(dqkv.host(), qkv);
    Device<T> q2(q.size()), k2(k.size()), v2(v.size());
    gpu::qkv_split(q2.get(), k2.get(), v2.get(), dqkv.get(), d);
    EXPECT_EQ(q2.host(), q);
    EXPECT_EQ(k2.host(), k);
    EXPECT_EQ(v2.host(), v);
  }
}

struct RopeCase {
  int N, seq, nheads, head_dim;
  bool with_positions;
  int rotary_dim = 0;  // 0: every channel (--rotary-percent 1)
};
// Two sequences of 5 at n % seq, and packed documents at explicit positions (restarting at
// 0); head_dim 16 takes the 16-byte path, 10 (half = 5) the per-element one; rotary
// dimensions 8 and 6 rotate part of each head (--rotary-percent 0.5 and 0.6), the rest
// passing through.
constexpr RopeCase kRopeCases[] = {{10, 5, 3, 16, false},   {10, 5, 3, 16, true},
                                   {10, 5, 3, 10, false},   {10, 5, 3, 10, true},
                                   {10, 5, 3, 16, true, 8}, {10, 5, 3, 10, false, 6}};

// Tables as the model makes them (ops::rope_tables, double), as float for the GPU.
struct RopeTables {
  std::vector<double> cos, sin;
  std::vector<float> cos_f, sin_f;
  RopeTables(int seq, int head_dim)
      : cos(size_t(seq) * (head_dim / 2)), sin(cos.size()), cos_f(cos.size()), sin_f(cos.size()) {
    ops::rope_tables(cos.data(), sin.data(), seq, head_dim, 10000.0);
    for (size_t i = 0; i < cos.size(); ++i) cos_f[i] = float(cos[i]), sin_f[i] = float(sin[i]);
  }
};

// Documents of 3, 5 and 2 tokens packed into the 10 rows: explicit positions restart at 0.
const std::vector<int32_t> kPackedPositions = {0, 1, 2, 0, 1, 2, 3, 4, 0, 1};

TYPED_TEST(GpuRope, ForwardAndBackwardMatchCpu) {
  OMNI_REQUIRE_GPU();
  using T = TypeParam;
  for (const auto& rc : kRopeCases) {
    const int rd = rc.rotary_dim ? rc.rotary_dim : rc.head_dim;
    SCOPED_TRACE("head_dim " + std::to_string(rc.head_dim) + ", rotary " + std::to_string(rd) +
                 (rc.with_positions ? ", positions" : ", n % seq"));
    const RopeTables tables(rc.seq, rd);
    const int32_t* host_pos = rc.with_positions ? kPackedPositions.data() : nullptr;
    const gpu::DeviceArray<int32_t> dpos = to_device(kPackedPositions);
    const int32_t* dev_pos = rc.with_positions ? dpos.data() : nullptr;
    Device<float> dcos(tables.cos_f), dsin(tables.sin_f);
    const size_t n = size_t(rc.N) * rc.nheads * rc.head_dim;
    const auto x = rounded<T>(random_vector(n, 5));
    for (bool backward : {false, true}) {
      SCOPED_TRACE(backward ? "backward" : "forward");
      std::vector<float> want = x;
      Device<T> got(x);
      if (backward) {
        ops::rope_backward(want.data(), tables.cos.data(), tables.sin.data(), rc.N, rc.seq,
                           rc.nheads, rc.head_dim, host_pos, rd);
        gpu::rope_backward(got.get(), dcos.get(), dsin.get(), rc.N, rc.seq, rc.nheads, rc.head_dim,
                           dev_pos, rd);
      } else {
        ops::rope_forward(want.data(), tables.cos.data(), tables.sin.data(), rc.N, rc.seq,
                          rc.nheads, rc.head_dim, host_pos, rd);
        gpu::rope_forward(got.get(), dcos.get(), dsin.get(), rc.N, rc.seq, rc.nheads, rc.head_dim,
                          dev_pos, rd);
      }
      EXPECT_TRUE(close(got.host(), want, default_rtol<T>(), 1e-6));
    }
  }
}

TEST(GpuRopeFloat, BackwardUndoesForward) {
  OMNI_REQUIRE_GPU();
  const int N = 6, seq = 6, nheads = 2, head_dim = 8;
  const RopeTables tables(seq, head_dim);
  Device<float> dcos(tables.cos_f), dsin(tables.sin_f);
  const auto x = random_vector(size_t(N) * nheads * head_dim, 6);
  Device<float> y(x);
  gpu::rope_forward(y.get(), dcos.get(), dsin.get(), N, seq, nheads, head_dim);
  gpu::rope_backward(y.get(), dcos.get(), dsin.get(), N, seq, nheads, head_dim);
  // A rotation and its inverse, each rounded: a few ulps of |x| <= 1.
  EXPECT_TRUE(close(y.host(), x, 0.0, 1e-6));
}

}  // namespace
}  // namespace omni::gpu_test
