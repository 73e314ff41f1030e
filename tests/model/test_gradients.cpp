// Every op's backward, and the whole model's forward_backward, checked against central finite
// differences of the corresponding forward, in double precision (the same templates that train
// in float, instantiated for double). For an op y = f(x) the objective is L = sum(dout ⊙ y)
// with a random dout, so dL/dx is exactly what the backward computes from dout. Accumulating
// outputs start from random "prior" values and overwritten outputs from junk, so the tests also
// pin down the += / = conventions of ops.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <numeric>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "gradient_check.h"
#include "model/gpt_model.h"
#include "model/transformer_config.h"

namespace omni {
namespace {

using gradient_check::check_attention;
using gradient_check::difference;
using gradient_check::dot;
using gradient_check::gradients_match;
using gradient_check::numerical_gradient;
using gradient_check::TestRng;
using gradient_check::tiny_gpt2;
using gradient_check::tiny_llama;
using gradient_check::Vec;

// What overwritten gradient buffers hold before the backward runs.
constexpr double kJunk = 7.0;

// ---------------------------------------------------------------------------------------------
// linear

void check_linear(bool with_bias, bool accumulate_dx) {
  // M = 37 rows spans two of the 32-row blocks that the bias reduction sums separately.
  const int M = 37, K = 6, N = 5;
  TestRng rng(11);
  Vec x = rng.normal(size_t(M) * K), w = rng.normal(size_t(N) * K), b = rng.normal(N);
  const Vec dout = rng.normal(size_t(M) * N);
  Vec y(size_t(M) * N);
  auto objective = [&] {
    ops::linear_forward(y.data(), x.data(), w.data(), with_bias ? b.data() : nullptr, M, K, N);
    return dot(dout, y);
  };
  const Vec dx_prior = accumulate_dx ? rng.normal(x.size()) : Vec(x.size(), kJunk);
  const Vec dw_prior = rng.normal(w.size()), db_prior = rng.normal(b.size());
  Vec dx = dx_prior, dw = dw_prior, db = db_prior;
  ops::linear_backward(dx.data(), dw.data(), with_bias ? db.data() : nullptr, dout.data(), x.data(),
                       w.data(), M, K, N, accumulate_dx);

  EXPECT_TRUE(gradients_match("dx", accumulate_dx ? difference(dx, dx_prior) : dx,
                              numerical_gradient(x, objective)));
  EXPECT_TRUE(gradients_match("dw", difference(dw, dw_prior), numerical_gradient(w, objective)));
  if (with_bias) {
    EXPECT_TRUE(
        gradients_match("dbias", difference(db, db_prior), numerical_gradient(b, objective)));
  }
}

TEST(LinearBackward, MatchesFiniteDifferencesWithBias) {
  check_linear(true, false);
}
TEST(LinearBackward, MatchesFiniteDifferencesWithoutBias) {
  check_linear(false, false);
}
TEST(LinearBackward, AddsIntoDxWhenAccumulating) {
  check_linear(true, true);
}

// ---------------------------------------------------------------------------------------------
// embedding

void check_embedding(bool with_positions) {
  const int batch = 2, seq = 4, N = batch * seq, C = 5, vocab = 6, positions = seq + 2;
  // Token 3 appears three times, across both sequences; tokens 0 and 5 never: their rows, like
  // the position rows past `seq`, must get no gradient.
  const std::vector<int32_t> tokens = {3, 1, 3, 2, 4, 3, 1, 2};
  TestRng rng(12);
  Vec wte = rng.normal(size_t(vocab) * C), wpe = rng.normal(size_t(positions) * C);
  const Vec dout = rng.normal(size_t(N) * C);
  Vec out(size_t(N) * C);
  auto objective = [&] {
    ops::embedding_forward(out.data(), tokens.data(), wte.data(),
                           with_positions ? wpe.data() : nullptr, N, seq, C);
    return dot(dout, out);
  };
  const Vec dwte_prior = rng.normal(wte.size()), dwpe_prior = rng.normal(wpe.size());
  Vec dwte = dwte_prior, dwpe = dwpe_prior;
  ops::embedding_backward(dwte.data(), with_positions ? dwpe.data() : nullptr, tokens.data(),
                          dout.data(), N, seq, C);

  EXPECT_TRUE(
      gradients_match("dwte", difference(dwte, dwte_prior), numerical_gradient(wte, objective)));
  if (with_positions) {
    EXPECT_TRUE(
        gradients_match("dwpe", difference(dwpe, dwpe_prior), numerical_gradient(wpe, objective)));
  } else {
    EXPECT_EQ(dwpe, dwpe_prior);
  }
}

TEST(EmbeddingBackward, MatchesFiniteDifferencesWithPositionTable) {
  check_embedding(true);
}
TEST(EmbeddingBackward, MatchesFiniteDifferencesWithoutPositionTable) {
  check_embedding(false);
}

// ---------------------------------------------------------------------------------------------
// normalisation

void check_layernorm(bool with_bias) {
  const int N = 37, C = 7;  // 37 rows: two blocks of the weight-gradient reduction
  TestRng rng(13);
  Vec x = rng.normal(size_t(N) * C, 2.0), w = rng.uniform(C, 0.5, 1.5), b = rng.normal(C);
  for (int n = 0; n < N; ++n) x[size_t(n) * C] += 3.0;  // rows with a non-zero mean
  const Vec dout = rng.normal(x.size());
  Vec out(x.size()), mean(N), rstd(N);
  auto objective = [&] {
    ops::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(),
                           with_bias ? b.data() : nullptr, N, C, 1e-5);
    return dot(dout, out);
  };
  objective();
  const Vec dx_prior = rng.normal(x.size()), dw_prior = rng.normal(C), db_prior = rng.normal(C);
  Vec dx = dx_prior, dw = dw_prior, db = db_prior;
  ops::layernorm_backward(dx.data(), dw.data(), with_bias ? db.data() : nullptr, dout.data(),
                          x.data(), w.data(), mean.data(), rstd.data(), N, C);

