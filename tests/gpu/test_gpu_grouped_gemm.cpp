// The experts' GEMMs as one grouped call (blas::grouped_gemm; Megatron's --moe-grouped-gemm)
// against the per-expert loop it replaces. On the emulator the bits are the loop's: both multiply
// with the emulated GEMM, the grouped path through the argument arrays cuBLAS would be given. On a
// GPU cuBLAS's grouped kernels split the work differently from cuBLASLt's, so within a tolerance
// per type; there the tests also print whether the grouped call ran (scripts/gpu_check.sh).
#include <cstdint>
#include <cstdio>
#include <string>
#include <type_traits>
#include <vector>

#include "backend/gpu/blas.h"
#include "backend/gpu/moe_kernels.h"
#include "gpu/gpu_test.h"

namespace omni::gpu_test {
namespace {

namespace blas = gpu::blas;

#if defined(OMNITRON_GPU_EMULATE)
constexpr bool kEmulated = true;
#else
constexpr bool kEmulated = false;
#endif

// Grouped on or off for one scope (the switch is process-wide).
class GroupedSwitch {
 public:
  explicit GroupedSwitch(bool on) { blas::set_grouped_gemm(on); }
  ~GroupedSwitch() { blas::set_grouped_gemm(true); }
  GroupedSwitch(const GroupedSwitch&) = delete;
  GroupedSwitch& operator=(const GroupedSwitch&) = delete;
};

template <typename T>
::testing::AssertionResult same(const std::vector<float>& got, const std::vector<float>& want) {
  return kEmulated ? close(got, want, 0, 0) : close(got, want, default_rtol<T>(), 1e-4);
}

// One MoE linear layer's forward and backward over the experts' rows (offsets), with the
// gradients of the weights and biases accumulating onto nonzero values.
struct ExpertsRun {
  std::vector<float> y, dx, dw, db;
  long grouped_calls = 0;
};

template <typename T>
ExpertsRun run_experts(const std::vector<int32_t>& offsets, int K, int N, bool bias, bool grouped) {
  const int E = static_cast<int>(offsets.size()) - 1, R = offsets.back();
  Device<T> x(random_vector(size_t(R) * K, 1)), w(random_vector(size_t(E) * N * K, 2, -0.5, 0.5)),
      b(random_vector(size_t(E) * N, 3)), dy(random_vector(size_t(R) * N, 4)), y(size_t(R) * N),
      dx(size_t(R) * K);
  Device<float> dw(random_vector(size_t(E) * N * K, 5)), db(random_vector(size_t(E) * N, 6));
  const GroupedSwitch on(grouped);
  const long before = blas::grouped_gemm_calls();
  gpu::moe_grouped_linear_forward<T>(y.get(), x.get(), w.get(), bias ? b.get() : nullptr,
                                     offsets.data(), E, K, N);
  gpu::moe_grouped_linear_backward<T>(dx.get(), dw.get(), bias ? db.get() : nullptr, dy.get(),
                                      x.get(), w.get(), offsets.data(), E, K, N);
  gpu::synchronize();
  return {y.host(), dx.host(), dw.host(), db.host(), blas::grouped_gemm_calls() - before};
}

template <typename T>
class GpuMoEGroupedGemm : public ::testing::Test {};
using StorageTypes = ::testing::Types<float, bf16, f16>;
TYPED_TEST_SUITE(GpuMoEGroupedGemm, StorageTypes);

// Forward, dx and dw: one grouped call each (dw of bf16/f16 into float dW is mixed-type, so per
// expert); a bias is written first and added onto, and its gradient keeps the per-expert path.
template <typename T>
void expect_grouped_is_the_loop(const std::vector<int32_t>& offsets, int K, int N, bool bias) {
  const ExpertsRun loop = run_experts<T>(offsets, K, N, bias, false);
  const ExpertsRun grouped = run_experts<T>(offsets, K, N, bias, true);
  EXPECT_EQ(loop.grouped_calls, 0);
  const long want_calls = 1 + (bias ? 0 : std::is_same_v<T, float> ? 2 : 1);
  if (kEmulated) {
    EXPECT_EQ(grouped.grouped_calls, want_calls);
  }
  std::printf("[grouped gemm] %s, %zu experts%s: %ld of %ld calls grouped\n",
              dtype_name(dtype_of<T>()), offsets.size() - 1, bias ? ", bias" : "",
              grouped.grouped_calls, want_calls);
  EXPECT_TRUE(same<T>(grouped.y, loop.y)) << "y";
  EXPECT_TRUE(same<T>(grouped.dx, loop.dx)) << "dx";
  EXPECT_TRUE(same<float>(grouped.dw, loop.dw)) << "dw";
  EXPECT_TRUE(same<float>(grouped.db, loop.db)) << "dbias";
}

TYPED_TEST(GpuMoEGroupedGemm, OneExpertIsTheLoop) {
  OMNI_REQUIRE_GPU();
  expect_grouped_is_the_loop<TypeParam>({0, 24}, 16, 8, false);
}

// Sixteen experts, four of them without rows (Qwen3-MoE's local experts, small).
TYPED_TEST(GpuMoEGroupedGemm, SixteenExpertsWithEmptyOnesAreTheLoop) {
  OMNI_REQUIRE_GPU();
  const std::vector<int32_t> rows = {3, 0, 5, 1, 0, 8, 2, 0, 4, 7, 1, 0, 6, 2, 3, 5};
  std::vector<int32_t> offsets = {0};
  for (int r : rows) offsets.push_back(offsets.back() + r);
  for (bool bias : {false, true}) {
    SCOPED_TRACE(bias ? "bias" : "no bias");
    expect_grouped_is_the_loop<TypeParam>(offsets, 16, 24, bias);
  }
}

// Pure host: each non-empty row-major problem becomes one group of the column-major call,
// operands swapped (D^T = op(B)^T op(A)^T).
TEST(GroupedGemm, MarshalsRowMajorProblemsAsColumnMajorGroups) {
  float a0[1], b0[1], d0[1], a1[1], b1[1], d1[1];
  blas::GemmProblem p[3];
  p[0].M = 5, p[0].N = 7, p[0].K = 3, p[0].trans_b = true;
  p[0].A = a0, p[0].lda = 3, p[0].B = b0, p[0].ldb = 3, p[0].D = d0, p[0].ldd = 7;
  p[1].M = 0, p[1].N = 7, p[1].K = 3;  // empty: dropped
  p[2].M = 4, p[2].N = 6, p[2].K = 9, p[2].trans_a = true, p[2].beta = 1.0f, p[2].alpha = 0.5f;
  p[2].A = a1, p[2].lda = 4, p[2].B = b1, p[2].ldb = 6, p[2].D = d1, p[2].ldd = 8;
  const blas::GroupedGemmArgs g = blas::marshal_grouped(p, 3);
  ASSERT_EQ(g.groups(), 2);
  EXPECT_EQ(g.type, DType::F32);
  EXPECT_EQ(g.trans_a, (std::vector<char>{'T', 'N'}));
  EXPECT_EQ(g.trans_b, (std::vector<char>{'N', 'T'}));
  EXPECT_EQ(g.m, (std::vector<int>{7, 6}));
  EXPECT_EQ(g.n, (std::vector<int>{5, 4}));
  EXPECT_EQ(g.k, (std::vector<int>{3, 9}));
  EXPECT_EQ(g.lda, (std::vector<int>{3, 6}));
  EXPECT_EQ(g.ldb, (std::vector<int>{3, 4}));
  EXPECT_EQ(g.ldc, (std::vector<int>{7, 8}));
  EXPECT_EQ(g.alpha, (std::vector<float>{1.0f, 0.5f}));
  EXPECT_EQ(g.beta, (std::vector<float>{0.0f, 1.0f}));
  EXPECT_EQ(g.a, (std::vector<const void*>{b0, b1}));
  EXPECT_EQ(g.b, (std::vector<const void*>{a0, a1}));
  EXPECT_EQ(g.c, (std::vector<void*>{d0, d1}));
}

// What the grouped call cannot express runs one GEMM per problem.
TEST(GroupedGemm, FallsBackOnWhatTheCallCannotExpress) {
  OMNI_REQUIRE_GPU();
  const int M = 6, N = 8, K = 16;
  Device<bf16> a(random_vector(2 * M * K + 8, 7)), b(random_vector(K * N, 8));
  Device<float> d(random_vector(2 * M * N, 9)), bias(random_vector(N, 10));
  blas::GemmProblem p;
  p.M = M, p.N = N, p.K = K, p.ab_type = DType::BF16, p.d_type = DType::F32, p.beta = 1.0f;
  p.A = a.get(), p.lda = K, p.B = b.get(), p.ldb = N, p.D = d.get(), p.ldd = N;
  blas::GemmProblem with_bias = p;
  with_bias.epilogue = blas::Epilogue::Bias, with_bias.bias = bias.get();
  EXPECT_NE(blas::can_group(&with_bias, 1).find("epilogue"), std::string::npos);
  // bf16 into float (dW's accumulation): two types.
  EXPECT_NE(blas::can_group(&p, 1).find("one type"), std::string::npos);
  // One type, but a matrix 2 bytes into a row, off 16-byte alignment: one gemm() each.
  blas::GemmProblem shifted[2] = {p, p};
  shifted[0].d_type = shifted[1].d_type = DType::BF16;
  Device<bf16> c(random_vector(2 * M * N, 11)), c_loop(random_vector(2 * M * N, 11));
  shifted[1].A = a.get() + M * K + 1;
  shifted[0].D = c.get(), shifted[1].D = c.get() + M * N;
  EXPECT_NE(blas::grouped_gemm(shifted, 2, nullptr).find("aligned"), std::string::npos);
  shifted[0].D = c_loop.get(), shifted[1].D = c_loop.get() + M * N;
  for (const auto& q : shifted) blas::gemm(q, nullptr);
  EXPECT_TRUE(close(c.host(), c_loop.host(), 0, 0));
}

// Three problems of different shapes, bf16: one grouped call equals one gemm() each. Prints
// whether this device ran them grouped (on a GPU: cuBLAS >= 12.5 and compute capability 8.0+).
TEST(GroupedGemm, GroupedCallIsThePerProblemGemms) {
  OMNI_REQUIRE_GPU();
  const int K = 32;
  const int rows[3] = {5, 0, 11}, cols[3] = {8, 8, 24};
  std::vector<Device<bf16>> a, b, d_loop, d_grouped;
  std::vector<blas::GemmProblem> problems;
  for (int i = 0; i < 3; ++i) {
    a.emplace_back(random_vector(size_t(rows[i]) * K + 1, 20 + i));
    b.emplace_back(random_vector(size_t(cols[i]) * K, 30 + i));
    d_loop.emplace_back(random_vector(size_t(rows[i]) * cols[i] + 1, 40 + i));
    d_grouped.emplace_back(random_vector(size_t(rows[i]) * cols[i] + 1, 40 + i));
    blas::GemmProblem p;
    p.M = rows[i], p.N = cols[i], p.K = K, p.trans_b = true, p.ab_type = p.d_type = DType::BF16;
    p.A = a[i].get(), p.lda = K, p.B = b[i].get(), p.ldb = K, p.ldd = cols[i];
    p.alpha = 0.5f + i, p.beta = i == 2 ? 1.0f : 0.0f;
    problems.push_back(p);
  }
  for (int i = 0; i < 3; ++i) problems[i].D = d_loop[i].get();
  for (const auto& p : problems) blas::gemm(p, nullptr);
  for (int i = 0; i < 3; ++i) problems[i].D = d_grouped[i].get();
  const std::string why = blas::grouped_gemm(problems.data(), 3, nullptr);
  std::printf("[grouped gemm] this device: %s\n",
              why.empty() ? "one grouped call" : ("per problem: " + why).c_str());
  if (kEmulated) {
    EXPECT_EQ(why, "");
  }
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(same<bf16>(d_grouped[i].host(), d_loop[i].host())) << i;
}

}  // namespace
}  // namespace omni::gpu_test
