// Dropout as Megatron has it (--hidden-dropout, --attention-dropout): the masks' keep rate and
// the 1/(1-p) scaling of what they keep, masks that are a pure function of their key (so the
// finite-difference checks of the model's gradient work with dropout on, and activation
// recompute draws the same masks), and evaluation without dropout. The parallel layouts with
// dropout on are in parallel/test_model_parallel.cpp, resume in checkpoint/test_checkpoint.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "backend/attention_backend.h"
#include "backend/dropout_mask.h"
#include "backend/ops.h"
#include "base/error.h"
#include "base/philox.h"
#include "config/options.h"
#include "gradient_check.h"
#include "model/gpt_model.h"

namespace omni {
namespace {

using gradient_check::check_attention;
using gradient_check::dot;
using gradient_check::gradients_match;
using gradient_check::numerical_gradient;
using gradient_check::TestRng;
using gradient_check::Vec;

TEST(DropoutMask, PhiloxIsBasesPhilox4x32) {
  for (uint32_t i = 0; i < 50; ++i) {
    const std::array<uint32_t, 4> c = {i * 2654435761u, i, ~i, i << 7};
    const std::array<uint32_t, 2> k = {0x1234567u + i, 0x89abcdefu - i};
    const auto want = philox4x32_10(c, k);
    const dropout::Block got = dropout::philox(c[0], c[1], c[2], c[3], k[0], k[1]);
    for (int w = 0; w < 4; ++w) ASSERT_EQ(got.w[w], want[w]) << "block " << i << " word " << w;
  }
}

// Zeros among n draws of a mask with drop probability p: within 5 standard deviations.
void expect_drop_rate(int64_t zeros, int64_t n, double p) {
  const double rate = double(zeros) / double(n), sigma = std::sqrt(p * (1 - p) / double(n));
  EXPECT_NEAR(rate, p, 5 * sigma) << zeros << " of " << n << " dropped";
}

TEST(HiddenDropout, DropsAFractionPAndScalesTheRestByOneOverOneMinusP) {
  for (double p : {0.1, 0.5}) {
    const int rows = 512, width = 256, seq = 64;
    ops::DropoutKey k = ops::dropout_key(p, 1234, 3, 1, ops::DropoutSite::MlpOutput);
    k.first_sample = 40;
    std::vector<float> x(size_t(rows) * width, 1.0f);
    ops::dropout(x.data(), rows, width, seq, k);
    int64_t zeros = 0;
    double sum = 0;
    const float kept = float(1.0 / (1.0 - p));
    for (float v : x) {
      if (v == 0.0f)
        ++zeros;
      else
        ASSERT_EQ(v, kept);
      sum += v;
    }
    expect_drop_rate(zeros, int64_t(x.size()), p);
    EXPECT_NEAR(sum / double(x.size()), 1.0, 0.02);  // the expectation is kept
  }
}

TEST(HiddenDropout, ZeroProbabilityChangesNothing) {
  std::vector<float> x = {1.5f, -2.0f, 3.25f, 0.5f};
  const std::vector<float> before = x;
  ops::dropout(x.data(), 1, 4, 1, ops::dropout_key(0.0, 1, 1, 0, ops::DropoutSite::Embedding));
  EXPECT_EQ(x, before);
}

// The mask of element (sample, position, channel): the same whatever rows a call covers.
TEST(HiddenDropout, AMaskDependsOnTheKeyNotOnHowRowsAreSplit) {
  const int rows = 16, width = 12, seq = 8;  // two sequences
  ops::DropoutKey k = ops::dropout_key(0.3, 99, 5, 2, ops::DropoutSite::AttentionOutput);
  k.first_sample = 10;
  std::vector<double> whole(size_t(rows) * width, 1.0), split = whole;
  ops::dropout(whole.data(), rows, width, seq, k);
  ops::DropoutKey second = k;
  second.first_row = 5;  // a rank holding rows 5.. (sequence parallel)
  ops::dropout(split.data(), 5, width, seq, k);
  ops::dropout(split.data() + 5 * width, rows - 5, width, seq, second);
  EXPECT_EQ(whole, split);
  // Another iteration, layer, site, sample or seed draws another mask.
  auto mask = [&](ops::DropoutKey key) {
    std::vector<double> x(size_t(rows) * width, 1.0);
    ops::dropout(x.data(), rows, width, seq, key);
    return x;
  };
  for (const ops::DropoutKey& other :
       {ops::dropout_key(0.3, 99, 6, 2, ops::DropoutSite::AttentionOutput),
        ops::dropout_key(0.3, 99, 5, 3, ops::DropoutSite::AttentionOutput),
        ops::dropout_key(0.3, 99, 5, 2, ops::DropoutSite::MlpOutput),
        ops::dropout_key(0.3, 98, 5, 2, ops::DropoutSite::AttentionOutput)}) {
    ops::DropoutKey o = other;
    o.first_sample = 10;
    EXPECT_NE(mask(o), whole);
  }
  ops::DropoutKey next_samples = k;
  next_samples.first_sample = 12;
  EXPECT_NE(mask(next_samples), whole);
}

// With q = 0 every visible key has probability 1/(i+1), and with v_j the one-hot e_j the
// output row is the row's probabilities after dropout: out[i][j] = z_ij / (i + 1).
TEST(AttentionDropout, DropsAFractionPOfTheProbabilitiesAndScalesTheRest) {
  const int B = 4, S = 64, H = 8;
  const double p = 0.1;
  ops::AttentionDims d{B, S, H, 1, S};
  d.dropout = ops::dropout_key(p, 7, 2, 0, ops::DropoutSite::Attention);
  std::vector<double> q(size_t(B) * S * H * S, 0.0), k(size_t(B) * S * S, 0.0), v = k;
  for (int b = 0; b < B; ++b)
    for (int j = 0; j < S; ++j) v[(size_t(b) * S + j) * S + j] = 1.0;
  std::vector<double> out(q.size()), lse(size_t(B) * H * S);
  ops::attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), d);
  int64_t zeros = 0, visible = 0;
  double worst = 0;
  for (int b = 0; b < B; ++b)
    for (int i = 0; i < S; ++i)
      for (int h = 0; h < H; ++h)
        for (int j = 0; j <= i; ++j) {
          const double o = out[((size_t(b) * S + i) * H + h) * S + j];
          ++visible;
          if (o == 0)
            ++zeros;
          else
            worst = std::max(worst, std::abs(o - 1.0 / (1.0 - p) / (i + 1)));
        }
  expect_drop_rate(zeros, visible, p);
  EXPECT_LT(worst, 1e-14);
  // lse is the softmax's, dropout or not: log(i + 1).
  EXPECT_NEAR(lse[S - 1], std::log(double(S)), 1e-12);
}