  EXPECT_TRUE(gradients_match("dx", difference(dx, dx_prior), numerical_gradient(x, objective)));
  EXPECT_TRUE(gradients_match("dw", difference(dw, dw_prior), numerical_gradient(w, objective)));
  if (with_bias) {
    EXPECT_TRUE(gradients_match("db", difference(db, db_prior), numerical_gradient(b, objective)));
  }
}

TEST(LayerNormBackward, MatchesFiniteDifferencesWithBias) {
  check_layernorm(true);
}
TEST(LayerNormBackward, MatchesFiniteDifferencesWithoutBias) {
  check_layernorm(false);
}

TEST(RmsNormBackward, MatchesFiniteDifferences) {
  const int N = 37, C = 7;
  TestRng rng(14);
  Vec x = rng.normal(size_t(N) * C, 2.0), w = rng.uniform(C, 0.5, 1.5);
  const Vec dout = rng.normal(x.size());
  Vec out(x.size()), rstd(N);
  auto objective = [&] {
    ops::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5);
    return dot(dout, out);
  };
  objective();
  const Vec dx_prior = rng.normal(x.size()), dw_prior = rng.normal(C);
  Vec dx = dx_prior, dw = dw_prior;
  ops::rmsnorm_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), N, C);

  EXPECT_TRUE(gradients_match("dx", difference(dx, dx_prior), numerical_gradient(x, objective)));
  EXPECT_TRUE(gradients_match("dw", difference(dw, dw_prior), numerical_gradient(w, objective)));
}

// ---------------------------------------------------------------------------------------------
// activations

// Both of Megatron's forms: the exact erf GELU (its default) and --openai-gelu's tanh.
TEST(GeluBackward, MatchesFiniteDifferencesInBothForms) {
  for (GeluForm form : {GeluForm::Erf, GeluForm::Tanh}) {
    const size_t n = 101;
    TestRng rng(15);
    Vec x = rng.uniform(n, -5.0, 5.0);
    const Vec dout = rng.normal(n);
    Vec out(n);
    auto objective = [&] {
      ops::gelu_forward(out.data(), x.data(), n, form);
      return dot(dout, out);
    };
    Vec dx(n, kJunk);
    ops::gelu_backward(dx.data(), dout.data(), x.data(), n, form);
    EXPECT_TRUE(gradients_match("dx", dx, numerical_gradient(x, objective))) << to_string(form);
  }
}

// The erf form is x Phi(x) (torch.nn.functional.gelu's default), the tanh form its
// approximation: they differ by up to about 5e-4 (near |x| = 2), so a mix-up shows.
TEST(GeluForward, ErfFormIsXTimesTheNormalCdfAndTanhFormItsApproximation) {
  const Vec x = {-6.0, -2.0, -0.75, -1e-3, 0.0, 0.5, 1.0, 2.0, 3.0};
  Vec erf_out(x.size()), tanh_out(x.size());
  ops::gelu_forward(erf_out.data(), x.data(), x.size(), GeluForm::Erf);
  ops::gelu_forward(tanh_out.data(), x.data(), x.size(), GeluForm::Tanh);
  double largest_gap = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double v = x[i];
    EXPECT_NEAR(erf_out[i], 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0))), 1e-15) << v;
    const double u = std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v);
    EXPECT_NEAR(tanh_out[i], 0.5 * v * (1.0 + std::tanh(u)), 1e-15) << v;
    largest_gap = std::max(largest_gap, std::abs(erf_out[i] - tanh_out[i]));
  }
  EXPECT_GT(largest_gap, 1e-4);
  EXPECT_LT(largest_gap, 1e-3);
}

TEST(SwigluBackward, MatchesFiniteDifferences) {
  const int N = 9, F = 7;
  TestRng rng(16);
  Vec x = rng.uniform(size_t(N) * 2 * F, -5.0, 5.0);
  const Vec dout = rng.normal(size_t(N) * F);
  Vec out(dout.size());
  auto objective = [&] {
    ops::swiglu_forward(out.data(), x.data(), N, F);
    return dot(dout, out);
  };
  Vec dx(x.size(), kJunk);
  ops::swiglu_backward(dx.data(), dout.data(), x.data(), N, F);
  EXPECT_TRUE(gradients_match("dx", dx, numerical_gradient(x, objective)));
}

// ---------------------------------------------------------------------------------------------
// qkv split / merge and rope: linear maps whose backward is the transpose of the forward.

TEST(QkvSplitBackward, MergeIsTheAdjointOfSplit) {
  const ops::AttentionDims d{2, 3, 4, 2, 3};  // two groups of two query heads
  const size_t N = size_t(d.batch) * d.seq;
  TestRng rng(17);
  const Vec x = rng.normal(N * d.qkv_width());
  const Vec yq = rng.normal(N * d.heads * d.head_dim), yk = rng.normal(N * d.groups * d.head_dim),
            yv = rng.normal(yk.size());
  Vec q(yq.size()), k(yk.size()), v(yv.size()), merged(x.size(), kJunk);
  ops::qkv_split(q.data(), k.data(), v.data(), x.data(), d);
  ops::qkv_merge(merged.data(), yq.data(), yk.data(), yv.data(), d);
  // Both sides sum the same products, so they agree to rounding.
  EXPECT_NEAR(dot(q, yq) + dot(k, yk) + dot(v, yv), dot(x, merged), 1e-12 * x.size());
}

