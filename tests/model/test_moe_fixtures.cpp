// One MoE layer against an independent float64 PyTorch implementation of Megatron-Core's
// formulas (tests/fixtures/make_moe_fixtures.py, which documents the format): router logits,
// the routing probabilities after capacity, rows per expert and drops, the output, the aux
// and z losses, and the gradients of sum(dy * y) + aux_grad_scale * (aux + z) with respect to
// the input and every parameter, in double and in float.
// Errors are max|ours - torch| / max|torch| per tensor.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/moe_layer.h"

namespace omni {
namespace {

static_assert(std::endian::native == std::endian::little, "fixtures hold little-endian float64");

const char* const kFixtures[] = {"moe_mixtral_tiny", "moe_deepseek_tiny", "moe_capacity_probs_tiny",
                                 "moe_pad_position_tiny"};

struct Fixture {
  std::string flags;
  std::map<std::string, std::vector<double>> arrays;
  const std::vector<double>& at(const std::string& key) const {
    auto it = arrays.find(key);
    if (it == arrays.end()) throw std::runtime_error("the fixture has no array '" + key + "'");
    return it->second;
  }
  bool has(const std::string& key) const { return arrays.count(key) > 0; }
};

Fixture read_fixture(const std::string& name) {
  const std::string path = std::string(OMNITRON_FIXTURE_DIR) + "/" + name + ".fixture";
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw std::runtime_error(
        "cannot open " + path +
        " (make it with /usr/bin/python3 tests/fixtures/make_moe_fixtures.py)");
  Fixture f;
  std::vector<std::pair<std::string, size_t>> order;
  std::string line;
  while (std::getline(in, line) && line != "end") {
    std::istringstream s(line);
    std::string word;
    s >> word;
    if (word == "flags") {
      std::getline(s, f.flags);
    } else if (word == "array") {
      std::string key;
      int ndim = 0;
      s >> key >> ndim;
      size_t n = 1;
      for (int d = 0; d < ndim; ++d) {
        size_t dim = 0;
        s >> dim;
        n *= dim;
      }
      order.emplace_back(key, n);
    }
  }
  for (const auto& [key, n] : order) {
    std::vector<double> v(n);
    in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n * sizeof(double)));
    if (!in) throw std::runtime_error(path + ": truncated at array " + key);
    f.arrays[key] = std::move(v);
  }
  return f;
}

// The layer's Megatron flags (the fixture's "flags" line) into a TransformerConfig; the
// micro-batch size into *batch.
TransformerConfig config_from_flags(const std::string& flags, int* batch) {
  TransformerConfig c;
  std::istringstream s(flags);
  std::string flag;
  auto next = [&] {
    std::string v;
    s >> v;
    return v;
  };
  while (s >> flag) {
    if (flag == "--hidden-size")
      c.hidden_size = std::stoi(next());
    else if (flag == "--num-experts")
      c.num_moe_experts = std::stoi(next());
    else if (flag == "--moe-router-topk")
      c.moe_router_topk = std::stoi(next());
    else if (flag == "--moe-ffn-hidden-size")
      c.moe_ffn_hidden_size = std::stoi(next());
    else if (flag == "--seq-length")
      c.seq_length = std::stoi(next());
    else if (flag == "--micro-batch-size")
      *batch = std::stoi(next());
    else if (flag == "--moe-grouped-gemm")
      c.moe_grouped_gemm = true;
    else if (flag == "--moe-router-score-function")
      c.moe_router_score_function =
          next() == "sigmoid" ? MoEScoreFunction::Sigmoid : MoEScoreFunction::Softmax;
    else if (flag == "--moe-router-load-balancing-type") {
      const std::string v = next();
      c.moe_router_load_balancing_type = v == "aux_loss"       ? MoELoadBalancing::AuxLoss
                                         : v == "seq_aux_loss" ? MoELoadBalancing::SeqAuxLoss
                                                               : MoELoadBalancing::None;
    } else if (flag == "--moe-aux-loss-coeff")
      c.moe_aux_loss_coeff = std::stod(next());
    else if (flag == "--swiglu")
      c.swiglu = true;
    else if (flag == "--openai-gelu")
      c.openai_gelu = true;
    else if (flag == "--disable-bias-linear")
      c.add_bias_linear = false;
    else if (flag == "--moe-router-pre-softmax")
      c.moe_router_pre_softmax = true;
    else if (flag == "--moe-router-topk-scaling-factor")
      c.moe_router_topk_scaling_factor = std::stod(next());
    else if (flag == "--moe-router-num-groups")
      c.moe_router_num_groups = std::stoi(next());
    else if (flag == "--moe-router-group-topk")
      c.moe_router_group_topk = std::stoi(next());
    else if (flag == "--moe-router-enable-expert-bias")
      c.moe_router_enable_expert_bias = true;
    else if (flag == "--moe-z-loss-coeff")
      c.moe_z_loss_coeff = std::stod(next());
    else if (flag == "--moe-expert-capacity-factor")
      c.moe_expert_capacity_factor = std::stod(next());
    else if (flag == "--moe-token-drop-policy")
      c.moe_token_drop_policy =
          next() == "position" ? MoETokenDropPolicy::Position : MoETokenDropPolicy::Probs;
    else if (flag == "--moe-pad-expert-input-to-capacity")
      c.moe_pad_expert_input_to_capacity = true;
    else if (flag == "--moe-shared-expert-intermediate-size")
      c.moe_shared_expert_intermediate_size = std::stoi(next());
    else if (flag == "--moe-shared-expert-gate")
      c.moe_shared_expert_gate = true;
    else
      throw std::runtime_error("the fixture's flags hold " + flag +
                               ", which the test does not read");
  }
  return c;
}

