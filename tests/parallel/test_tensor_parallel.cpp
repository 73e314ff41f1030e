// The parallel primitives of parallel/tensor_parallel.h and parallel/context_parallel.h on
// their own, in float64 on in-process ranks, each against the same computation on one rank
// with the CPU ops: a column-parallel then row-parallel pair (the MLP's shape) with and
// without sequence parallelism, the vocabulary-parallel embedding and cross-entropy, and
// causal ring attention (with packed documents) against ordinary attention. The model's
// layout tests (test_model_parallel.cpp) check the same primitives inside the transformer.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "comm/local_communicator.h"
#include "parallel/context_parallel.h"
#include "parallel/tensor_parallel.h"

namespace omni {
namespace {

using Vec = std::vector<double>;

Vec random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> d(-1, 1);
  Vec v(n);
  for (double& x : v) x = d(rng);
  return v;
}

// Rows [first, first + n) of a [rows, width] matrix.
Vec rows_of(const Vec& m, int width, int first, int n) {
  return Vec(m.begin() + size_t(first) * width, m.begin() + size_t(first + n) * width);
}
// Columns [first, first + n) of a [rows, width] matrix.
Vec columns_of(const Vec& m, int width, int first, int n) {
  Vec out;
  for (size_t r = 0; r < m.size() / width; ++r)
    out.insert(out.end(), m.begin() + r * width + first, m.begin() + r * width + first + n);
  return out;
}

void expect_near(const Vec& got, const Vec& want, const char* what, int rank) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 1e-12 * (1 + std::abs(want[i])))
        << what << "[" << i << "] on rank " << rank;
}

TEST(VocabShard, PadsTheVocabularyToTheMultipleAndSlicesIt) {
  auto shard = [](int vocab, int divisible_by, int tp, int rank) {
    const VocabShard s = vocab_shard(vocab, divisible_by, tp, rank);
    return std::vector<int>{s.rows, s.start, s.real};
  };
  // 50 ids, divisible by 4 x 2 ranks: padded to 56, 28 rows each, the last 6 ids padding.
  EXPECT_EQ(shard(50, 4, 2, 0), (std::vector<int>{28, 0, 28}));
  EXPECT_EQ(shard(50, 4, 2, 1), (std::vector<int>{28, 28, 22}));
  // 10 ids, divisible by 8 x 4 ranks: padded to 32; rank 1 holds 2 real ids, rank 2 none.
  EXPECT_EQ(shard(10, 8, 4, 1), (std::vector<int>{8, 8, 2}));
  EXPECT_EQ(shard(10, 8, 4, 2), (std::vector<int>{8, 16, 0}));
}

class TensorParallelPair : public ::testing::TestWithParam<bool> {};