TEST(QkvSplitBackward, MergeInvertsSplit) {
  const ops::AttentionDims d{2, 3, 8, 2, 2};  // four query heads per group
  const size_t N = size_t(d.batch) * d.seq;
  TestRng rng(18);
  const Vec x = rng.normal(N * d.qkv_width());
  Vec q(N * d.heads * d.head_dim), k(N * d.groups * d.head_dim), v(k.size()),
      merged(x.size(), kJunk);
  ops::qkv_split(q.data(), k.data(), v.data(), x.data(), d);
  ops::qkv_merge(merged.data(), q.data(), k.data(), v.data(), d);
  EXPECT_EQ(merged, x);
  // Spot-check the interleaved layout: group 1's key is after its two query heads.
  const int hd = d.head_dim, group_width = (d.heads_per_group() + 2) * hd;
  EXPECT_EQ(k[size_t(1) * hd], x[size_t(group_width) + d.heads_per_group() * hd]);
}

struct RopeShape {
  int batch = 2, seq = 7, heads = 3, head_dim = 8;
  double base = 10000.0;
  size_t rows() const { return size_t(batch) * seq; }
  size_t numel() const { return rows() * heads * head_dim; }
};

TEST(RopeBackward, IsTheTransposeOfForward) {
  const RopeShape s;
  Vec cos(size_t(s.seq) * s.head_dim / 2), sin(cos.size());
  ops::rope_tables(cos.data(), sin.data(), s.seq, s.head_dim, s.base);
  TestRng rng(19);
  const Vec x = rng.normal(s.numel()), y = rng.normal(s.numel());
  Vec rx = x, rty = y;
  ops::rope_forward(rx.data(), cos.data(), sin.data(), int(s.rows()), s.seq, s.heads, s.head_dim);
  ops::rope_backward(rty.data(), cos.data(), sin.data(), int(s.rows()), s.seq, s.heads, s.head_dim);
  EXPECT_NEAR(dot(rx, y), dot(x, rty), 1e-12 * s.numel());
}

TEST(RopeForward, RotatesHalfPairsByPositionTimesInverseFrequency) {
  const RopeShape s;
  Vec cos(size_t(s.seq) * s.head_dim / 2), sin(cos.size());
  ops::rope_tables(cos.data(), sin.data(), s.seq, s.head_dim, s.base);
  TestRng rng(20);
  const Vec x = rng.normal(s.numel());
  Vec y = x;
  ops::rope_forward(y.data(), cos.data(), sin.data(), int(s.rows()), s.seq, s.heads, s.head_dim);
  // Su et al., RoFormer, eq. 34, in the rotate-half layout: pair (i, i + hd/2) at position p
  // turns by p * base^(-2i/hd).
  const int half = s.head_dim / 2;
  double worst = 0;
  for (size_t n = 0; n < s.rows(); ++n)
    for (int h = 0; h < s.heads; ++h)
      for (int i = 0; i < half; ++i) {
        const size_t at = (n * s.heads + h) * s.head_dim + i;
        const double angle = double(n % s.seq) * std::pow(s.base, -2.0 * i / s.head_dim);
        const double x1 = x[at], x2 = x[at + half];
        worst = std::max(worst, std::abs(y[at] - (x1 * std::cos(angle) - x2 * std::sin(angle))));
        worst =
            std::max(worst, std::abs(y[at + half] - (x2 * std::cos(angle) + x1 * std::sin(angle))));
      }
  EXPECT_LT(worst, 1e-12);
}

// ---------------------------------------------------------------------------------------------
// attention

// AttentionDims: {batch, seq, heads, groups, head_dim}.
TEST(AttentionBackward, MatchesFiniteDifferencesWithMultiHeadAttention) {
  check_attention({2, 5, 3, 3, 4}, 21);
}
TEST(AttentionBackward, MatchesFiniteDifferencesWithGroupedQueries) {
  check_attention({2, 5, 4, 2, 4}, 22);
}
TEST(AttentionBackward, MatchesFiniteDifferencesWithFourQueryHeadsPerGroup) {
  check_attention({2, 5, 8, 2, 4}, 23);
}
TEST(AttentionBackward, MatchesFiniteDifferencesWithMultiQueryAttention) {
  check_attention({2, 5, 3, 1, 4}, 24);
}
// 70 rows: the implementation works in 64-row blocks, so row block 1 attends to keys that
// block 0 also produced gradients for.
TEST(AttentionBackward, MatchesFiniteDifferencesAcrossTheRowBlockBoundary) {
  check_attention({2, 70, 2, 1, 2}, 25);
}

// Multi-latent attention's shapes: value heads narrower (and wider) than the query heads, and
// a softmax scale of its own.
TEST(AttentionBackward, MatchesFiniteDifferencesWithValueHeadDimAndScaleOfTheirOwn) {
  ops::AttentionDims d{1, 5, 2, 2, 4};
  d.v_head_dim = 3, d.softmax_scale = 0.9;
  check_attention(d, 26);
  d.v_head_dim = 6;
  check_attention(d, 27);
}

