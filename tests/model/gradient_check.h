// Finite-difference gradient checking for the op and model tests. The objective is always a
// scalar; the analytical gradient comes from an op's backward and is compared with central
// differences (L(x + h e_i) - L(x - h e_i)) / 2h, in double precision.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "model/transformer_config.h"

namespace omni::gradient_check {

using Vec = std::vector<double>;

// h for central differences in double: truncation error O(h^2) and rounding O(eps / h) are
// both far below the tolerance at this step.
constexpr double kFiniteDifferenceStep = 1e-6;
// Typical agreement is 1e-9 to 1e-10; 1e-6 still flags any real mistake, which shows up as
// an O(1) relative error.
constexpr double kGradientTolerance = 1e-6;

// Fixed-seed random inputs.
class TestRng {
 public:
  explicit TestRng(uint64_t seed) : engine_(seed) {}
  Vec normal(size_t n, double stddev = 1.0) {
    std::normal_distribution<double> dist(0.0, stddev);
    Vec v(n);
    for (double& x : v) x = dist(engine_);
    return v;
  }
  Vec uniform(size_t n, double lo, double hi) {
    std::uniform_real_distribution<double> dist(lo, hi);
    Vec v(n);
    for (double& x : v) x = dist(engine_);
    return v;
  }
  std::vector<int32_t> ints(size_t n, int32_t lo, int32_t hi_inclusive) {
    std::uniform_int_distribution<int32_t> dist(lo, hi_inclusive);
    std::vector<int32_t> v(n);
    for (int32_t& x : v) x = dist(engine_);
    return v;
  }
  // Up to `count` distinct indices in [0, n), always including the first and the last.
  std::vector<size_t> sample_indices(size_t n, size_t count) {
    std::vector<size_t> all(n);
    for (size_t i = 0; i < n; ++i) all[i] = i;
    if (n <= count) return all;
    std::shuffle(all.begin() + 1, all.end() - 1, engine_);
    std::vector<size_t> picked{0, n - 1};
    picked.insert(picked.end(), all.begin() + 1, all.begin() + 1 + (count - 2));
    std::sort(picked.begin(), picked.end());
    return picked;
  }
  std::mt19937_64& engine() { return engine_; }

 private:
  std::mt19937_64 engine_;
};

inline double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

inline Vec difference(const Vec& a, const Vec& b) {
  Vec d(a.size());
  for (size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  return d;
}

// Central difference of objective() in the element *x, which is restored afterwards.
template <typename Objective>
double central_difference(double* x, Objective&& objective, double h = kFiniteDifferenceStep) {
  const double x0 = *x;
  *x = x0 + h;
  const double plus = objective();
  *x = x0 - h;
  const double minus = objective();
  *x = x0;
  return (plus - minus) / (2 * h);
}

// Numerical gradient of objective() with respect to x[indices] (every element of x when
// indices is empty).
template <typename Objective>
Vec numerical_gradient(double* x, size_t n, Objective&& objective,
                       const std::vector<size_t>& indices = {}) {
  Vec g;
  if (indices.empty()) {
    g.resize(n);
    for (size_t i = 0; i < n; ++i) g[i] = central_difference(x + i, objective);
  } else {
    g.reserve(indices.size());
    for (size_t i : indices) g.push_back(central_difference(x + i, objective));
  }
  return g;
}
template <typename Objective>
Vec numerical_gradient(Vec& x, Objective&& objective) {
  return numerical_gradient(x.data(), x.size(), objective);
}

// Floor of the denominator below; raise it where a gradient is exactly zero by symmetry.
constexpr double kTinyGradient = 1e-12;

// max|a - n| / max(max|n|, floor): one number per tensor, insensitive to the elements whose
// gradient happens to be near zero.
inline double relative_error(const Vec& analytic, const Vec& numeric,
                             double floor = kTinyGradient) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < numeric.size(); ++i) {
    const double d = std::abs(analytic[i] - numeric[i]);
    if (!std::isfinite(d)) return std::numeric_limits<double>::infinity();  // NaN or inf
    diff = std::max(diff, d);
    scale = std::max(scale, std::abs(numeric[i]));
  }
  return diff / std::max(scale, floor);
}