// y = (x W1^T + b1) W2^T + b2 with W1 split by rows (column-parallel) and W2 by columns
// (row-parallel) over two ranks, forward and backward, against one rank.
TEST_P(TensorParallelPair, ColumnThenRowParallelMatchesOneRank) {
  const bool sp = GetParam();
  constexpr int tp = 2, N = 6, C = 4, F = 8, Fl = F / tp;
  const Vec x = random(N * C, 1), w1 = random(F * C, 2), b1 = random(F, 3);
  const Vec w2 = random(C * F, 4), b2 = random(C, 5), dy = random(N * C, 6);
  // One rank.
  Vec h(N * F), y(N * C), dh(N * F), dx(N * C), dw1(F * C, 0), db1(F, 0), dw2(C * F, 0), db2(C, 0);
  ops::linear_forward(h.data(), x.data(), w1.data(), b1.data(), N, C, F);
  ops::linear_forward(y.data(), h.data(), w2.data(), b2.data(), N, F, C);
  ops::linear_backward(dh.data(), dw2.data(), db2.data(), dy.data(), h.data(), w2.data(), N, F, C);
  ops::linear_backward(dx.data(), dw1.data(), db1.data(), dh.data(), x.data(), w1.data(), N, C, F);

  run_ranks(tp, [&](Communicator& group) {
    const int r = group.rank();
    const TensorParallel<double> t(&group, sp, C, ops::Exec{});
    const int R = t.rows(N), first = t.first_row(N);
    EXPECT_EQ(R, sp ? N / tp : N);
    const Vec w1r = rows_of(w1, C, r * Fl, Fl), b1r = rows_of(b1, 1, r * Fl, Fl);
    const Vec w2r = columns_of(w2, F, r * Fl, Fl);
    const Vec xr = rows_of(x, C, first, R), dyr = rows_of(dy, C, first, R);
    Vec x_full(N * C), hr(N * Fl), yr(R * C), scratch(N * C);
    // x_full receives the gathered rows under sequence parallelism (else x itself is read).
    t.column_forward(hr.data(), x_full.data(), xr.data(), w1r.data(), b1r.data(), Fl, N);
    t.row_forward(yr.data(), scratch.data(), hr.data(), w2r.data(), b2.data(), Fl, N);
    expect_near(hr, columns_of(h, F, r * Fl, Fl), "column-parallel output", r);
    expect_near(yr, rows_of(y, C, first, R), "row-parallel output", r);

    Vec dhr(N * Fl), dy_full(N * C), dxr(R * C), partial(N * C);
    Vec dw1r(Fl * C, 0), db1r(Fl, 0), dw2r(C * Fl, 0), db2r(C, 0);
    t.row_backward(dhr.data(), dw2r.data(), db2r.data(), dy_full.data(), dyr.data(), hr.data(),
                   w2r.data(), Fl, N);
    const double* d_in =
        t.column_backward(dxr.data(), partial.data(), dw1r.data(), db1r.data(), dhr.data(),
                          sp ? x_full.data() : xr.data(), w1r.data(), Fl, N);
    expect_near(Vec(d_in, d_in + size_t(R) * C), rows_of(dx, C, first, R), "d(input)", r);
    expect_near(dw1r, rows_of(dw1, C, r * Fl, Fl), "d(W1) slice", r);
    expect_near(db1r, rows_of(db1, 1, r * Fl, Fl), "d(b1) slice", r);
    expect_near(dw2r, columns_of(dw2, F, r * Fl, Fl), "d(W2) slice", r);
    expect_near(db2r, db2, "d(b2), replicated", r);
  });
}

INSTANTIATE_TEST_SUITE_P(SequenceParallel, TensorParallelPair, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "On" : "Off"; });

// The word embedding and the output layer split by vocabulary over two ranks: the lookup,
// the loss, d(h) summed over the ranks and each rank's slice of d(W), against one rank.
TEST(TensorParallel, VocabularyParallelEmbeddingAndLossMatchOneRank) {
  constexpr int tp = 2, N = 6, seq = 3, C = 4, V = 10;
  const VocabShard s0 = vocab_shard(V, 2, tp, 0);
  const int Vp = s0.rows * tp;  // padded: 12
  Vec w = random(size_t(Vp) * C, 7);
  const std::vector<int32_t> ids = {0, 9, 4, 5, 3, 8}, targets = {9, 1, 5, 6, 0, 7};
  const std::vector<float> mask = {1, 1, 0, 1, 1, 1};
  const Vec h = random(N * C, 8);
  Vec emb(N * C), dh(N * C), dw(size_t(Vp) * C, 0), losses(N);
  ops::embedding_forward(emb.data(), ids.data(), w.data(), static_cast<const double*>(nullptr), N,
                         seq, C);
  ops::ClassifierLossArgs a;
  a.rows = N, a.hidden = C, a.vocab = V, a.grad_scale = 0.5;
  const double loss = ops::classifier_cross_entropy(losses.data(), dh.data(), dw.data(), h.data(),
                                                    w.data(), targets.data(), mask.data(), a);

  run_ranks(tp, [&](Communicator& group) {
    const int r = group.rank();
    const TensorParallel<double> t(&group, false, C, ops::Exec{});
    const VocabShard s = vocab_shard(V, 2, tp, r);
    const Vec wr = rows_of(w, C, s.start, s.rows);
    Vec out(N * C), scratch(N * C);
    t.embedding_forward(out.data(), scratch.data(), ids.data(), wr.data(), s, N, seq);
    expect_near(out, emb, "embedding", r);

    Vec dhr(N * C), dwr(size_t(s.rows) * C, 0), lr(N), d_rows(N * C);
    const double lossr = t.vocab_cross_entropy(lr.data(), dhr.data(), dwr.data(), h.data(),
                                               wr.data(), targets.data(), mask.data(), s, N, 0.5);
    EXPECT_NEAR(lossr, loss, 1e-12 * loss);
    expect_near(lr, losses, "per-row losses", r);
    const double* dh_sum = t.reduce_rows(d_rows.data(), dhr.data(), N);
    expect_near(Vec(dh_sum, dh_sum + N * C), dh, "d(h) summed over the ranks", r);
    expect_near(dwr, rows_of(dw, C, s.start, s.rows), "d(W) slice", r);
  });
}