// Ring attention's per-block form: rows see keys [first, last] of a block (possibly none),
// and the log-sum-exp of their scaled scores is returned for merging blocks.
TEST(AttentionForward, GivesLogSumExpAndZeroForRowsWithoutKeys) {
  const int S = 4, hd = 3;
  const std::vector<int32_t> first = {0, 1, 2, 0}, last = {-1, 2, 1, 3};  // rows 0, 2: none
  const ops::AttentionDims d{1, S, 1, 1, hd, first.data(), last.data()};
  TestRng rng(26);
  Vec q = rng.normal(S * hd), k = rng.normal(S * hd), v = rng.normal(S * hd);
  Vec out(S * hd, kJunk), lse(S, kJunk);
  ops::attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), d);
  for (int i = 0; i < S; ++i) {
    if (last[i] < first[i]) {
      EXPECT_EQ(lse[i], -std::numeric_limits<double>::infinity());
      for (int c = 0; c < hd; ++c) EXPECT_EQ(out[i * hd + c], 0.0);
      continue;
    }
    double sum = 0;
    for (int j = first[i]; j <= last[i]; ++j)
      sum += std::exp(dot(Vec(q.begin() + i * hd, q.begin() + (i + 1) * hd),
                          Vec(k.begin() + j * hd, k.begin() + (j + 1) * hd)) /
                      std::sqrt(double(hd)));
    EXPECT_NEAR(lse[i], std::log(sum), 1e-12);
  }
}

// Attention over all keys equals attention over two blocks of them merged by their
// log-sum-exps, and the backward with the merged output and log-sum-exp gives each block's
// part of the gradients (ring attention's arithmetic).
TEST(AttentionMerge, TwoBlocksOfKeysGiveAttentionOverAll) {
  const int S = 6, H = 2, hd = 3;
  const ops::AttentionDims all{1, S, H, 1, hd};
  TestRng rng(27);
  const Vec q = rng.normal(S * H * hd), k = rng.normal(S * hd), v = rng.normal(S * hd),
            dout = rng.normal(S * H * hd);
  Vec out(q.size()), lse(S * H), dq(q.size()), dk(k.size()), dv(v.size());
  ops::attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), all);
  ops::attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), out.data(), lse.data(),
                          q.data(), k.data(), v.data(), all);
  // Block A: keys 0..2 (row i sees 0..min(i, 2)); block B: keys 3..5 (row i sees 3..i).
  std::vector<int32_t> first_a(S, 0), last_a(S), first_b(S, 0), last_b(S);
  for (int i = 0; i < S; ++i) last_a[i] = std::min(i, 2), last_b[i] = i - 3;
  Vec kb(k.begin() + 3 * hd, k.end()), vb(v.begin() + 3 * hd, v.end());
  kb.resize(k.size()), vb.resize(v.size());
  const ops::AttentionDims da{1, S, H, 1, hd, first_a.data(), last_a.data()};
  const ops::AttentionDims db{1, S, H, 1, hd, first_b.data(), last_b.data()};
  Vec merged(q.size()), merged_lse(S * H), out_b(q.size()), lse_b(S * H);
  ops::attention_forward(merged.data(), merged_lse.data(), q.data(), k.data(), v.data(), da);
  ops::attention_forward(out_b.data(), lse_b.data(), q.data(), kb.data(), vb.data(), db);
  ops::attention_merge(merged.data(), merged_lse.data(), out_b.data(), lse_b.data(), db);
  EXPECT_TRUE(gradients_match("out", merged, out, 1e-12));
  EXPECT_TRUE(gradients_match("lse", merged_lse, lse, 1e-12));
  Vec dq_a(q.size()), dk_a(k.size()), dv_a(v.size()), dq_b(q.size()), dk_b(k.size()),
      dv_b(v.size());
  ops::attention_backward(dq_a.data(), dk_a.data(), dv_a.data(), dout.data(), merged.data(),
                          merged_lse.data(), q.data(), k.data(), v.data(), da);
  ops::attention_backward(dq_b.data(), dk_b.data(), dv_b.data(), dout.data(), merged.data(),
                          merged_lse.data(), q.data(), kb.data(), vb.data(), db);
  for (size_t i = 0; i < dq.size(); ++i) dq_a[i] += dq_b[i];
  for (int j = 0; j < 3 * hd; ++j) dk_a[3 * hd + j] = dk_b[j], dv_a[3 * hd + j] = dv_b[j];
  EXPECT_TRUE(gradients_match("dq", dq_a, dq, 1e-12));
  EXPECT_TRUE(gradients_match("dk", dk_a, dk, 1e-12));
  EXPECT_TRUE(gradients_match("dv", dv_a, dv, 1e-12));
}

// ---------------------------------------------------------------------------------------------
// output layer + cross-entropy

struct ClassifierCase {
  int rows = 9, hidden = 5, vocab = 7, w_rows = 7;
  double grad_scale = 1.0;
  std::vector<float> mask;  // empty: null mask
};

struct ClassifierResult {
  Vec h, w, dh, dw, dw_prior;
};

