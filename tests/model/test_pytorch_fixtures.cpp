// The golden test against PyTorch: GPTModel<float> and GPTModel<double>, loaded with the
// parameters of tests/fixtures/<config>.fixture, reproduce what an independent float64
// PyTorch implementation (tests/fixtures/make_fixtures.py, which documents the format)
// computed for them: the logits, the loss, every parameter's gradient, and the losses and
// per-tensor updates of five AdamW steps.
//
// Errors are max|ours - torch| / max|torch| per tensor. The fixtures' parameters are
// float32 values, so the float model starts from exactly the reference weights and its
// error is fp32 arithmetic alone. Each test prints its worst error, so the accuracy
// actually achieved can be quoted.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "config/options.h"
#include "model/gpt_model.h"
#include "optim/optimizer.h"

namespace omni {
namespace {

static_assert(std::endian::native == std::endian::little, "fixtures hold little-endian float64");

const char* const kFixtures[] = {
    "gpt2_tiny",         "llama_tiny", "qwen_tiny", "layernorm_rope_tiny", "rope_variants_tiny",
    "gpt_erf_gelu_tiny", "mla_tiny",   "mtp_tiny",  "mtp_moe_tiny"};

// ---- Reading a fixture -------------------------------------------------------------------

struct Array {
  Shape shape;
  std::vector<double> data;
};

struct Fixture {
  std::string name;
  std::vector<std::string> flags;
  std::vector<std::string> order;  // array names in file order
  std::map<std::string, Array> arrays;

  const Array& at(const std::string& key) const {
    auto it = arrays.find(key);
    if (it == arrays.end())
      throw std::runtime_error("fixture " + name + " has no array '" + key + "'");
    return it->second;
  }
  std::vector<std::string> names_with_prefix(const std::string& prefix) const {
    std::vector<std::string> out;
    for (const std::string& n : order)
      if (n.rfind(prefix, 0) == 0) out.push_back(n.substr(prefix.size()));
    return out;
  }
};

Fixture read_fixture(const std::string& name) {
  const std::string path = std::string(OMNITRON_FIXTURE_DIR) + "/" + name + ".fixture";
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw std::runtime_error("cannot open " + path +
                             " (make it with /usr/bin/python3 tests/fixtures/make_fixtures.py)");
  Fixture f;
  std::string line;
  std::getline(in, line);
  if (line != "omnitron-fixture 1") throw std::runtime_error(path + ": not a format-1 fixture");
  while (std::getline(in, line) && line != "end") {
    std::istringstream ls(line);
    std::string key;
    ls >> key;
    if (key == "name") {
      ls >> f.name;
    } else if (key == "flags") {
      for (std::string flag; ls >> flag;) f.flags.push_back(flag);
    } else if (key == "array") {
      std::string array_name;
      int ndim = 0;
      ls >> array_name >> ndim;
      Array a;
      int64_t numel = 1;
      for (int d = 0; d < ndim; ++d) {
        int64_t extent = 0;
        ls >> extent;
        a.shape.push_back(extent);
        numel *= extent;
      }
      a.data.resize(numel);
      f.order.push_back(array_name);
      f.arrays.emplace(array_name, std::move(a));
    } else {
      throw std::runtime_error(path + ": unexpected header line '" + line + "'");
    }
  }
  if (line != "end") throw std::runtime_error(path + ": header has no 'end' line");
  for (const std::string& n : f.order) {
    std::vector<double>& d = f.arrays[n].data;
    in.read(reinterpret_cast<char*>(d.data()), std::streamsize(d.size() * sizeof(double)));
    if (!in) throw std::runtime_error(path + ": data ends inside array '" + n + "'");
  }
  if (in.peek() != std::char_traits<char>::eof())
    throw std::runtime_error(path + ": bytes left after the last array");
  return f;
}

// Fixtures are read once per process: every test of a configuration shares it.
const Fixture& fixture(const std::string& name) {
  static std::map<std::string, Fixture> cache;
  auto it = cache.find(name);
  if (it == cache.end()) it = cache.emplace(name, read_fixture(name)).first;
  return it->second;
}

// ---- The model under test, loaded with the fixture -----------------------------------

template <typename T>
struct LoadedModel {
  using value_type = T;
  Options opts;
  std::unique_ptr<GPTModel<T>> model;
  std::vector<int32_t> tokens, labels;
  std::vector<float> mask;
  int batch = 0, seq = 0;