// Gradients agree to `tolerance`; the error is recorded as a test property (visible with
// --gtest_output=xml) so the achieved accuracy can be reported.
inline ::testing::AssertionResult gradients_match(const std::string& name, const Vec& analytic,
                                                  const Vec& numeric,
                                                  double tolerance = kGradientTolerance,
                                                  double floor = kTinyGradient) {
  if (analytic.size() != numeric.size())
    return ::testing::AssertionFailure() << name << ": " << analytic.size() << " analytical vs "
                                         << numeric.size() << " numerical values";
  const double err = relative_error(analytic, numeric, floor);
  std::ostringstream value;
  value << err;
  ::testing::Test::RecordProperty("relative_error:" + name, value.str());
  if (err <= tolerance) return ::testing::AssertionSuccess();
  double scale = 0;
  for (double n : numeric) scale = std::max(scale, std::abs(n));
  auto failure = ::testing::AssertionFailure();
  failure << name << ": relative error " << err << " exceeds " << tolerance << "\n";
  size_t shown = 0;
  for (size_t i = 0; i < numeric.size() && shown < 8; ++i) {
    if (std::abs(analytic[i] - numeric[i]) <= tolerance * std::max(scale, floor)) continue;
    failure << "  [" << i << "] analytical " << analytic[i] << " numerical " << numeric[i] << "\n";
    ++shown;
  }
  return failure;
}

// The CPU attention's backward against float64 finite differences of its forward, for the
// shape (and, with d.dropout, the mask key) in d. The gradients start as junk: the backward
// must overwrite them.
inline void check_attention(const ops::AttentionDims& d, uint64_t seed) {
  const size_t N = size_t(d.batch) * d.seq;
  TestRng rng(seed);
  Vec q = rng.normal(N * d.heads * d.head_dim), k = rng.normal(N * d.groups * d.head_dim),
      v = rng.normal(N * d.groups * d.v_dim());
  const Vec dout = rng.normal(N * d.heads * d.v_dim());
  Vec out(dout.size()), lse(size_t(d.batch) * d.heads * d.seq);
  auto objective = [&] {
    ops::attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), d);
    return dot(dout, out);
  };
  objective();
  constexpr double kJunk = 7.0;
  Vec dq(q.size(), kJunk), dk(k.size(), kJunk), dv(v.size(), kJunk);
  ops::attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), out.data(), lse.data(),
                          q.data(), k.data(), v.data(), d);
  EXPECT_TRUE(gradients_match("dq", dq, numerical_gradient(q, objective)));
  EXPECT_TRUE(gradients_match("dk", dk, numerical_gradient(k, objective)));
  EXPECT_TRUE(gradients_match("dv", dv, numerical_gradient(v, objective)));
}

// Small enough to check every tensor, large enough that every path carries gradient.
inline TransformerConfig tiny_gpt2() {
  TransformerConfig c;
  c.num_layers = 2;
  c.hidden_size = 16;
  c.num_attention_heads = 4;
  c.ffn_hidden_size = 32;
  c.seq_length = 5;
  c.vocab_size = 11;
  c.make_vocab_size_divisible_by = 8;  // padded to 16: five rows outside the softmax
  c.init_method_std = 0.2;
  return c;  // LayerNorm, learned positions, GELU, biases, tied output layer
}

inline TransformerConfig tiny_llama() {
  TransformerConfig c = tiny_gpt2();
  c.normalization = Normalization::RMSNorm;
  c.position_embedding_type = PositionEmbedding::Rope;
  c.swiglu = true;
  c.ffn_hidden_size = 24;
  c.group_query_attention = true;
  c.num_query_groups = 2;
  c.add_bias_linear = false;
  c.untie_embeddings_and_output_weights = true;
  return c;
}

}  // namespace omni::gradient_check