ClassifierResult check_classifier(const ClassifierCase& c, uint64_t seed) {
  TestRng rng(seed);
  ClassifierResult r;
  r.h = rng.normal(size_t(c.rows) * c.hidden);
  r.w = rng.normal(size_t(c.w_rows) * c.hidden);
  const std::vector<int32_t> targets = rng.ints(c.rows, 0, c.vocab - 1);
  const float* mask = c.mask.empty() ? nullptr : c.mask.data();
  ops::ClassifierLossArgs args;
  args.rows = c.rows, args.hidden = c.hidden, args.vocab = c.vocab, args.grad_scale = c.grad_scale;
  ops::ClassifierLossArgs unscaled = args;
  unscaled.grad_scale = 1.0;
  auto objective = [&] {
    return c.grad_scale * ops::classifier_cross_entropy<double>(nullptr, nullptr, nullptr,
                                                                r.h.data(), r.w.data(),
                                                                targets.data(), mask, unscaled);
  };
  r.dh.assign(r.h.size(), kJunk);
  r.dw_prior = rng.normal(r.w.size());
  r.dw = r.dw_prior;
  const double loss = ops::classifier_cross_entropy<double>(
      nullptr, r.dh.data(), r.dw.data(), r.h.data(), r.w.data(), targets.data(), mask, args);
  EXPECT_NEAR(c.grad_scale * loss, objective(), 1e-12 * std::abs(loss));

  EXPECT_TRUE(gradients_match("dh", r.dh, numerical_gradient(r.h, objective)));
  EXPECT_TRUE(
      gradients_match("dw", difference(r.dw, r.dw_prior), numerical_gradient(r.w, objective)));
  return r;
}

TEST(ClassifierCrossEntropyBackward, MatchesFiniteDifferencesWithLossMask) {
  ClassifierCase c;
  c.grad_scale = 0.37;
  c.mask = {1, 0, 1, 0.5f, 1, 0, 1, 1, 2};
  check_classifier(c, 31);
}

TEST(ClassifierCrossEntropyBackward, MatchesFiniteDifferencesWithPaddedVocabulary) {
  ClassifierCase c;
  c.w_rows = 12;  // rows 7..11 are padding, outside the softmax
  check_classifier(c, 32);
}

TEST(ClassifierCrossEntropyBackward, GivesMaskedRowsAndPaddedVocabularyNoGradient) {
  ClassifierCase c;
  c.w_rows = 12;
  c.mask = {1, 0, 1, 1, 0, 1, 1, 1, 0};
  const ClassifierResult r = check_classifier(c, 33);
  for (int n = 0; n < c.rows; ++n) {
    if (c.mask[n] != 0) continue;
    for (int j = 0; j < c.hidden; ++j) EXPECT_EQ(r.dh[size_t(n) * c.hidden + j], 0.0);
  }
  for (size_t i = size_t(c.vocab) * c.hidden; i < r.dw.size(); ++i)
    EXPECT_EQ(r.dw[i], r.dw_prior[i]) << "padded element " << i;
}

// ---------------------------------------------------------------------------------------------
// the whole model

constexpr int kModelBatch = 2;
constexpr uint64_t kModelSeed = 1234;

// The initialiser sets norm weights to 1 and biases to 0, where some gradient terms vanish or
// cancel; move them off those points.
template <typename T>
void perturb_ones_and_zeros(ParameterSet<T>& params, TestRng& rng) {
  for (const ParamInfo& p : params.infos()) {
    if (p.init != ParamInit::Ones && p.init != ParamInit::Zeros) continue;
    const Vec noise = rng.normal(p.numel, 0.2);
    T* v = params.value(p.name);
    for (int64_t i = 0; i < p.numel; ++i) v[i] += T(noise[i]);
  }
}

struct ModelBatch {
  std::vector<int32_t> tokens, labels;
  std::vector<float> mask;
  MicroBatch micro_batch(int seq) const {
    return MicroBatch{tokens.data(), labels.data(), mask.empty() ? nullptr : mask.data(),
                      kModelBatch, seq};
  }
};

ModelBatch random_batch(const TransformerConfig& cfg, TestRng& rng) {
  const size_t n = size_t(kModelBatch) * cfg.seq_length;
  ModelBatch b{rng.ints(n, 0, cfg.vocab_size - 1), rng.ints(n, 0, cfg.vocab_size - 1), {}};
  b.tokens[n - 1] = b.tokens[0];  // a repeated token, across the two sequences
  return b;
}

// Every parameter tensor's gradient from forward_backward against central differences of
// forward_loss, on up to 8 elements per tensor (always the first and the last).
void check_model_gradients(const TransformerConfig& cfg, std::vector<float> mask = {},
                           double grad_scale = 1.0) {
  GPTModel<double> model(cfg, kModelBatch, kModelSeed);
  ParameterSet<double>& params = model.params();
  TestRng rng(kModelSeed);
  perturb_ones_and_zeros(params, rng);
  ModelBatch batch = random_batch(cfg, rng);
  batch.mask = std::move(mask);
  const MicroBatch mb = batch.micro_batch(cfg.seq_length);

  // Gradients accumulate: start from random values and take the difference.
  const Vec prior = rng.normal(params.size());
  std::copy(prior.begin(), prior.end(), params.grads());
  // With multi-token prediction the objective adds the depths' mean loss, which only training
  // forwards compute (their gradient, at grad_scale 0, adds nothing).
  auto mtp_term = [&] {
    const std::vector<double> d = model.take_mtp_losses();
    return cfg.mtp_loss_scaling_factor / std::max(cfg.mtp_num_layers, 1) *
           std::accumulate(d.begin(), d.end(), 0.0);
  };
  const double loss = model.forward_backward(mb, grad_scale) + mtp_term();
  auto objective = [&] {
    if (cfg.mtp_num_layers == 0) return grad_scale * model.forward_loss(mb);
    return grad_scale * (model.forward_backward(mb, 0.0) + mtp_term());
  };
  EXPECT_NEAR(grad_scale * loss, objective(), 1e-12 * std::abs(grad_scale * loss));

  // Some tensors have a gradient of exactly zero by symmetry: a bias added to every key before
  // the softmax (the k-LayerNorm bias without rope) shifts each row's scores by a constant. They
  // are measured against a millionth of the model's largest gradient instead of their own zero.
  double largest = 0;
  for (int64_t i = 0; i < params.size(); ++i)
    largest = std::max(largest, std::abs(params.grads()[i] - prior[i]));
  for (const ParamInfo& p : params.infos()) {
    const std::vector<size_t> picked = rng.sample_indices(p.numel, 8);
    Vec analytic;
    for (size_t i : picked) analytic.push_back(params.grads()[p.offset + i] - prior[p.offset + i]);
    EXPECT_TRUE(gradients_match(
        p.name, analytic, numerical_gradient(params.value(p.name), p.numel, objective, picked),
        gradient_check::kGradientTolerance, 1e-6 * largest));
  }
  // Rows of the (padded) vocabulary past vocab_size take part in nothing.
  for (const char* name : {"embedding.word_embeddings.weight", "output_layer.weight"}) {
    if (!params.has(name)) continue;
    const ParamInfo& p = params.info(name);
    for (int64_t i = int64_t(cfg.vocab_size) * cfg.hidden_size; i < p.numel; ++i)
      ASSERT_EQ(params.grads()[p.offset + i], prior[p.offset + i]) << name << " element " << i;
  }
}