  MicroBatch micro_batch() const {
    return MicroBatch{tokens.data(), labels.data(), mask.data(), batch, seq};
  }
};

template <typename T>
LoadedModel<T> load_model(const Fixture& f) {
  LoadedModel<T> m;
  parse_options(f.flags, m.opts);
  finalize(m.opts);
  // The PyTorch references run without dropout (Megatron's default of 0.1 is ours too).
  m.opts.model.hidden_dropout = m.opts.model.attention_dropout = 0;
  const Array& tokens = f.at("tokens");
  m.batch = int(tokens.shape.at(0));
  m.seq = int(tokens.shape.at(1));
  m.model = std::make_unique<GPTModel<T>>(m.opts.model, m.batch, /*seed=*/1);
  for (const ParamInfo& p : m.model->params().infos()) {
    const Array& value = f.at("param/" + p.name);
    if (value.shape != p.shape)
      throw std::runtime_error(p.name + ": model shape " + shape_str(p.shape) + ", fixture " +
                               shape_str(value.shape));
    std::transform(value.data.begin(), value.data.end(), m.model->params().value(p.name),
                   [](double v) { return T(v); });
  }
  for (double t : tokens.data) m.tokens.push_back(int32_t(t));
  for (double l : f.at("labels").data) m.labels.push_back(int32_t(l));
  for (double w : f.at("loss_mask").data) m.mask.push_back(float(w));
  return m;
}

// ---- Comparison --------------------------------------------------------------------------

template <typename T>
double relative_error(const T* ours, const std::vector<double>& torch) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < torch.size(); ++i) {
    diff = std::max(diff, std::abs(double(ours[i]) - torch[i]));
    scale = std::max(scale, std::abs(torch[i]));
  }
  return scale > 0 ? diff / scale : diff;
}

double relative_error(double ours, double torch) {
  return std::abs(ours - torch) / std::abs(torch);
}

// Tolerances per quantity: float64 agrees to rounding (~1e-15 here, with margin for the
// optimizer steps); float32 to its own rounding accumulated over two or three layers.
struct Tolerances {
  double logits, loss, grads, steps;
};
template <typename T>
constexpr Tolerances kTolerance = std::is_same_v<T, double> ? Tolerances{1e-10, 1e-10, 1e-10, 1e-10}
                                                            : Tolerances{1e-5, 1e-5, 1e-5, 1e-5};

template <typename T>
const char* dtype_label() {
  return std::is_same_v<T, double> ? "float64" : "float32";
}

// Prints and records the worst error of one quantity, then checks it.
template <typename T>
void expect_within(const std::string& config, const std::string& quantity, double err,
                   const std::string& worst_tensor, double tolerance) {
  std::printf("[ PYTORCH  ] %-20s %s %-13s worst relative error %.3g%s (tolerance %.0e)\n",
              config.c_str(), dtype_label<T>(), quantity.c_str(), err,
              worst_tensor.empty() ? "" : (" in " + worst_tensor).c_str(), tolerance);
  std::ostringstream value;
  value << err;
  ::testing::Test::RecordProperty("relative_error:" + quantity, value.str());
  EXPECT_LE(err, tolerance) << config << " " << dtype_label<T>() << " " << quantity
                            << (worst_tensor.empty() ? "" : " in " + worst_tensor);
}