struct RingCase {
  int cp;
  bool packed;
};
void PrintTo(const RingCase& c, std::ostream* os) {
  *os << "cp " << c.cp << (c.packed ? ", packed documents" : ", causal");
}
class RingAttentionTest : public ::testing::TestWithParam<RingCase> {};

// Causal attention over the whole sequence, split over the context-parallel ranks as the
// model splits it (two chunks each), against ordinary attention on one rank.
TEST_P(RingAttentionTest, MatchesOneRankAttention) {
  const auto [cp, packed] = GetParam();
  constexpr int B = 2, S = 16, H = 4, G = 2, hd = 4;
  const int Sl = S / cp, Nl = B * Sl;
  const Vec q = random(B * S * H * hd, 11), k = random(B * S * G * hd, 12);
  const Vec v = random(B * S * G * hd, 13), dout = random(B * S * H * hd, 14);
  std::vector<int32_t> tokens(B * S, 0), key_start(B * S);
  for (int i = 0; i < B * S; ++i) key_start[i] = i % S < 5 ? 0 : i % S < 11 ? 5 : 11;
  const ops::AttentionDims full{B, S, H, G, hd, packed ? key_start.data() : nullptr};
  Vec out(q.size()), lse(B * H * S), dq(q.size()), dk(k.size()), dv(v.size());
  ops::attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), full);
  ops::attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), out.data(), lse.data(),
                          q.data(), k.data(), v.data(), full);
  const MicroBatch mb{
      tokens.data(), nullptr, nullptr, B, S, nullptr, packed ? key_start.data() : nullptr};

  run_ranks(cp, [&](Communicator& group) {
    const int r = group.rank();
    ContextParallelBatch local;
    local.slice(mb, cp, r);
    // This rank's rows of a [B * S, width] tensor.
    auto mine = [&](const Vec& m, int width) {
      Vec o;
      for (int b = 0; b < B; ++b)
        for (int l = 0; l < Sl; ++l) {
          const size_t row = size_t(b) * S + context_parallel_index(l, Sl, cp, r);
          o.insert(o.end(), m.begin() + row * width, m.begin() + (row + 1) * width);
        }
      return o;
    };
    const Vec ql = mine(q, H * hd), kl = mine(k, G * hd), vl = mine(v, G * hd);
    RingAttention<double> ring(&group, ops::Exec{}, Device{}, B, Sl, H, G, hd);
    Vec o(Nl * H * hd), l(B * H * Sl), k_all(cp * kl.size()), v_all(cp * vl.size());
    ring.forward(o.data(), l.data(), ql.data(), kl.data(), vl.data(), k_all.data(), v_all.data(),
                 local.batch());
    expect_near(o, mine(out, H * hd), "output", r);
    Vec dql(ql.size()), dkl(kl.size()), dvl(vl.size());
    ring.backward(dql.data(), dkl.data(), dvl.data(), mine(dout, H * hd).data(), o.data(), l.data(),
                  ql.data(), k_all.data(), v_all.data(), local.batch());
    expect_near(dql, mine(dq, H * hd), "d(q)", r);
    expect_near(dkl, mine(dk, G * hd), "d(k)", r);
    expect_near(dvl, mine(dv, G * hd), "d(v)", r);
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, RingAttentionTest,
                         ::testing::Values(RingCase{2, false}, RingCase{2, true},
                                           RingCase{4, false}, RingCase{4, true}),
                         [](const auto& info) {
                           return "Cp" + std::to_string(info.param.cp) +
                                  (info.param.packed ? "Packed" : "Causal");
                         });

}  // namespace
}  // namespace omni
