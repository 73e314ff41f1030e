// The optimizer zoo against PyTorch: tests/fixtures/make_optimizer_zoo_fixtures.py writes
// each optimizer's published algorithm in plain torch (float32) and stores the parameters
// after steps 1 and 20 of a fixed gradient sequence on six tensors shaped like a tiny GPT
// layer's. Here the same tensors and gradients (the same integer hash) go through
// omni::Optimizer<float>, and every tensor must match to 1e-5 of its largest value
// (max|ours - torch| / max|torch|). Also: bitsandbytes' dynamic maps bit for bit, and a
// resume through the state buffers that is bit-exact to the uninterrupted run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "config/options.h"
#include "optim/optimizer.h"
#include "optim/optimizer_zoo.h"

namespace omni {
namespace {

constexpr int kSteps = 20;
constexpr double kLr = 1e-2, kWeightDecay = 0.1, kTolerance = 1e-5;

std::map<std::string, std::vector<double>> read_zoo_fixture() {
  const std::string path = std::string(OMNITRON_FIXTURE_DIR) + "/optimizer_zoo.txt";
  std::ifstream in(path);
  std::string line;
  if (!std::getline(in, line) || line != "omnitron-optimizer-zoo-fixture 1")
    throw std::runtime_error(path +
                             ": missing or not a zoo fixture (make it with /usr/bin/python3 "
                             "tests/fixtures/make_optimizer_zoo_fixtures.py)");
  std::map<std::string, std::vector<double>> arrays;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string name;
    size_t n = 0;
    ls >> name >> n;
    std::vector<double>& a = arrays[name];
    a.resize(n);
    for (double& v : a) ls >> v;
    if (!ls) throw std::runtime_error(path + ": array " + name + " is short");
  }
  return arrays;
}

const std::map<std::string, std::vector<double>>& fixture() {
  static const auto arrays = read_zoo_fixture();
  return arrays;
}

// The fixture script's hash (splitmix64's finaliser) and values.
uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

double hashed_value(uint64_t seed, int64_t i, double scale) {
  return scale * (double(int64_t(mix((seed << 32) + uint64_t(i)) % 2001) - 1000)) / 1000.0;
}

ParameterSet<float> tiny_layer() {
  std::vector<ParamInfo> infos = {
      {"embedding.word_embeddings.weight", {6, 16}},
      {"decoder.layers.0.self_attention.linear_qkv.weight", {32, 16}},
      {"decoder.layers.0.self_attention.linear_qkv.bias", {32}, ParamInit::Zeros, false},
      {"decoder.layers.0.mlp.linear_fc1.weight", {24, 12}},
      {"decoder.layers.0.mlp.linear_fc2.weight", {12, 24}},
      {"decoder.final_layernorm.weight", {16}, ParamInit::Ones, false}};
  ParameterSet<float> params(infos);
  for (size_t k = 0; k < params.infos().size(); ++k) {
    const ParamInfo& p = params.infos()[k];
    for (int64_t i = 0; i < p.numel; ++i)
      params.values()[p.offset + i] = float(hashed_value(k, i, 0.5));
  }
  return params;
}

// SophiaG's second gradient (of a loss on sampled labels, in the Gauss-Newton-Bartlett estimator).
void set_sampled_gradients(ParameterSet<float>& params, int step) {
  for (size_t k = 0; k < params.infos().size(); ++k) {
    const ParamInfo& p = params.infos()[k];
    for (int64_t i = 0; i < p.numel; ++i)
      params.grads()[p.offset + i] = float(hashed_value(3000 + 100 * step + k, i, 0.1));
  }
}

void set_gradients(ParameterSet<float>& params, int step) {
  for (size_t k = 0; k < params.infos().size(); ++k) {
    const ParamInfo& p = params.infos()[k];
    for (int64_t i = 0; i < p.numel; ++i)
      params.grads()[p.offset + i] = float(hashed_value(1000 + 100 * step + k, i, 0.1)) +
                                     float(hashed_value(500 + k, i, 0.05));
  }
}

struct ZooRun {
  std::string name;
  OptimizerConfig config;
  double lr_factor =
      1.0;  // the fixture's Lion and SophiaG step at lr / 10, schedule-free SGD at 10 lr
  int hessian_every =
      0;  // SophiaG: its Hessian estimate takes a sampled gradient after every Nth step
};

void PrintTo(const ZooRun& run, std::ostream* os) {
  *os << run.name;
}

OptimizerConfig base(OptimizerKind kind) {
  OptimizerConfig c;
  c.kind = kind;
  c.weight_decay = kWeightDecay;
  c.adam_beta1 = 0.9, c.adam_beta2 = 0.95, c.adam_eps = 1e-8;
  c.sgd_momentum = 0.9;
  return c;
}

std::vector<ZooRun> runs() {
  std::vector<ZooRun> r;
  r.push_back({"lamb", base(OptimizerKind::Lamb)});
  r.push_back({"lion", base(OptimizerKind::Lion), 0.1});
  ZooRun muon{"muon", base(OptimizerKind::Muon)};
  muon.config.zoo.qkv_split_shapes = {8, 4, 4};  // 4 heads of 4 channels, 2 query groups
  r.push_back(muon);
  ZooRun nesterov{"muon_nesterov_nosplit", base(OptimizerKind::Muon)};
  nesterov.config.zoo.muon_nesterov = true;
  nesterov.config.zoo.muon_scale_mode = "shape_scaling";
  r.push_back(nesterov);
  ZooRun adamw_sf{"adamwschedulefree", base(OptimizerKind::AdamWScheduleFree)};
  adamw_sf.config.zoo.schedulefree_warmup_steps = 5;
  r.push_back(adamw_sf);
  r.push_back({"sgdschedulefree", base(OptimizerKind::SGDScheduleFree), 10.0});
  ZooRun adam8bit{"adam8bit", base(OptimizerKind::Adam8bit)};
  adam8bit.config.zoo.adam8bit_min_8bit_size = 256;  // so that three tensors are 8-bit
  r.push_back(adam8bit);
  ZooRun sophiag{"sophiag", base(OptimizerKind::SophiaG), 0.1, 5};
  r.push_back(sophiag);
  ZooRun galore{"galoreadamw", base(OptimizerKind::GaLoreAdamW)};
  galore.config.zoo.galore_rank = 4, galore.config.zoo.galore_update_proj_gap = 6;
  galore.config.zoo.galore_scale = 0.25;
  r.push_back(galore);
  ZooRun galore8{"galoreadamw8bit", base(OptimizerKind::GaLoreAdamW8bit)};
  galore8.config.zoo.galore_rank = 8, galore8.config.zoo.galore_update_proj_gap = 7;
  galore8.config.zoo.galore_scale = 0.5;
  galore8.config.zoo.adam8bit_min_8bit_size = 128;  // so that the projected moments are 8-bit
  r.push_back(galore8);
  ZooRun per_layer{"galoreadamw8bitperlayer", base(OptimizerKind::GaLoreAdamW8bitPerLayer)};
  per_layer.config.zoo.galore_rank = 3, per_layer.config.zoo.galore_update_proj_gap = 6;
  per_layer.config.zoo.galore_proj_type = "reverse_std";
  per_layer.config.zoo.adam8bit_min_8bit_size = 64;
  r.push_back(per_layer);
  ZooRun shampoo{"shampoo", base(OptimizerKind::Shampoo)};
  shampoo.config.zoo.shampoo_update_freq = 5;  // preconditioned from step 5, roots at 5, 10, ...
  shampoo.config.zoo.shampoo_eps = 1e-4;       // the fixture says why not 1e-12
  shampoo.config.zoo.shampoo_max_preconditioner_dim = 16;  // blocks of the 32- and 24-long sides
  r.push_back(shampoo);
  return r;
}

double lr_at(const ZooRun& run, int step) {
  return kLr * std::min(1.0, step / 4.0) * run.lr_factor;
}

// max|ours - torch| / max|torch| of each tensor, the worst over the tensors.
double worst_error(const ParameterSet<float>& params, const std::vector<double>& ref,
                   std::string* where) {
  double worst = 0;
  for (const ParamInfo& p : params.infos()) {
    double diff = 0, scale = 0;
    for (int64_t i = 0; i < p.numel; ++i) {
      diff = std::max(diff, std::fabs(params.values()[p.offset + i] - ref[size_t(p.offset + i)]));
      scale = std::max(scale, std::fabs(ref[size_t(p.offset + i)]));
    }
    if (diff / scale > worst) worst = diff / scale, *where = p.name;
  }
  return worst;
}

// The fixture stores the parameters flat in order; our buffer aligns each to 16 elements.
std::vector<double> laid_out(const ParameterSet<float>& params, const std::vector<double>& flat) {
  std::vector<double> out(size_t(params.size()), 0.0);
  size_t at = 0;
  for (const ParamInfo& p : params.infos())
    for (int64_t i = 0; i < p.numel; ++i) out[size_t(p.offset + i)] = flat.at(at++);
  return out;
}

class ZooAgainstTorch : public ::testing::TestWithParam<ZooRun> {};

TEST_P(ZooAgainstTorch, ParametersAfterOneAndTwentyStepsMatch) {
  const ZooRun& run = GetParam();
  ParameterSet<float> params = tiny_layer();
  auto optimizer =
      make_zoo_optimizer(run.config, params, ZooLayout<float>::whole(params.infos(), nullptr));
  for (int step = 1; step <= kSteps; ++step) {
    set_gradients(params, step);
    optimizer->step(params, lr_at(run, step), step);
    if (run.hessian_every && step % run.hessian_every == 0) {
      set_sampled_gradients(params, step);
      optimizer->update_hessian(params);
    }
    if (step != 1 && step != kSteps) continue;
    const std::string key = run.name + "/step" + std::to_string(step);
    ASSERT_TRUE(fixture().count(key)) << key;
    std::string where;
    const double err = worst_error(params, laid_out(params, fixture().at(key)), &where);
    std::printf("[ zoo ] %-24s step %2d: worst relative error %.2e (%s)\n", run.name.c_str(), step,
                err, where.c_str());
    EXPECT_LE(err, kTolerance) << key << " at " << where;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixture, ZooAgainstTorch, ::testing::ValuesIn(runs()),
                         [](const auto& info) { return info.param.name; });

// The map is computed in double and rounded once (the fixture's too); bitsandbytes' float32
// computation is within two ulps of it (its linspace, midpoints and scaling each round).
TEST(Adam8bit, DynamicMapsAreBitsandbytesMaps) {
  for (bool is_signed : {true, false}) {
    const std::string name = is_signed ? "map/signed" : "map/unsigned";
    const std::vector<double>& ref = fixture().at(name);
    const std::vector<double>& bnb = fixture().at(name + "_bnb");
    const std::array<float, 256> map = dynamic_quantization_map(is_signed);
    int differ = 0;
    for (size_t i = 0; i < 256; ++i) {
      EXPECT_EQ(map[i], float(ref[i])) << name << " " << i;
      const float theirs = float(bnb[i]);
      const float ulp = std::nextafter(std::fabs(map[i]), 2.0f) - std::fabs(map[i]);
      EXPECT_LE(std::fabs(theirs - map[i]), 2 * ulp)
          << name << " " << i << ": " << map[i] << " vs " << theirs;
      differ += map[i] != theirs;
    }
    std::printf(
        "[ zoo ] %s: %d of 256 codes differ (by at most two ulps) from bitsandbytes' float32 map\n",
        name.c_str(), differ);
  }
}

// Stops after 10 steps, carries the state into a fresh optimizer as a checkpoint does (each
// state buffer's parameter elements, not the alignment gaps between tensors, the scalar state
// and the step count), and runs 10 more: bit for bit the uninterrupted run.
void expect_bit_exact_resume(const ZooRun& run, const std::function<ParameterSet<float>()>& make,
                             const std::function<void(ParameterSet<float>&, int)>& set_grads) {
  ParameterSet<float> straight = make(), resumed = make();
  Optimizer<float> a(run.config, straight);
  auto first = std::make_unique<Optimizer<float>>(run.config, resumed);
  for (int step = 1; step <= kSteps; ++step) {
    set_grads(straight, step);
    a.step(straight, lr_at(run, step));
    set_grads(resumed, step);
    first->step(resumed, lr_at(run, step));
    if (step != kSteps / 2) continue;
    auto second = std::make_unique<Optimizer<float>>(run.config, resumed);
    for (const std::string& name : first->state_names())
      for (const ParamInfo& p : resumed.infos())
        std::copy_n(first->state_buffer(name) + p.offset, p.numel,
                    second->state_buffer(name) + p.offset);
    for (const std::string& name : first->scalar_names())
      second->scalar(name) = first->scalar(name);
    second->set_steps(first->steps());
    first = std::move(second);
  }
  for (int64_t i = 0; i < straight.size(); ++i)
    ASSERT_EQ(straight.values()[i], resumed.values()[i]) << run.name << " element " << i;
}

TEST_P(ZooAgainstTorch, ResumeThroughTheStateBuffersIsBitExact) {
  expect_bit_exact_resume(GetParam(), tiny_layer, set_gradients);
}

// The same on tensors whose sizes leave alignment gaps (and a matrix longer than Shampoo's
// blocks of 16 in the fixture's run).
TEST_P(ZooAgainstTorch, ResumeAcrossAlignmentGapsIsBitExact) {
  const std::vector<ParamInfo> infos = {
      {"decoder.layers.0.mlp.linear_fc1.weight", {5, 19}},
      {"decoder.layers.0.mlp.linear_fc1.bias", {5}, ParamInit::Zeros, false},
      {"decoder.layers.0.mlp.linear_fc2.weight", {19, 5}},
      {"decoder.final_layernorm.weight", {7}, ParamInit::Ones, false}};
  auto fill = [](ParameterSet<float>& params, uint64_t seed, bool grads) {
    for (const ParamInfo& p : params.infos())
      for (int64_t i = 0; i < p.numel; ++i)
        (grads ? params.grads() : params.values())[p.offset + i] =
            float(hashed_value(seed + uint64_t(p.offset), i, grads ? 0.1 : 0.5));
  };
  expect_bit_exact_resume(
      GetParam(),
      [&] {
        ParameterSet<float> params(infos);
        fill(params, 1, false);
        return params;
      },
      [&](ParameterSet<float>& params, int step) { fill(params, 100 * uint64_t(step), true); });
}

// bitsandbytes keeps a first moment's sign through quantisation: a tiny negative moment whose
// nearest code is 0 gets the smallest negative code instead.
TEST(Adam8bit, QuantisedFirstMomentKeepsItsSign) {
  ParameterSet<float> params({{"w", {256}}});
  OptimizerConfig c = base(OptimizerKind::Adam8bit);
  c.zoo.adam8bit_min_8bit_size = 256;
  Optimizer<float> optimizer(c, params);
  params.zero_grads();
  params.grads()[0] = 1.0f, params.grads()[1] = -1e-9f, params.grads()[2] = 1e-9f;
  optimizer.step(params, 1e-3);
  const std::array<float, 256> code = dynamic_quantization_map(true);
  const float* state1 = optimizer.state_buffer("state1");
  EXPECT_EQ(code[size_t(state1[0])], 1.0f);
  EXPECT_LT(code[size_t(state1[1])], 0.0f);  // -1e-10 / 0.1 is nearest to 0, a positive code
  EXPECT_EQ(code[size_t(state1[2])], 0.0f);
  EXPECT_EQ(code[size_t(state1[3])], 0.0f);
  EXPECT_EQ(optimizer.state_buffer("absmax1")[0], 1.0f - 0.9f);  // (1 - beta1) * 1, in float
}

// GaLore and Shampoo keep per-matrix states whole: tensor parallelism (which a single process
// cannot start through the binary) is refused at option time, naming both; so is expert
// parallelism for every zoo optimizer with per-tensor state.
// An MoE layer's experts' biases are [experts, width] tensors, each row one expert's bias
// vector: Muon and GaLore step them with their AdamW, as the 1-D biases, not as matrices. Here
// the same values and gradients as a [4, 12] expert bias and as a 48-element bias come out of
// five steps equal, beside a hidden matrix that Muon and GaLore do take.
TEST(OptimizerZoo, ExpertBiasesAreVectorsNotMatrices) {
  std::vector<ParamInfo> infos = {
      {"decoder.layers.0.mlp.linear_fc1.weight", {12, 8}},
      {"decoder.layers.0.mlp.experts.linear_fc2.bias", {4, 12}, ParamInit::Zeros, false},
      {"decoder.layers.0.mlp.linear_fc2.bias", {48}, ParamInit::Zeros, false}};
  EXPECT_TRUE(is_hidden_matrix(infos[0]));
  EXPECT_FALSE(is_hidden_matrix(infos[1]));
  for (const OptimizerKind kind : {OptimizerKind::Muon, OptimizerKind::GaLoreAdamW}) {
    ParameterSet<float> params(infos);
    const ParamInfo &expert = params.infos()[1], &flat = params.infos()[2];
    for (int64_t i = 0; i < flat.numel; ++i)
      params.values()[expert.offset + i] = params.values()[flat.offset + i] =
          float(hashed_value(7, i, 0.5));
    OptimizerConfig config = base(kind);
    config.zoo.galore_rank = 2;
    auto optimizer =
        make_zoo_optimizer(config, params, ZooLayout<float>::whole(params.infos(), nullptr));
    for (int step = 1; step <= 5; ++step) {
      set_gradients(params, step);
      for (int64_t i = 0; i < flat.numel; ++i)
        params.grads()[expert.offset + i] = params.grads()[flat.offset + i];
      optimizer->step(params, kLr, step);
    }
    for (int64_t i = 0; i < flat.numel; ++i)
      ASSERT_EQ(params.values()[expert.offset + i], params.values()[flat.offset + i])
          << zoo_optimizer_name(kind) << " element " << i;
  }
}

// An MoE layer's stacked expert weight [experts, rows, cols] is one matrix per expert under
// Muon, Shampoo and GaLore, as Megatron-Core's and DeepSpeed-MoE's per-expert weights: a
// [3, 6, 4] fc1 and fc2 ([3, 4, 6]) come out of five steps equal to three separate [6, 4] (and
// [4, 6]) hidden matrices with the same values and gradients (before, Muon and GaLore stepped
// the stacked tensors with their AdamW, every element differing, and Shampoo refused them;
// galoreadamw8bit's projected 8-bit moments ran their blocks across the experts).
TEST(OptimizerZoo, MuonShampooAndGaLoreTakeEachExpertsMatrixOnItsOwn) {
  std::vector<ParamInfo> infos = {{"decoder.layers.0.mlp.experts.linear_fc1.weight", {3, 6, 4}},
                                  {"decoder.layers.0.mlp.experts.linear_fc2.weight", {3, 4, 6}}};
  for (const char* m : {"fc1", "fc2"})
    for (int e = 0; e < 3; ++e)
      infos.push_back({"decoder.layers." + std::to_string(e + 1) + ".mlp.linear_" + m + ".weight",
                       std::string(m) == "fc1" ? Shape{6, 4} : Shape{4, 6}});
  EXPECT_TRUE(is_expert_matrices(infos[0]));
  EXPECT_TRUE(is_expert_matrices(infos[1]));
  EXPECT_FALSE(is_expert_matrices(infos[2]));
  for (const OptimizerKind kind : {OptimizerKind::Muon, OptimizerKind::Shampoo,
                                    OptimizerKind::GaLoreAdamW, OptimizerKind::GaLoreAdamW8bit}) {
    ParameterSet<float> params(infos);
    const std::vector<ParamInfo>& in = params.infos();
    // Expert e of stacked tensor s is separate matrix 2 + 3 s + e.
    auto each = [&](auto&& f) {
      for (int s = 0; s < 2; ++s)
        for (int e = 0; e < 3; ++e)
          for (int64_t k = 0; k < 24; ++k)
            f(in[s].offset + e * 24 + k, in[2 + 3 * s + e].offset + k);
    };
    each([&](int64_t stacked, int64_t separate) {
      params.values()[stacked] = params.values()[separate] = float(hashed_value(5, stacked, 0.5));
    });
    OptimizerConfig config = base(kind);
    config.zoo.shampoo_update_freq = 2;  // preconditioned from step 2 on
    config.zoo.galore_rank = 2, config.zoo.galore_update_proj_gap = 3;
    // galoreadamw8bit: every projected moment 8-bit (12 elements an expert, one 256-element
    // block), so a block run across the stacked experts would share their maxima.
    config.zoo.adam8bit_min_8bit_size = 1;
    auto optimizer =
        make_zoo_optimizer(config, params, ZooLayout<float>::whole(params.infos(), nullptr));
    for (int step = 1; step <= 5; ++step) {
      set_gradients(params, step);
      each([&](int64_t stacked, int64_t separate) {
        params.grads()[stacked] = params.grads()[separate];
      });
      optimizer->step(params, kLr, step);
    }
    int64_t differ = 0, first = -1;
    each([&](int64_t stacked, int64_t separate) {
      if (params.values()[stacked] != params.values()[separate] && differ++ == 0) first = stacked;
    });
    EXPECT_EQ(differ, 0) << zoo_optimizer_name(kind) << ": of 144 elements, the first at "
                         << first;
  }
}

// Every zoo optimizer runs under tensor and expert parallelism: GaLore and Shampoo assemble
// a split matrix whole (WholeTensorStates), the others reduce their per-tensor quantities over
// the slices (and ZeRO 2 / 3 stay refused for GaLore and Shampoo: test_cli_optimizer_zoo).
TEST(OptimizerZoo, TensorAndExpertParallelismRunEveryZooOptimizer) {
  for (const char* opt : {"galoreadamw", "galoreadamw8bitperlayer", "shampoo", "lamb"}) {
    Options o;
    parse_options({"--mock-data", "--vocab-size", "64", "--optimizer", opt,
                   "--tensor-model-parallel-size", "2"},
                  o);
    EXPECT_NO_THROW(finalize(o)) << opt;
  }
  // Expert parallelism: every zoo optimizer runs with it, each expert's per-tensor quantities
  // (LAMB's norms, adam8bit's blocks, Muon's, Shampoo's and GaLore's matrices) its own.
  for (const char* opt :
       {"lion", "sophiag", "adamwschedulefree", "sgdschedulefree", "muon", "shampoo", "galoreadamw",
        "galoreadamw8bit", "galoreadamw8bitperlayer", "lamb", "adam8bit"}) {
    Options o;
    parse_options({"--mock-data", "--vocab-size", "64", "--optimizer", opt, "--num-experts", "2",
                   "--expert-model-parallel-size", "2"},
                  o);
    EXPECT_NO_THROW(finalize(o)) << opt;
  }
}

TEST(OptimizerZoo, NamesAndAliasesParse) {
  EXPECT_EQ(parse_optimizer("ds.fusedlamb"), OptimizerKind::Lamb);
  EXPECT_EQ(parse_optimizer("ipex.fusedlamb"), OptimizerKind::Lamb);
  EXPECT_EQ(parse_optimizer("apex.adam"), OptimizerKind::AdamW);
  EXPECT_EQ(parse_optimizer("apex.sgd"), OptimizerKind::SGD);
  EXPECT_EQ(parse_optimizer("adamwschedulefree"), OptimizerKind::AdamWScheduleFree);
  try {
    parse_optimizer("adagrad");
    ADD_FAILURE() << "adagrad accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("lion, muon"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace omni