TEST(GPTModelGradient, MatchesFiniteDifferencesForGpt2) {
  check_model_gradients(tiny_gpt2());
}

TEST(GPTModelGradient, MatchesFiniteDifferencesForLlama) {
  check_model_gradients(tiny_llama());
}

TEST(GPTModelGradient, MatchesFiniteDifferencesWithQkvBiasAndQkLayerNorm) {
  TransformerConfig c = tiny_llama();
  c.add_qkv_bias = true;
  c.qk_layernorm = true;
  c.kv_channels = 6;  // heads * head_dim (24) differs from hidden_size (16)
  check_model_gradients(c);
}

TEST(GPTModelGradient, MatchesFiniteDifferencesWithQkLayerNormUnderLayerNorm) {
  TransformerConfig c = tiny_gpt2();
  c.qk_layernorm = true;  // q/k LayerNorms with biases
  check_model_gradients(c);
}

// Multi-latent attention (model/mla.h): query and key/value latents with RMSNorm, YaRN rope
// with a softmax scale that is not 1/sqrt(head dim), value heads narrower than query heads.
TEST(GPTModelGradient, MatchesFiniteDifferencesWithMultiLatentAttention) {
  TransformerConfig c = tiny_llama();
  c.multi_latent_attention = true;
  c.qk_layernorm = true;
  c.q_lora_rank = 6, c.kv_lora_rank = 8, c.qk_head_dim = 4, c.qk_pos_emb_head_dim = 4;
  c.v_head_dim = 6;
  c.rotary_scaling_factor = 4, c.mscale = c.mscale_all_dim = 0.7;
  check_model_gradients(c);
}

// Without a query latent or latent norms, LayerNorm elsewhere, plain rope, values wider than
// the query heads.
TEST(GPTModelGradient, MatchesFiniteDifferencesWithMultiLatentAttentionWithoutQueryLatent) {
  TransformerConfig c = tiny_llama();
  c.normalization = Normalization::LayerNorm;
  c.multi_latent_attention = true;
  c.kv_lora_rank = 5, c.qk_head_dim = 2, c.qk_pos_emb_head_dim = 2, c.v_head_dim = 7;
  c.yarn = false;
  check_model_gradients(c);
}

TEST(GPTModelGradient, MatchesFiniteDifferencesWithoutLinearBiases) {
  TransformerConfig c = tiny_gpt2();
  c.add_bias_linear = false;
  check_model_gradients(c);
}

TEST(GPTModelGradient, MatchesFiniteDifferencesWithLinearBiasesUnderRmsNorm) {
  TransformerConfig c = tiny_llama();
  c.add_bias_linear = true;
  check_model_gradients(c);
}

TEST(GPTModelGradient, MatchesFiniteDifferencesWithMultiQueryAttention) {
  TransformerConfig c = tiny_llama();
  c.num_query_groups = 1;
  check_model_gradients(c);
}

TEST(GPTModelGradient, MatchesFiniteDifferencesWithLossMaskAndGradScale) {
  check_model_gradients(tiny_gpt2(), {1, 0, 1, 1, 0.5f, 0, 1, 1, 1, 1}, 0.25);
}

TEST(GPTModelGradient, MatchesFiniteDifferencesWithPartialRotaryAndLlama31Scaling) {
  TransformerConfig c = tiny_llama();
  c.kv_channels = 8;
  c.rotary_percent = 0.5;  // rope on channels 0..3 of each head's 8
  c.use_rope_scaling = true;
  c.rope_scaling_factor = 8;
  c.rotary_base = 1e6;  // wavelengths past Llama 3.1's 2048 and 8192 thresholds
  ASSERT_EQ(c.rotary_dim(), 4);
  check_model_gradients(c);
}

TEST(GPTModelGradient, MatchesFiniteDifferencesWithZeroCentredNormWeights) {
  for (TransformerConfig c : {tiny_gpt2(), tiny_llama()}) {
    c.layernorm_zero_centered_gamma = true;  // --apply-layernorm-1p
    c.qk_layernorm = true;
    check_model_gradients(c);
  }
}

TEST(GPTModelGradient, MatchesFiniteDifferencesWithoutPositionEmbedding) {
  TransformerConfig c = tiny_gpt2();
  c.position_embedding_type = PositionEmbedding::None;
  GPTModel<double> model(c, kModelBatch, kModelSeed);
  EXPECT_FALSE(model.params().has("embedding.position_embeddings.weight"));
  check_model_gradients(c);
}

