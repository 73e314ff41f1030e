// The fused output layer + cross-entropy on the GPU against ops::classifier_cross_entropy (the
// CPU op) on T-rounded inputs.
//
// Tolerances. The logits are float whatever T is (the GEMM has a float output), so the loss
// differs from the CPU's only by summation order and exp's rounding: 1e-5 relative and
// absolute. The gradient of the logits is stored as T before the dh and dw GEMMs: each term
// of dh = sum_j dz_j w_j then carries T's rounding, which is relative to sum_j |dz_j w_j| <=
// 2 grad_scale (|w| <= 1, sum_j |dz_j| <= 2 grad_scale), not to |dh|: an absolute slack of
// 2 grad_scale default_rtol<T>. dw sums that over the rows sharing a target (a few here).
#include <algorithm>
#include <bit>
#include <cstring>
#include <functional>

#include "backend/gpu/cross_entropy.h"
#include "backend/ops.h"
#include "gpu/gpu_test.h"

namespace omni::gpu_test {
namespace {

template <typename T>
class GpuCrossEntropy : public ::testing::Test {};
using StorageTypes = ::testing::Types<float, bf16, f16>;
TYPED_TEST_SUITE(GpuCrossEntropy, StorageTypes);

// Shrinks the logits chunk for one test, so a few rows run as several chunks.
class ChunkElements {
 public:
  explicit ChunkElements(size_t n) : saved_(gpu::classifier_chunk_elements()) {
    gpu::set_classifier_chunk_elements(n);
  }
  ~ChunkElements() { gpu::set_classifier_chunk_elements(saved_); }