// The backward draws the mask again from the key: float64 finite differences of the forward
// with the same key.
void check_attention_dropout(ops::AttentionDims d, uint64_t seed) {
  d.dropout = ops::dropout_key(0.3, seed, 4, 1, ops::DropoutSite::Attention);
  d.dropout.first_sample = 3;
  check_attention(d, seed);
}

TEST(AttentionDropout, BackwardMatchesFiniteDifferences) {
  check_attention_dropout({2, 5, 4, 2, 4}, 31);
}
TEST(AttentionDropout, BackwardMatchesFiniteDifferencesAcrossTheRowBlockBoundary) {
  check_attention_dropout({1, 70, 2, 1, 2}, 32);
}

// The gradient checks' tiny models (gradient_check.h), one sequence position longer, with
// dropout on.
TransformerConfig tiny(bool llama) {
  TransformerConfig c = llama ? gradient_check::tiny_llama() : gradient_check::tiny_gpt2();
  c.seq_length = 6;
  c.hidden_dropout = 0.2;
  c.attention_dropout = 0.3;
  return c;
}

struct Batch {
  std::vector<int32_t> tokens, labels;
  MicroBatch mb;
};
Batch random_batch(const TransformerConfig& c, uint64_t seed) {
  TestRng rng(seed);
  const size_t n = size_t(2) * c.seq_length;
  Batch b{rng.ints(n, 0, c.vocab_size - 1), rng.ints(n, 0, c.vocab_size - 1), {}};
  b.mb = MicroBatch{b.tokens.data(), b.labels.data(), nullptr, 2, c.seq_length};
  b.mb.first_sample = 6, b.mb.iteration = 4;
  return b;
}

// A training forward (dropout on) without the backward. (It prepares the output layer's and
// final norm's gradients, of grad_scale 0: adds zeros.)
template <typename T>
double training_loss(GPTModel<T>& m, const MicroBatch& mb) {
  double loss = 0;
  m.chunk_forward(0, 0, mb, nullptr, true, 0.0, &loss);
  return loss;
}