// --apply-layernorm-1p stores gamma - 1: the same model as stored weights gamma, applied +1.
// Multi-token prediction (model/mtp.cpp): two depths after a Llama-style model, with a loss
// mask and a weight other than Megatron's default.
TEST(GPTModelGradient, MatchesFiniteDifferencesWithMultiTokenPrediction) {
  TransformerConfig cfg = gradient_check::tiny_llama();
  cfg.mtp_num_layers = 2;
  cfg.mtp_loss_scaling_factor = 0.3;
  std::vector<float> mask(size_t(kModelBatch) * cfg.seq_length, 1.0f);
  mask[1] = 0.0f, mask[mask.size() - 2] = 0.0f;
  check_model_gradients(cfg, mask, 0.7);
}

// GPT-2's learned absolute positions: a depth's embedding adds the rolled tokens' positions
// (position 0 where the roll shifted in token 0), so the position table's gradient has MTP
// terms.
TEST(GPTModelGradient, MatchesFiniteDifferencesWithMultiTokenPredictionForGpt2) {
  TransformerConfig cfg = gradient_check::tiny_gpt2();
  cfg.num_layers = 1;  // one decoder layer and one depth: seconds of finite differences
  cfg.mtp_num_layers = 1;
  cfg.mtp_loss_scaling_factor = 0.3;
  check_model_gradients(cfg, {}, 0.7);
}

TEST(GPTModel, ZeroCentredNormWeightsAreTheWeightsMinusOne) {
  TransformerConfig plain = tiny_llama(), shifted = plain;
  shifted.layernorm_zero_centered_gamma = true;
  GPTModel<double> a(plain, kModelBatch, kModelSeed), b(shifted, kModelBatch, kModelSeed);
  TestRng rng(5);
  perturb_ones_and_zeros(a.params(), rng);
  std::copy(a.params().values(), a.params().values() + a.params().size(), b.params().values());
  for (const ParamInfo& p : b.params().infos()) {
    if (p.name.find("norm") == std::string::npos || p.name.find(".weight") == std::string::npos)
      continue;
    EXPECT_EQ(p.init, ParamInit::Zeros) << p.name;  // Megatron initialises them to 0
    for (int64_t i = 0; i < p.numel; ++i) b.params().value(p.name)[i] -= 1.0;
  }
  const ModelBatch batch = random_batch(plain, rng);
  EXPECT_NEAR(a.forward_loss(batch.micro_batch(plain.seq_length)),
              b.forward_loss(batch.micro_batch(plain.seq_length)), 1e-12);
}

// Megatron's RotaryEmbedding: int(head_dim x percent) channels, Llama 3.1's _apply_scaling.
TEST(RotaryFrequencies, FollowMegatronsRotaryPercentAndLlama31Scaling) {
  TransformerConfig c = tiny_llama();
  c.kv_channels = 128;
  c.rotary_base = 500000;
  c.rotary_percent = 0.3;  // int(38.4) = 38 channels, 19 frequencies
  EXPECT_EQ(c.rotary_dim(), 38);
  c.rotary_percent = 0.3;
  c.kv_channels = 100;  // int(30.000000000000004) = 30: 15 frequencies
  EXPECT_EQ(c.rotary_dim(), 30);
  c.kv_channels = 70;  // int(21) = 21, odd: base^(-i/21) for i = 0, 2, .. 20, 11 of them
  EXPECT_EQ(c.rotary_dim(), 22);
  EXPECT_EQ(c.rotary_inv_freq().size(), 11u);
  EXPECT_NEAR(c.rotary_inv_freq()[10], std::pow(500000.0, -20.0 / 21), 1e-18);
  c.kv_channels = 128;
  c.rotary_percent = 1.0;
  const std::vector<double> plain = c.rotary_inv_freq();
  c.use_rope_scaling = true;
  const std::vector<double> scaled = c.rotary_inv_freq();
  ASSERT_EQ(plain.size(), 64u);
  for (size_t i = 0; i < plain.size(); ++i) {
    const double f = std::pow(500000.0, -2.0 * double(i) / 128), wavelen = 2 * std::numbers::pi / f;
    EXPECT_NEAR(plain[i], f, 1e-15 * f);
    // Hand-computed from the formula: keep below 2048, divide by 8 above 8192, and between
    // them blend with smooth = (8192 / wavelen - 1) / 3.
    const double smooth = (8192 / wavelen - 1) / 3;
    const double want = wavelen < 2048   ? f
                        : wavelen > 8192 ? f / 8
                                         : (1 - smooth) * f / 8 + smooth * f;
    EXPECT_NEAR(scaled[i], want, 1e-15 * f) << i;
  }
  EXPECT_EQ(scaled[0], plain[0]);        // wavelength 2 pi: untouched
  EXPECT_EQ(scaled[63], plain[63] / 8);  // the longest wavelengths: divided by 8
  EXPECT_LT(scaled[32], plain[32]);      // wavelength 4443, between: blended
  EXPECT_GT(scaled[32], plain[32] / 8);
}

// ---------------------------------------------------------------------------------------------
// float against double: the float instantiation runs the same templates, but BLAS, the
// vectorised math and any float-only branch differ. Same inputs, gradients equal to ~1e-5.

constexpr double kFloatTolerance = 1e-5;

Vec to_double(const std::vector<float>& v) {
  return Vec(v.begin(), v.end());
}

