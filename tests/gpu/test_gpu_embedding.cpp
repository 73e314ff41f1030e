// Embedding GPU ops against the CPU ops: lookup with a vocabulary slice, position embeddings
// by row or from a positions array, and the deterministic scatter-add of the backward.
#include <algorithm>
#include <cstring>
#include <utility>

#include "backend/ops.h"
#include "gpu/gpu_test.h"

namespace omni::gpu_test {
namespace {

template <typename T>
class GpuEmbedding : public ::testing::Test {};
using StorageTypes = ::testing::Types<float, bf16, f16>;
TYPED_TEST_SUITE(GpuEmbedding, StorageTypes);

constexpr int kVocab = 50;

// Tokens in [0, kVocab) with heavy repetition: `hot` fills about 40% of the rows (a segment
// longer than the kernel's pieces of 32 sorted rows), a few tokens appear once.
std::vector<int32_t> tokens_with_repeats(int N, uint32_t seed, int hot = 17) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> token(0, kVocab - 1), coin(0, 4);
  std::vector<int32_t> t(N);
  for (auto& v : t) v = coin(rng) < 2 ? hot : token(rng);
  return t;
}
std::vector<int32_t> random_positions(int N, int seq, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> pos(0, seq - 1);
  std::vector<int32_t> p(N);
  for (auto& v : p) v = pos(rng);
  return p;
}

// One configuration of the lookup: C a multiple of every pack width (packed path) or odd
// (single elements); with or without a position table and positions array; the vocabulary
// slice of a tensor-parallel rank (tokens outside it give zeros) or the whole vocabulary.
struct Case {
  int C;
  bool wpe, positions;
  int vocab_start, vocab_end;
};
constexpr Case kCases[] = {
    {40, true, false, 0, 1 << 30}, {40, true, true, 10, 40},  {13, true, false, 10, 40},
    {13, false, true, 0, 1 << 30}, {8, false, false, 20, 50},
};

TYPED_TEST(GpuEmbedding, ForwardMatchesCpu) {
  OMNI_REQUIRE_GPU();
  using T = TypeParam;
  const int N = 70, seq = 16;  // N not a multiple of seq
  for (const Case& k : kCases) {
    const int rows = std::min(k.vocab_end, kVocab) - k.vocab_start;
    const auto wte = rounded<T>(random_vector(size_t(rows) * k.C, 1));
    const auto wpe = rounded<T>(random_vector(size_t(seq) * k.C, 2));
    const auto tokens = tokens_with_repeats(N, 3);
    const auto positions = random_positions(N, seq, 4);
    const int32_t* pos_host = k.positions ? positions.data() : nullptr;
    std::vector<float> want(size_t(N) * k.C);
    ops::embedding_forward(want.data(), tokens.data(), wte.data(), k.wpe ? wpe.data() : nullptr, N,
                           seq, k.C, pos_host, k.vocab_start, k.vocab_end);
    Device<T> dwte(wte), dwpe(wpe), out(size_t(N) * k.C);
    auto dtokens = to_device(tokens), dpositions = to_device(positions);
    gpu::embedding_forward(out.get(), dtokens.data(), dwte.get(), k.wpe ? dwpe.get() : nullptr, N,
                           seq, k.C, k.positions ? dpositions.data() : nullptr, k.vocab_start,
                           k.vocab_end);
    // A copy and at most one sum of two T values, rounded once: the default tolerance.
    EXPECT_TRUE(close(out.host(), want, default_rtol<T>(), 1e-6))
        << "C " << k.C << " slice [" << k.vocab_start << ", " << k.vocab_end << ")";
  }
}

TYPED_TEST(GpuEmbedding, ForwardFromMisalignedTablesMatchesCpu) {
  OMNI_REQUIRE_GPU();
  using T = TypeParam;
  // Tables starting one element into their allocation: the single-element path.
  const int N = 20, seq = 8, C = 16;
  const auto wte = rounded<T>(random_vector(size_t(kVocab) * C + 1, 5));
  const auto wpe = rounded<T>(random_vector(size_t(seq) * C + 1, 6));
  const auto tokens = tokens_with_repeats(N, 7);
  std::vector<float> want(size_t(N) * C);
  ops::embedding_forward(want.data(), tokens.data(), wte.data() + 1, wpe.data() + 1, N, seq, C);
  Device<T> dwte(wte), dwpe(wpe), out(size_t(N) * C);
  auto dtokens = to_device(tokens);
  gpu::embedding_forward(out.get(), dtokens.data(), dwte.get() + 1, dwpe.get() + 1, N, seq, C);
  EXPECT_TRUE(close(out.host(), want, default_rtol<T>(), 1e-6));
}

TYPED_TEST(GpuEmbedding, PositionEmbeddingAddMatchesCpu) {
  OMNI_REQUIRE_GPU();
  using T = TypeParam;
  const int N = 70, seq = 16;
  for (int C : {40, 13}) {
    for (bool with_positions : {false, true}) {
      const auto x = rounded<T>(random_vector(size_t(N) * C, 8));
      const auto wpe = rounded<T>(random_vector(size_t(seq) * C, 9));
      const auto positions = random_positions(N, seq, 10);
      std::vector<float> want = x;
      ops::position_embedding_add(want.data(), wpe.data(), N, seq, C,
                                  with_positions ? positions.data() : nullptr);
      Device<T> out(x), dwpe(wpe);
      auto dpositions = to_device(positions);
      gpu::position_embedding_add(out.get(), dwpe.get(), N, seq, C,
                                  with_positions ? dpositions.data() : nullptr);
      EXPECT_TRUE(close(out.host(), want, default_rtol<T>(), 1e-6))
          << "C " << C << (with_positions ? " with positions" : "");
    }
  }
}

// The backward's result (dwte then dwpe, as floats) for one case, starting from fixed
// nonzero gradients (the op adds).
template <typename T>
std::pair<std::vector<float>, std::vector<float>> gpu_backward(
    const Case& k, int N, int seq, const std::vector<int32_t>& tokens,
    const std::vector<int32_t>& positions, const std::vector<float>& dout,
    const std::vector<float>& dwte0, const std::vector<float>& dwpe0) {
  Device<float> dwte(dwte0), dwpe(dwpe0);
  Device<T> dd(dout);
  auto dtokens = to_device(tokens), dpositions = to_device(positions);
  gpu::embedding_backward(dwte.get(), k.wpe ? dwpe.get() : nullptr, dtokens.data(), dd.get(), N,
                          seq, k.C, k.positions ? dpositions.data() : nullptr, k.vocab_start,
                          k.vocab_end);
  return {dwte.host(), dwpe.host()};
}

TYPED_TEST(GpuEmbedding, BackwardMatchesCpu) {
  OMNI_REQUIRE_GPU();
  using T = TypeParam;
  const int N = 300, seq = 64;  // ~120 rows of the hot token: a segment over several pieces
  for (const Case& k : kCases) {
    const int rows = std::min(k.vocab_end, kVocab) - k.vocab_start;
    const auto dout = rounded<T>(random_vector(size_t(N) * k.C, 11));
    const auto dwte0 = random_vector(size_t(rows) * k.C, 12);
    const auto dwpe0 = random_vector(size_t(seq) * k.C, 13);
    const auto tokens = tokens_with_repeats(N, 14);
    const auto positions = random_positions(N, seq, 15);
    std::vector<float> want_wte = dwte0, want_wpe = dwpe0;
    ops::embedding_backward(want_wte.data(), k.wpe ? want_wpe.data() : nullptr, tokens.data(),
                            dout.data(), N, seq, k.C, k.positions ? positions.data() : nullptr,
                            k.vocab_start, k.vocab_end);
    const auto [got_wte, got_wpe] =
        gpu_backward<T>(k, N, seq, tokens, positions, dout, dwte0, dwpe0);
    // Float sums of up to ~130 rows of |g| <= 1 (dout is T, the sums are float for every T),
    // in another order than the CPU's (pieces, then partials): a few float ulp of the sums'
    // magnitude (~10); 1e-5 absolute is ~15 ulp there. A missed or doubled row is >= 2^-8.
    EXPECT_TRUE(close(got_wte, want_wte, 1e-6, 1e-5))
        << "dwte, C " << k.C << " slice [" << k.vocab_start << ", " << k.vocab_end << ")";
    EXPECT_TRUE(close(got_wpe, want_wpe, 1e-6, 1e-5))
        << "dwpe, C " << k.C << (k.positions ? " with positions" : "");
  }
}

TYPED_TEST(GpuEmbedding, BackwardOfOneTokenInEveryRowMatchesCpu) {
  OMNI_REQUIRE_GPU();
  using T = TypeParam;
  // One segment across all pieces (the partials' chain from first to last piece), with N not
  // a multiple of the piece or the sort's tile; and a single row.
  for (int N : {263, 1}) {
    const int seq = N;
    const Case k{16, false, false, 0, kVocab};
    const std::vector<int32_t> tokens(N, 3), positions(N, 0);
    const auto dout = rounded<T>(random_vector(size_t(N) * k.C, 16));
    const auto dwte0 = random_vector(size_t(kVocab) * k.C, 17);
    std::vector<float> want = dwte0;
    ops::embedding_backward(want.data(), static_cast<float*>(nullptr), tokens.data(), dout.data(),
                            N, seq, k.C, nullptr, 0, kVocab);
    const auto got = gpu_backward<T>(k, N, seq, tokens, positions, dout, dwte0, {0.0f}).first;
    EXPECT_TRUE(close(got, want, 1e-6, 1e-5)) << N << " rows";
  }
}

TYPED_TEST(GpuEmbedding, BackwardIsBitwiseDeterministic) {
  OMNI_REQUIRE_GPU();
  using T = TypeParam;
  const int N = 300, seq = 64;
  for (const Case& k : {kCases[0], kCases[1], kCases[2]}) {
    const int rows = std::min(k.vocab_end, kVocab) - k.vocab_start;
    const auto dout = rounded<T>(random_vector(size_t(N) * k.C, 18));
    const auto dwte0 = random_vector(size_t(rows) * k.C, 19);
    const auto dwpe0 = random_vector(size_t(seq) * k.C, 20);
    const auto tokens = tokens_with_repeats(N, 21);
    const auto positions = random_positions(N, seq, 22);
    const auto first = gpu_backward<T>(k, N, seq, tokens, positions, dout, dwte0, dwpe0);
    const auto second = gpu_backward<T>(k, N, seq, tokens, positions, dout, dwte0, dwpe0);
    ASSERT_EQ(first.first.size(), second.first.size());
    EXPECT_EQ(
        0, std::memcmp(first.first.data(), second.first.data(), first.first.size() * sizeof(float)))
        << "dwte differs between runs, C " << k.C;
    EXPECT_EQ(0, std::memcmp(first.second.data(), second.second.data(),
                             first.second.size() * sizeof(float)))
        << "dwpe differs between runs, C " << k.C;
  }
}

}  // namespace
}  // namespace omni::gpu_test