// The optimizer from the fixture's flags, for `steps` steps at constant lr with no clipping;
// returns the loss before each step and after the last.
template <typename T>
std::vector<double> run_adamw(LoadedModel<T>& m, int steps) {
  EXPECT_EQ(m.opts.optim.kind, OptimizerKind::AdamW);
  EXPECT_EQ(m.opts.optim.clip_grad, 0.0);
  EXPECT_EQ(m.opts.lr_decay_style, "constant");
  ParameterSet<T>& params = m.model->params();
  Optimizer<T> optimizer(m.opts.optim, params);
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) {
    params.zero_grads();
    losses.push_back(m.model->forward_backward(m.micro_batch(), 1.0));
    optimizer.step(params, m.opts.lr);
  }
  losses.push_back(m.model->forward_loss(m.micro_batch()));
  return losses;
}

// ---- Tests -------------------------------------------------------------------------------

enum class Precision { F32, F64 };
struct Case {
  std::string config;
  Precision precision;
};

// Names the case in CTest's listing instead of gtest's byte dump.
void PrintTo(const Case& c, std::ostream* os) {
  *os << c.config << (c.precision == Precision::F64 ? " float64" : " float32");
}

class PyTorchFixture : public ::testing::TestWithParam<Case> {
 protected:
  const Fixture& fix() const { return fixture(GetParam().config); }
  const std::string& config() const { return GetParam().config; }
  // Runs check<float> or check<double> for this case's precision.
  template <typename Check>
  void for_precision(Check&& check) {
    if (GetParam().precision == Precision::F64)
      check(load_model<double>(fix()));
    else
      check(load_model<float>(fix()));
  }
};

TEST_P(PyTorchFixture, ParameterLayoutMatchesPyTorch) {
  for_precision([&](auto m) {
    const std::vector<std::string> names = fix().names_with_prefix("param/");
    const std::vector<ParamInfo>& infos = m.model->params().infos();
    ASSERT_EQ(infos.size(), names.size());
    for (size_t i = 0; i < infos.size(); ++i) {
      EXPECT_EQ(infos[i].name, names[i]) << "parameter " << i;
      EXPECT_EQ(infos[i].shape, fix().at("param/" + names[i]).shape) << names[i];
    }
  });
}

TEST_P(PyTorchFixture, LogitsMatchPyTorch) {
  for_precision([&](auto m) {
    using T = typename decltype(m)::value_type;
    const Array& expected = fix().at("logits");
    const std::vector<T> logits = m.model->forward_logits(m.tokens.data(), m.batch, m.seq);
    ASSERT_EQ(logits.size(), expected.data.size());
    expect_within<T>(config(), "logits", relative_error(logits.data(), expected.data), "",
                     kTolerance<T>.logits);
  });
}

// Attention is causal: a batch of the first few tokens of each sequence gives the first rows
// of the full sequences' logits (and runs with fewer tokens than --seq-length).
TEST_P(PyTorchFixture, PrefixLogitsMatchPyTorch) {
  for_precision([&](auto m) {
    using T = typename decltype(m)::value_type;
    const int prefix = m.seq / 2 + 1;
    std::vector<int32_t> tokens;
    std::vector<double> expected;
    const std::vector<double>& full = fix().at("logits").data;
    const size_t vocab = full.size() / (size_t(m.batch) * m.seq);
    for (int b = 0; b < m.batch; ++b)
      for (int s = 0; s < prefix; ++s) {
        tokens.push_back(m.tokens[size_t(b) * m.seq + s]);
        const size_t row = size_t(b) * m.seq + s;
        expected.insert(expected.end(), full.begin() + row * vocab,
                        full.begin() + (row + 1) * vocab);
      }
    const std::vector<T> logits = m.model->forward_logits(tokens.data(), m.batch, prefix);
    ASSERT_EQ(logits.size(), expected.size());
    expect_within<T>(config(), "prefix logits", relative_error(logits.data(), expected), "",
                     kTolerance<T>.logits);
  });
}

TEST_P(PyTorchFixture, TrainingLossMatchesPyTorch) {
  for_precision([&](auto m) {
    using T = typename decltype(m)::value_type;
    const double loss = m.model->forward_backward(m.micro_batch(), 1.0);
    expect_within<T>(config(), "loss", relative_error(loss, fix().at("loss").data[0]), "",
                     kTolerance<T>.loss);
  });
}