 private:
  size_t saved_;
};

// A problem: N rows of hidden size C over a vocabulary of V ids, w padded to V + 3 rows.
struct Problem {
  int N, C, V;
  double grad_scale;
  bool with_mask;
  std::vector<float> h, w, mask, dw0;
  std::vector<int32_t> targets;
  int w_rows() const { return V + 3; }
};

template <typename T>
Problem make_problem(int N, int C, int V, double grad_scale, bool with_mask, uint32_t seed) {
  Problem p{N, C, V, grad_scale, with_mask, {}, {}, {}, {}, {}};
  // Logits of a few units, so the softmax is neither uniform nor one-hot.
  p.h = rounded<T>(random_vector(size_t(N) * C, seed, -1.0f, 1.0f));
  p.w = rounded<T>(random_vector(size_t(p.w_rows()) * C, seed + 1, -1.0f, 1.0f));
  p.dw0 = random_vector(p.w.size(), seed + 2);
  std::mt19937 rng(seed + 3);
  for (int n = 0; n < N; ++n) p.targets.push_back(static_cast<int32_t>(rng() % V));
  const float pattern[] = {1.0f, 0.0f, 1.0f, 0.5f, 1.0f, 1.0f, 0.0f};  // zeros and a half
  for (int n = 0; n < N; ++n) p.mask.push_back(pattern[n % 7]);
  return p;
}

struct Result {
  double total;
  std::vector<float> losses, dh, dw;
};

Result run_cpu(const Problem& p, bool with_grad) {
  Result r{0.0, std::vector<float>(p.N), std::vector<float>(size_t(p.N) * p.C), p.dw0};
  ops::ClassifierLossArgs a;
  a.rows = p.N, a.hidden = p.C, a.vocab = p.V, a.grad_scale = p.grad_scale;
  r.total = ops::classifier_cross_entropy<float>(
      r.losses.data(), with_grad ? r.dh.data() : nullptr, with_grad ? r.dw.data() : nullptr,
      p.h.data(), p.w.data(), p.targets.data(), p.with_mask ? p.mask.data() : nullptr, a);
  return r;
}

// The GPU op on rows [v0, v0 + V) of p's vocabulary (w's rows from v0 on), with `reduce`.
template <typename T>
Result run_gpu(const Problem& p, bool with_grad, int v0 = 0, int V = -1,
               std::function<void(double*, int, bool)> reduce = nullptr) {
  if (V < 0) V = p.V;
  const std::vector<float> w(p.w.begin() + size_t(v0) * p.C, p.w.end());
  const std::vector<float> dw0(p.dw0.begin() + size_t(v0) * p.C, p.dw0.end());
  Device<T> h(p.h), dw_t(w), dh(size_t(p.N) * p.C);
  Device<float> dw(dw0), losses(p.N), mask(p.mask);
  const auto targets = to_device(p.targets);
  ops::ClassifierLossArgs a;
  a.rows = p.N, a.hidden = p.C, a.vocab = V, a.grad_scale = p.grad_scale, a.vocab_start = v0;
  a.reduce = std::move(reduce);
  Result r;
  r.total = gpu::classifier_cross_entropy<T>(losses.get(), with_grad ? dh.get() : nullptr,
                                             with_grad ? dw.get() : nullptr, h.get(), dw_t.get(),
                                             targets.data(), p.with_mask ? mask.get() : nullptr, a);
  r.losses = losses.host(), r.dh = dh.host(), r.dw = dw.host();
  return r;
}

template <typename T>
void expect_matches(const Result& got, const Result& want, const Problem& p, bool with_grad) {
  EXPECT_NEAR(got.total, want.total, 1e-5 * (1 + std::abs(want.total)));
  EXPECT_TRUE(close(got.losses, want.losses, 1e-5, 1e-5)) << "losses";
  if (!with_grad) return;
  const double slack = 2 * p.grad_scale * default_rtol<T>();
  EXPECT_TRUE(close(got.dh, want.dh, default_rtol<T>(), 1e-5 + slack)) << "dh";
  EXPECT_TRUE(close(got.dw, want.dw, 1e-5, 1e-5 + 3 * slack)) << "dw";
}

// Mask with zeros and a half, padded w rows (their dw stays as it was), grad_scale != 1, dw
// accumulated onto non-zero values; rows longer than a block (the in-place gradient is
// written a block-wide tile at a time).
TYPED_TEST(GpuCrossEntropy, MaskedLossAndGradientsMatchCpu) {
  OMNI_REQUIRE_GPU();
  using T = TypeParam;
  const Problem p = make_problem<T>(9, 20, 300, 0.37, true, 1);
  const Result want = run_cpu(p, true), got = run_gpu<T>(p, true);
  expect_matches<T>(got, want, p, true);
  for (size_t i = size_t(p.V) * p.C; i < p.dw0.size(); ++i)
    ASSERT_EQ(got.dw[i], p.dw0[i]) << "padded row " << i / p.C << " of dw changed";
  for (int n = 0; n < p.N; ++n)
    if (p.mask[n] == 0.0f) {
      EXPECT_EQ(got.losses[n], 0.0f) << n;
      for (int c = 0; c < p.C; ++c) ASSERT_EQ(got.dh[size_t(n) * p.C + c], 0.0f) << n;
    }
}

// Evaluation: no mask, no gradients (dh and dw null), per-row losses and the total.
TYPED_TEST(GpuCrossEntropy, LossWithoutMaskOrGradientsMatchesCpu) {
  OMNI_REQUIRE_GPU();
  using T = TypeParam;
  const Problem p = make_problem<T>(6, 16, 50, 1.0, false, 2);
  expect_matches<T>(run_gpu<T>(p, false), run_cpu(p, false), p, false);
}

// 3 rows per chunk (64 floats a row, the padded width of V = 37): 10 rows in 4 chunks, the last
// one short.
TYPED_TEST(GpuCrossEntropy, SeveralChunksMatchCpu) {
  OMNI_REQUIRE_GPU();
  using T = TypeParam;
  const ChunkElements small(3 * 64);
  const Problem p = make_problem<T>(10, 12, 37, 0.5, true, 3);
  expect_matches<T>(run_gpu<T>(p, true), run_cpu(p, true), p, true);
}

// Two ranks hold vocabulary rows [0, 20) and [20, 37). A rank's reduce call needs the other
// rank's values of the same call, and both run in this one thread (the emulated device has a
// single scratch memory), so the group is replayed: run k learns the combined values of call k
// from both ranks' inputs while answering calls 0..k-1 with the values already learned; the
// run that makes no new call is the real one. The op is deterministic, so every replay makes
// the same calls. Each rank must report the full vocabulary's loss, the ranks' dh must sum to
// the full dh, and each rank's dw must be the full dw's rows of its slice.
TYPED_TEST(GpuCrossEntropy, VocabularyParallelRanksMatchFullVocabulary) {
  OMNI_REQUIRE_GPU();
  using T = TypeParam;
  const ChunkElements small(4 * 64);  // 7 rows in 2 chunks: 4 reduce calls
  const Problem p = make_problem<T>(7, 16, 37, 0.8, true, 4);
  const int split = 20;
  const int starts[2] = {0, split}, sizes[2] = {split, p.V - split};
  std::vector<std::vector<double>> learned;  // combined values of each call so far
  std::vector<bool> learned_max;
  Result rank[2];
  for (int replay = 0;; ++replay) {
    ASSERT_LT(replay, 20) << "the reduce calls never end";
    std::vector<double> inputs[2];
    bool recorded[2] = {false, false}, is_max[2] = {false, false};
    for (int r = 0; r < 2; ++r) {
      size_t call = 0;
      auto reduce = [&](double* values, int n, bool max) {
        if (call < learned.size()) {
          ASSERT_EQ(size_t(n), learned[call].size()) << "call " << call;
          ASSERT_EQ(max, learned_max[call]) << "call " << call;
          gpu::copy_to_device(values, learned[call].data(), n * sizeof(double));
        } else if (call == learned.size()) {
          inputs[r].resize(n);
          gpu::copy_to_host(inputs[r].data(), values, n * sizeof(double));
          recorded[r] = true, is_max[r] = max;
        }
        ++call;
      };
      rank[r] = run_gpu<T>(p, true, starts[r], sizes[r], reduce);
    }
    if (!recorded[0] && !recorded[1]) break;
    ASSERT_TRUE(recorded[0] && recorded[1]) << "the ranks made different numbers of calls";
    ASSERT_EQ(inputs[0].size(), inputs[1].size());
    ASSERT_EQ(is_max[0], is_max[1]);
    // ops.h's protocol, as the CPU op makes it: per chunk a max, then a sum.
    EXPECT_EQ(is_max[0], learned.size() % 2 == 0) << "call " << learned.size();
    std::vector<double> combined(inputs[0].size());
    for (size_t i = 0; i < combined.size(); ++i)
      combined[i] = is_max[0] ? std::max(inputs[0][i], inputs[1][i]) : inputs[0][i] + inputs[1][i];
    learned.push_back(combined), learned_max.push_back(is_max[0]);
  }
  EXPECT_EQ(learned.size(), 4u);
  const Result full = run_cpu(p, true);
  const double slack = 2 * p.grad_scale * default_rtol<T>();
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_NEAR(rank[r].total, full.total, 1e-5 * (1 + std::abs(full.total)));
    EXPECT_TRUE(close(rank[r].losses, full.losses, 1e-5, 1e-5)) << "losses";
    // This rank's rows of dw are the full dw's rows of its slice; the rest are untouched.
    const size_t first = size_t(starts[r]) * p.C, own = size_t(sizes[r]) * p.C;
    const std::vector<float> got(rank[r].dw.begin(), rank[r].dw.begin() + own),
        want(full.dw.begin() + first, full.dw.begin() + first + own);
    EXPECT_TRUE(close(got, want, 1e-5, 1e-5 + 3 * slack)) << "dw";
    for (size_t i = own; i < rank[r].dw.size(); ++i)
      ASSERT_EQ(rank[r].dw[i], p.dw0[first + i]) << "dw row " << i / p.C << " is another rank's";
  }
  // The sum of two T-rounded parts: twice the slack of one.
  std::vector<float> dh = rank[0].dh;
  for (size_t i = 0; i < dh.size(); ++i) dh[i] += rank[1].dh[i];
  EXPECT_TRUE(close(dh, full.dh, 2 * default_rtol<T>(), 1e-5 + 2 * slack)) << "sum of dh";
}

// The same inputs give the same bits: loss, losses, dh and dw.
TYPED_TEST(GpuCrossEntropy, IsBitwiseReproducible) {
  OMNI_REQUIRE_GPU();
  using T = TypeParam;
  const Problem p = make_problem<T>(8, 24, 45, 1.0, true, 5);
  const Result a = run_gpu<T>(p, true), b = run_gpu<T>(p, true);
  EXPECT_EQ(std::bit_cast<uint64_t>(a.total), std::bit_cast<uint64_t>(b.total));
  EXPECT_EQ(std::memcmp(a.losses.data(), b.losses.data(), a.losses.size() * 4), 0);
  EXPECT_EQ(std::memcmp(a.dh.data(), b.dh.data(), a.dh.size() * 4), 0);
  EXPECT_EQ(std::memcmp(a.dw.data(), b.dw.data(), a.dw.size() * 4), 0);
}

}  // namespace
}  // namespace omni::gpu_test