// Every parameter's gradient with dropout on against float64 central differences of the
// training loss, whose masks the key fixes.
void check_model_gradients(bool llama) {
  const TransformerConfig cfg = tiny(llama);
  GPTModel<double> model(cfg, 2, 17);
  ParameterSet<double>& params = model.params();
  const Batch batch = random_batch(cfg, 5);
  const double loss = model.forward_backward(batch.mb, 1.0);
  EXPECT_EQ(loss, training_loss(model, batch.mb));                 // the same masks every time
  EXPECT_GT(std::abs(loss - model.forward_loss(batch.mb)), 1e-3);  // and dropout is on
  TestRng rng(8);
  double largest = 0;
  for (int64_t i = 0; i < params.size(); ++i)
    largest = std::max(largest, std::abs(params.grads()[i]));
  auto objective = [&] { return training_loss(model, batch.mb); };
  for (const ParamInfo& p : params.infos()) {
    const std::vector<size_t> picked = rng.sample_indices(p.numel, 8);
    Vec analytic;
    for (size_t i : picked) analytic.push_back(params.grads()[p.offset + i]);
    EXPECT_TRUE(gradients_match(
        p.name, analytic, numerical_gradient(params.value(p.name), p.numel, objective, picked),
        gradient_check::kGradientTolerance, 1e-6 * largest));
  }
}

TEST(DropoutModelGradient, MatchesFiniteDifferencesForGpt2) {
  check_model_gradients(false);
}
TEST(DropoutModelGradient, MatchesFiniteDifferencesForLlama) {
  check_model_gradients(true);
}

// Evaluation and generation run without dropout: the same losses and logits as the model
// with dropout 0.
TEST(Dropout, EvaluationAndLogitsRunWithoutIt) {
  TransformerConfig with = tiny(false), without = with;
  without.hidden_dropout = without.attention_dropout = 0;
  GPTModel<double> a(with, 2, 17), b(without, 2, 17);
  const Batch batch = random_batch(with, 6);
  EXPECT_EQ(a.forward_loss(batch.mb), b.forward_loss(batch.mb));
  EXPECT_EQ(a.forward_logits(batch.tokens.data(), 2, with.seq_length),
            b.forward_logits(batch.tokens.data(), 2, with.seq_length));
  EXPECT_NE(training_loss(a, batch.mb), training_loss(b, batch.mb));
}

// Full recompute runs each layer's forward again before its backward: the same masks, so
// the same bits.
TEST(Dropout, FullRecomputeGivesBitIdenticalGradients) {
  const TransformerConfig cfg = tiny(true);
  const Batch batch = random_batch(cfg, 7);
  auto grads = [&](Recompute::Granularity g) {
    GPTModel<float> m(cfg, 2, 17);
    m.set_recompute({g, 0});
    const double loss = m.forward_backward(batch.mb, 1.0);
    std::vector<float> out(m.params().grads(), m.params().grads() + m.params().size());
    out.push_back(float(loss));
    return out;
  };
  const std::vector<float> kept = grads(Recompute::None), again = grads(Recompute::Full);
  ASSERT_EQ(kept.size(), again.size());
  EXPECT_EQ(std::memcmp(kept.data(), again.data(), kept.size() * sizeof(float)), 0);
}

// cuDNN's fused attention draws its own dropout masks: with attention dropout the GPU runs
// our flash kernel, and the start-up line says why; asking for fused is an error naming it.
TEST(AttentionDropout, RunsOurFlashKernelNotCudnnsAndSaysWhy) {
  ops::AttentionDims d{2, 128, 8, 8, 64};
  d.dropout.p = 0.1;
  std::string why;
  EXPECT_EQ(choose_attention_backend("auto", true, d, DType::BF16, &why), AttentionBackend::Flash);
  EXPECT_NE(why.find("attention dropout draws omnitron's Philox masks"), std::string::npos) << why;
  try {
    choose_attention_backend("fused", true, d, DType::BF16, nullptr);
    ADD_FAILURE() << "fused attention with dropout was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("attention dropout"), std::string::npos) << e.what();
  }
}

TEST(DropoutOptions, AProbabilityOutsideZeroToOneIsAnErrorNamingTheFlag) {
  for (const char* flag : {"--hidden-dropout", "--attention-dropout"}) {
    for (const char* value : {"1", "-0.1"}) {
      Options o;
      parse_options({"--mock-data", "--vocab-size", "64", flag, value}, o);
      try {
        finalize(o);
        ADD_FAILURE() << flag << " " << value << " was accepted";
      } catch (const UsageError& e) {
        EXPECT_EQ(std::string(e.what()).find(std::string(flag) + " must be in [0, 1)"), 0u)
            << e.what();
      }
    }
  }
  Options o;
  parse_options({"--mock-data", "--vocab-size", "64", "--hidden-dropout", "0.1",
                 "--attention-dropout", "0.2"},
                o);
  finalize(o);
  EXPECT_EQ(o.model.hidden_dropout, 0.1);
  EXPECT_EQ(o.model.attention_dropout, 0.2);
}

}  // namespace
}  // namespace omni