TEST_P(PyTorchFixture, EvalLossMatchesPyTorch) {
  for_precision([&](auto m) {
    using T = typename decltype(m)::value_type;
    const double loss = m.model->forward_loss(m.micro_batch());
    expect_within<T>(config(), "eval loss", relative_error(loss, fix().at("loss").data[0]), "",
                     kTolerance<T>.loss);
  });
}

TEST_P(PyTorchFixture, EveryParameterGradientMatchesPyTorch) {
  for_precision([&](auto m) {
    using T = typename decltype(m)::value_type;
    ParameterSet<T>& params = m.model->params();
    params.zero_grads();
    m.model->forward_backward(m.micro_batch(), 1.0);
    double worst = 0;
    std::string worst_name;
    for (const ParamInfo& p : params.infos()) {
      const double err = relative_error(params.grad(p.name), fix().at("grad/" + p.name).data);
      EXPECT_LE(err, kTolerance<T>.grads) << "gradient of " << p.name;
      if (err >= worst) worst = err, worst_name = p.name;
    }
    expect_within<T>(config(), "grads", worst, worst_name, kTolerance<T>.grads);
  });
}

// Gradient accumulation: two micro-batches with grad_scale 1/2 each add up to the gradient.
TEST_P(PyTorchFixture, HalfScaledGradientsAccumulateToPyTorch) {
  for_precision([&](auto m) {
    using T = typename decltype(m)::value_type;
    ParameterSet<T>& params = m.model->params();
    params.zero_grads();
    m.model->forward_backward(m.micro_batch(), 0.5);
    m.model->forward_backward(m.micro_batch(), 0.5);
    double worst = 0;
    std::string worst_name;
    for (const ParamInfo& p : params.infos()) {
      const double err = relative_error(params.grad(p.name), fix().at("grad/" + p.name).data);
      EXPECT_LE(err, kTolerance<T>.grads) << "accumulated gradient of " << p.name;
      if (err >= worst) worst = err, worst_name = p.name;
    }
    expect_within<T>(config(), "accum grads", worst, worst_name, kTolerance<T>.grads);
  });
}

TEST_P(PyTorchFixture, AdamWStepLossesMatchPyTorch) {
  for_precision([&](auto m) {
    using T = typename decltype(m)::value_type;
    const std::vector<double>& expected = fix().at("adamw/losses").data;
    const std::vector<double> losses = run_adamw(m, int(expected.size()) - 1);
    double worst = 0;
    for (size_t s = 0; s < expected.size(); ++s) {
      const double err = relative_error(losses[s], expected[s]);
      EXPECT_LE(err, kTolerance<T>.steps)
          << "loss after " << s << " steps: ours " << losses[s] << ", torch " << expected[s];
      worst = std::max(worst, err);
    }
    expect_within<T>(config(), "step losses", worst, "", kTolerance<T>.steps);
  });
}

// Which elements' updates a model of type T is compared on: all of them in float64; in
// float32 not those whose float64 gradient is rounding noise of an exact zero
// (0 < |g| <= 1e-9 max|g| of the tensor, make_fixtures.py's resolved_elements): fp32 computes
// such a gradient as noise of either sign, which Adam's normalisation turns into steps of up
// to lr. In these fixtures that is the key part of gpt2_tiny's QKV bias (a key bias adds
// q.b_k to every score of a row, which softmax ignores); the loss does not depend on it.
template <typename T>
std::vector<bool> compared_elements(const std::vector<double>& reference_grad) {
  constexpr double kRoundingNoise = 1e-9;
  double scale = 0;
  for (double g : reference_grad) scale = std::max(scale, std::abs(g));
  std::vector<bool> keep(reference_grad.size(), true);
  if (std::is_same_v<T, float>)
    for (size_t i = 0; i < keep.size(); ++i)
      keep[i] = reference_grad[i] == 0 || std::abs(reference_grad[i]) > kRoundingNoise * scale;
  return keep;
}