double relative_error(const std::vector<double>& ours, const std::vector<double>& ref) {
  if (ours.size() != ref.size()) return INFINITY;
  double diff = 0, scale = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    diff = std::max(diff, std::abs(ours[i] - ref[i]));
    scale = std::max(scale, std::abs(ref[i]));
  }
  return diff / std::max(scale, 1e-300);
}

template <typename T>
std::vector<double> to_double(const std::vector<T>& v) {
  return {v.begin(), v.end()};
}

// Everything the layer computes for a fixture, as doubles.
struct Result {
  std::map<std::string, std::vector<double>> arrays;
  std::vector<MoEParamInfo> layout;
};

template <typename T>
Result run_layer(const Fixture& f) {
  int batch = 1;
  const TransformerConfig c = config_from_flags(f.flags, &batch);
  const int N = batch * c.seq_length, E = c.num_moe_experts;
  const int K = c.moe_router_topk;
  Result r;
  r.layout = moe_parameter_layout(c);
  const size_t count = static_cast<size_t>(moe_parameter_count(c));
  std::vector<T> params(count, T(0)), grads(count, T(0));
  for (const MoEParamInfo& p : r.layout) {
    const std::vector<double>& v = f.at("param/" + p.name);
    if (static_cast<int64_t>(v.size()) != p.numel())
      throw std::runtime_error(p.name + ": the fixture's size differs from the layer's");
    std::copy(v.begin(), v.end(), params.begin() + p.offset);
  }
  const std::vector<T> x(f.at("x").begin(), f.at("x").end());
  const std::vector<T> dy(f.at("dy").begin(), f.at("dy").end());

  MoELayer<T> layer(c);
  if (f.has("expert_bias"))
    std::copy(f.at("expert_bias").begin(), f.at("expert_bias").end(), layer.expert_bias().begin());
  const MoEParams<T> P = moe_param_views(params.data(), c), G = moe_param_views(grads.data(), c);
  std::vector<T> y(x.size()), dx(x.size());
  const MoEStats stats = layer.forward(y.data(), x.data(), N, c.seq_length, P, /*train=*/true);
  layer.backward(dx.data(), dy.data(), P, G, f.at("aux_grad_scale")[0]);

  std::vector<double> routing_probs(static_cast<size_t>(N) * E, 0.0);
  const ops::MoEDispatchPlan& plan = layer.plan();
  for (int row = 0; row < plan.rows(); ++row) {
    const int slot = plan.row_slot[row];
    if (slot < 0) continue;
    routing_probs[static_cast<size_t>(slot / K) * E + layer.indices()[slot]] = layer.probs()[slot];
  }
  r.arrays["logits"] = to_double(layer.logits());
  r.arrays["routing_probs"] = routing_probs;
  r.arrays["tokens_per_expert"] = {stats.tokens_per_expert.begin(), stats.tokens_per_expert.end()};
  r.arrays["dropped"] = {double(stats.dropped)};
  r.arrays["y"] = to_double(y);
  r.arrays["aux_loss"] = {stats.aux_loss};
  r.arrays["z_loss"] = {stats.z_loss};
  r.arrays["grad/x"] = to_double(dx);
  for (const MoEParamInfo& p : r.layout)
    r.arrays["grad/" + p.name] = {grads.begin() + p.offset, grads.begin() + p.offset + p.numel()};
  return r;
}