TEST(FloatGradient, AttentionMatchesDouble) {
  const ops::AttentionDims d{2, 70, 4, 2, 8};
  const size_t N = size_t(d.batch) * d.seq;
  TestRng rng(41);
  auto rounded = [](Vec v) {
    for (double& x : v) x = double(float(x));
    return v;
  };
  const Vec q = rounded(rng.normal(N * d.heads * d.head_dim)),
            k = rounded(rng.normal(N * d.groups * d.head_dim)), v = rounded(rng.normal(k.size())),
            dout = rounded(rng.normal(q.size()));
  const size_t nlse = size_t(d.batch) * d.heads * d.seq;

  Vec out(q.size()), lse(nlse), dq(q.size()), dk(k.size()), dv(v.size());
  ops::attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), d);
  ops::attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), out.data(), lse.data(),
                          q.data(), k.data(), v.data(), d);

  auto f = [](const Vec& x) { return std::vector<float>(x.begin(), x.end()); };
  const std::vector<float> qf = f(q), kf = f(k), vf = f(v), doutf = f(dout);
  std::vector<float> outf(q.size()), lsef(nlse), dqf(q.size()), dkf(k.size()), dvf(v.size());
  ops::attention_forward(outf.data(), lsef.data(), qf.data(), kf.data(), vf.data(), d);
  ops::attention_backward(dqf.data(), dkf.data(), dvf.data(), doutf.data(), outf.data(),
                          lsef.data(), qf.data(), kf.data(), vf.data(), d);

  EXPECT_TRUE(gradients_match("out", to_double(outf), out, kFloatTolerance));
  EXPECT_TRUE(gradients_match("dq", to_double(dqf), dq, kFloatTolerance));
  EXPECT_TRUE(gradients_match("dk", to_double(dkf), dk, kFloatTolerance));
  EXPECT_TRUE(gradients_match("dv", to_double(dvf), dv, kFloatTolerance));
}

// Float's exp overflows from about 88: large negative inputs saturate the sigmoid inside GELU
// and SiLU, where a float-only inf or NaN would appear.
TEST(FloatGradient, ActivationsMatchDoubleIncludingSaturatedInputs) {
  const int N = 4, F = 50;
  TestRng rng(42);
  Vec x = rng.uniform(size_t(N) * 2 * F, -3.0, 3.0);
  for (size_t i = 0; i < x.size(); i += 5) x[i] *= 40.0;  // some inputs up to +-120
  for (double& v : x) v = double(float(v));
  const Vec dout = rng.normal(size_t(N) * F);
  const std::vector<float> xf(x.begin(), x.end()), doutf(dout.begin(), dout.end());
  const size_t n = dout.size();

  Vec y(n), dx(x.size());
  std::vector<float> yf(n), dxf(x.size());
  for (GeluForm form : {GeluForm::Erf, GeluForm::Tanh}) {
    ops::gelu_forward(y.data(), x.data(), n, form);
    ops::gelu_backward(dx.data(), dout.data(), x.data(), n, form);
    ops::gelu_forward(yf.data(), xf.data(), n, form);
    ops::gelu_backward(dxf.data(), doutf.data(), xf.data(), n, form);
    EXPECT_TRUE(gradients_match("gelu out", to_double(yf), y, kFloatTolerance)) << to_string(form);
    EXPECT_TRUE(gradients_match("gelu dx", Vec(dxf.begin(), dxf.begin() + n),
                                Vec(dx.begin(), dx.begin() + n), kFloatTolerance))
        << to_string(form);
  }

  ops::swiglu_forward(y.data(), x.data(), N, F);
  ops::swiglu_backward(dx.data(), dout.data(), x.data(), N, F);
  ops::swiglu_forward(yf.data(), xf.data(), N, F);
  ops::swiglu_backward(dxf.data(), doutf.data(), xf.data(), N, F);
  EXPECT_TRUE(gradients_match("swiglu out", to_double(yf), y, kFloatTolerance));
  EXPECT_TRUE(gradients_match("swiglu dx", to_double(dxf), dx, kFloatTolerance));
}

void check_float_model_matches_double(const TransformerConfig& cfg) {
  GPTModel<double> md(cfg, kModelBatch, kModelSeed);
  GPTModel<float> mf(cfg, kModelBatch, kModelSeed);
  TestRng rng(kModelSeed);
  perturb_ones_and_zeros(md.params(), rng);
  // Identical inputs: the double model takes the float-rounded values.
  for (int64_t i = 0; i < md.params().size(); ++i) {
    const float x = float(md.params().values()[i]);
    mf.params().values()[i] = x;
    md.params().values()[i] = double(x);
  }
  const ModelBatch batch = random_batch(cfg, rng);
  const MicroBatch mb = batch.micro_batch(cfg.seq_length);
  const double loss_d = md.forward_backward(mb, 1.0), loss_f = mf.forward_backward(mb, 1.0);
  EXPECT_NEAR(loss_f, loss_d, kFloatTolerance * std::abs(loss_d));
  for (const ParamInfo& p : md.params().infos()) {
    const double* gd = md.params().grad(p.name);
    const float* gf = mf.params().grad(p.name);
    EXPECT_TRUE(
        gradients_match(p.name, Vec(gf, gf + p.numel), Vec(gd, gd + p.numel), kFloatTolerance));
  }
}

TEST(FloatGradient, Gpt2ModelMatchesDouble) {
  check_float_model_matches_double(tiny_gpt2());
}

TEST(FloatGradient, LlamaModelMatchesDouble) {
  TransformerConfig c = tiny_llama();
  c.add_qkv_bias = true;
  c.qk_layernorm = true;
  check_float_model_matches_double(c);
}

}  // namespace
}  // namespace omni