// ||w_after - w_before|| per tensor: weight decay on the right tensors only, bias
// correction and epsilon all show here even where the loss hardly moves.
TEST_P(PyTorchFixture, AdamWUpdatesMatchPyTorch) {
  for_precision([&](auto m) {
    using T = typename decltype(m)::value_type;
    ParameterSet<T>& params = m.model->params();
    const std::vector<T> before(params.values(), params.values() + params.size());
    run_adamw(m, int(fix().at("adamw/losses").data.size()) - 1);
    const std::string reference =
        std::is_same_v<T, double> ? "adamw/update_norm/" : "adamw/update_norm_resolved/";
    double worst = 0;
    std::string worst_name;
    for (const ParamInfo& p : params.infos()) {
      const std::vector<bool> keep = compared_elements<T>(fix().at("grad/" + p.name).data);
      double sq = 0;
      for (int64_t i = 0; i < p.numel; ++i) {
        const double d = double(params.values()[p.offset + i]) - double(before[p.offset + i]);
        if (keep[i]) sq += d * d;
      }
      const double expected = fix().at(reference + p.name).data[0];
      const double err = relative_error(std::sqrt(sq), expected);
      EXPECT_LE(err, kTolerance<T>.steps)
          << "AdamW update of " << p.name << ": ours " << std::sqrt(sq) << ", torch " << expected;
      if (err >= worst) worst = err, worst_name = p.name;
    }
    expect_within<T>(config(), "step updates", worst, worst_name, kTolerance<T>.steps);
  });
}

// A second forward/backward of the same batch gives bit-identical loss and gradients.
TEST_P(PyTorchFixture, RepeatedForwardBackwardIsBitwiseIdentical) {
  for_precision([&](auto m) {
    using T = typename decltype(m)::value_type;
    ParameterSet<T>& params = m.model->params();
    params.zero_grads();
    const double first = m.model->forward_backward(m.micro_batch(), 1.0);
    const std::vector<T> grads(params.grads(), params.grads() + params.size());
    params.zero_grads();
    const double second = m.model->forward_backward(m.micro_batch(), 1.0);
    EXPECT_EQ(std::memcmp(&first, &second, sizeof(double)), 0);
    EXPECT_EQ(std::memcmp(grads.data(), params.grads(), grads.size() * sizeof(T)), 0);
  });
}

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (const char* name : kFixtures)
    for (Precision p : {Precision::F32, Precision::F64}) cases.push_back({name, p});
  return cases;
}

// Multi-token prediction (make_mtp_fixtures.py): the losses above are the main model's and the
// gradients the whole objective's; here each depth's own loss (Megatron's "mtp_<k> loss").
// mtp_moe_tiny: one depth whose layer is an MoE layer, with learned absolute positions.
TEST(PyTorchFixtureMTP, EveryDepthLossMatchesPyTorch) {
  for (const char* name : {"mtp_tiny", "mtp_moe_tiny"}) {
    SCOPED_TRACE(name);
    auto m = load_model<double>(fixture(name));
    const std::vector<double>& expected = fixture(name).at("mtp/losses").data;
    m.model->forward_backward(m.micro_batch(), 1.0);
    const std::vector<double> losses = m.model->take_mtp_losses();
    ASSERT_EQ(losses.size(), expected.size());
    for (size_t k = 0; k < expected.size(); ++k)
      EXPECT_LE(relative_error(losses[k], expected[k]), 1e-12) << "mtp_" << k + 1 << " loss";
    for (double l : m.model->take_mtp_losses()) EXPECT_EQ(l, 0.0);  // taken: restarted
  }
  // The MoE fixture's depth runs an MoE layer (the last decoder layer's kind).
  auto moe = load_model<double>(fixture("mtp_moe_tiny"));
  EXPECT_TRUE(moe.model->params().has("mtp.layers.0.mtp_model_layer.mlp.router.weight"));
  EXPECT_TRUE(moe.model->params().has("embedding.position_embeddings.weight"));
}

INSTANTIATE_TEST_SUITE_P(AllConfigs, PyTorchFixture, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.config + (info.param.precision == Precision::F64
                                                           ? "_float64"
                                                           : "_float32");
                         });

}  // namespace
}  // namespace omni