struct Case {
  std::string fixture;
  bool float64;
};
void PrintTo(const Case& c, std::ostream* os) {
  *os << c.fixture << (c.float64 ? " float64" : " float32");
}
std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return info.param.fixture + (info.param.float64 ? "_float64" : "_float32");
}

class MoEPyTorchFixture : public ::testing::TestWithParam<Case> {
 protected:
  static const Result& result(const Case& c) {
    static std::map<std::string, Result> cache;
    const std::string key = c.fixture + (c.float64 ? "64" : "32");
    auto it = cache.find(key);
    if (it == cache.end())
      it = cache
               .emplace(key, c.float64 ? run_layer<double>(fixture(c.fixture))
                                       : run_layer<float>(fixture(c.fixture)))
               .first;
    return it->second;
  }
  static const Fixture& fixture(const std::string& name) {
    static std::map<std::string, Fixture> cache;
    auto it = cache.find(name);
    if (it == cache.end()) it = cache.emplace(name, read_fixture(name)).first;
    return it->second;
  }
  // Values computed in float64 agree to rounding; float32 ones to its precision after a few
  // dependent GEMMs.
  double tolerance() const { return GetParam().float64 ? 1e-10 : 5e-6; }
  void expect_matches(const std::string& key, double tolerance) const {
    const double err =
        relative_error(result(GetParam()).arrays.at(key), fixture(GetParam().fixture).at(key));
    std::ostringstream value;
    value << err;
    RecordProperty("relative_error:" + key, value.str());
    EXPECT_LE(err, tolerance) << key;
  }
};

TEST_P(MoEPyTorchFixture, RouterLogitsMatchPyTorch) {
  expect_matches("logits", tolerance());
}
TEST_P(MoEPyTorchFixture, RoutingProbabilitiesAfterCapacityMatchPyTorch) {
  expect_matches("routing_probs", tolerance());
}
TEST_P(MoEPyTorchFixture, RowsPerExpertAndDropsMatchPyTorch) {
  expect_matches("tokens_per_expert", 0);
  expect_matches("dropped", 0);
}
TEST_P(MoEPyTorchFixture, OutputMatchesPyTorch) {
  expect_matches("y", tolerance());
}
TEST_P(MoEPyTorchFixture, AuxAndZLossesMatchPyTorch) {
  const Fixture& f = fixture(GetParam().fixture);
  for (const char* key : {"aux_loss", "z_loss"}) {
    const double ours = result(GetParam()).arrays.at(key)[0], ref = f.at(key)[0];
    EXPECT_NEAR(ours, ref, tolerance() * std::max(std::abs(ref), 1e-12)) << key;
  }
}
TEST_P(MoEPyTorchFixture, InputGradientMatchesPyTorch) {
  expect_matches("grad/x", 2 * tolerance());
}
TEST_P(MoEPyTorchFixture, EveryParameterGradientMatchesPyTorch) {
  for (const MoEParamInfo& p : result(GetParam()).layout)
    expect_matches("grad/" + p.name, 2 * tolerance());
}

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (const char* name : kFixtures)
    for (bool f64 : {true, false}) cases.push_back({name, f64});
  return cases;
}
INSTANTIATE_TEST_SUITE_P(AllConfigs, MoEPyTorchFixture, ::testing::ValuesIn(all_cases()),
                         case_name);

}  // namespace
}  // namespace omni
