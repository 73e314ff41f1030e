// The zoo's per-tensor quantities on an MoE layer's stacked expert tensors ([experts, ...],
// is_stacked_experts): each expert is a tensor of its own, as DeepSpeed-MoE and
// Megatron-Core's SequentialMLP hold one tensor per expert, so LAMB's trust ratio is per
// expert and adam8bit's blocks restart at each expert's first element.
//  - On one rank the stacked tensors step bit for bit as the experts' separate tensors do
//    (parameters and the checkpoint's state buffers), and a resume through those buffers is
//    bit-exact; the old whole-tensor behaviour (the same tensors under other names, which
//    is_stacked_experts does not know) is far from it.
//  - At every layout the zoo takes experts to (EP 2 under TP 2 with ETP 1, ETP 2 = TP 2, EP 2
//    x ETP 2 over DP 4, the distributed optimizer's shards cutting experts at DP 2 and over
//    ETP 2 and EP 2 slices) the parameters are the separate tensors' one-rank run's: adam8bit
//    bit for bit, LAMB within 1e-6 (its norms summed in another order).
// Four experts of 30 (fc1), 6 (fc1's bias) and 20 (fc2) elements, blocks of 16: adam8bit's
// blocks of the flattened tensor would straddle experts. In-process ranks keep these cheap.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "comm/local_communicator.h"
#include "optim/distributed_optimizer.h"
#include "optim/optimizer_zoo.h"

namespace omni {
namespace {

constexpr int64_t kExperts = 4, kSteps = 4;
// The parameters: a dense matrix, then fc1 [E, 6, 5], its bias [E, 6] and fc2 [E, 5, 4].
const std::vector<std::string> kNames = {"decoder.layers.0.self_attention.linear_qkv.weight",
                                         "decoder.layers.0.mlp.experts.linear_fc1.weight",
                                         "decoder.layers.0.mlp.experts.linear_fc1.bias",
                                         "decoder.layers.0.mlp.experts.linear_fc2.weight"};
const std::vector<Shape> kExpertShapes = {{}, {6, 5}, {6}, {5, 4}};
const Shape kDense = {8, 10};

int64_t expert_numel(size_t k) {
  int64_t n = 1;
  for (int64_t d : kExpertShapes[k]) n *= d;
  return n;
}

OptimizerConfig config(OptimizerKind kind) {
  OptimizerConfig c;
  c.kind = kind;
  c.weight_decay = 0.1;
  c.zoo.lamb_min_coeff = 1e-4;        // LAMB's ratios unclamped
  c.zoo.adam8bit_min_8bit_size = 16;  // fc1 and fc2 take 8-bit states, the biases fp32
  c.zoo.adam8bit_block_size = 16;     // blocks that straddle experts in the flattened tensors
  return c;
}

// Element g (row-major in the whole stacked tensor) of parameter k: each expert at its own
// scale, so that the experts' trust ratios differ.
float value(size_t k, int64_t g) {
  const int64_t e = k == 0 ? 0 : g / expert_numel(k);
  return float(std::sin(double(g * 7 + int64_t(k) * 3))) * 0.1f * float(1 + e);
}
float grad(int step, size_t k, int64_t g) {
  const int64_t e = k == 0 ? 0 : g / expert_numel(k);
  return float(std::cos(double(g * 13 + int64_t(k) * 5 + step * 11))) * 0.02f * float(4 - e);
}

// The experts' separate tensors after the dense one: fc1, its bias and fc2 of expert 0, then
// expert 1's, ... Parameter k's element g is separate parameter separate_of(k, g)'s element
// g % expert_numel(k).
std::vector<ParamInfo> separate_infos() {
  std::vector<ParamInfo> infos = {{kNames[0], kDense}};
  for (int64_t e = 0; e < kExperts; ++e)
    for (size_t k = 1; k < kNames.size(); ++k)
      infos.push_back({kNames[k] + std::to_string(e), kExpertShapes[k], ParamInit::Normal, k != 2});
  return infos;
}
size_t separate_of(size_t k, int64_t g) {
  return k == 0 ? 0 : 1 + size_t(g / expert_numel(k)) * 3 + (k - 1);
}

// A layout of the stacked tensors as model/gpt_moe.cpp makes it: expert-parallel rank `ep` of
// `eps` holds experts [ep E / eps, (ep + 1) E / eps) (dimension 0 split), expert
// tensor-parallel rank `t` of `ts` the t-th slice of each one's width (fc1's and its bias's
// rows, fc2's columns), and the dense matrix's rows are split over `dense_ts`.
struct Split {
  int eps = 1, ep = 0, ts = 1, t = 0, dense_ts = 1, dense_t = 0;
};
std::vector<ParamInfo> stacked_infos(const Split& s, bool stacked = true) {
  std::vector<ParamInfo> infos = {{kNames[0], kDense}};
  if (s.dense_ts > 1) {
    ParamInfo& d = infos[0];
    d.global_shape = d.shape;
    d.shape[0] /= s.dense_ts;
    d.shard_dim = 0;
    d.segments = {{0, s.dense_t * d.shape[0], d.shape[0]}};
  }
  const int64_t local = kExperts / s.eps, first = local * s.ep;
  for (size_t k = 1; k < kNames.size(); ++k) {
    Shape shape = {kExperts};
    shape.insert(shape.end(), kExpertShapes[k].begin(), kExpertShapes[k].end());
    std::string name = kNames[k];
    if (!stacked) name.replace(name.find("experts."), 8, "stacked.");
    infos.push_back({name, shape, ParamInit::Normal, k != 2});
    ParamInfo& p = infos.back();
    if (s.eps > 1) {
      p.global_shape = p.shape;
      p.shape[0] = local;
      p.shard_dim = 0;
      p.segments = {{0, first, local}};
    }
    if (s.ts == 1) continue;
    const int dim = k == 3 ? 2 : 1;
    if (p.global_shape.empty()) p.global_shape = p.shape;
    const int64_t width = p.shape[size_t(dim)] / s.ts;
    p.shard_dim = dim;
    p.segments = {{0, s.t * width, width}};
    p.shape[size_t(dim)] = width;
    if (s.eps > 1) p.dim0_start = first;
  }
  return infos;
}

// Parameter k's values (grads: step s's gradients) at this rank's elements of it.
void fill(ParameterSet<float>& params, bool grads, int step = 0) {
  for (size_t k = 0; k < params.infos().size(); ++k) {
    const ParamInfo& p = params.infos()[k];
    ParameterSet<float>::for_each_run(p, [&](int64_t l, int64_t g, int64_t n) {
      for (int64_t i = 0; i < n; ++i)
        (grads ? params.grads() : params.values())[p.offset + l + i] =
            grads ? grad(step, k, g + i) : value(k, g + i);
    });
  }
}

// The largest difference of this rank's elements of the stacked `params` from the separate
// tensors' `want`.
double largest_difference(const ParameterSet<float>& params, const ParameterSet<float>& want) {
  double d = 0;
  for (size_t k = 0; k < params.infos().size(); ++k) {
    const ParamInfo& p = params.infos()[k];
    ParameterSet<float>::for_each_run(p, [&](int64_t l, int64_t g, int64_t n) {
      for (int64_t i = 0; i < n; ++i) {
        const ParamInfo& q = want.infos()[separate_of(k, g + i)];
        const int64_t j = k == 0 ? g + i : (g + i) % expert_numel(k);
        d = std::max(
            d, double(std::abs(params.values()[p.offset + l + i] - want.values()[q.offset + j])));
      }
    });
  }
  return d;
}

// The separate tensors stepped kSteps times on one rank.
struct Separate {
  ParameterSet<float> params{separate_infos()};
  Optimizer<float> opt;
  explicit Separate(OptimizerKind kind) : opt(config(kind), params) {
    fill_separate(false, 0);
    for (int s = 0; s < kSteps; ++s) {
      fill_separate(true, s);
      opt.step(params, 1e-2);
    }
  }
  void fill_separate(bool grads, int step) {
    ParameterSet<float> stacked(stacked_infos({}));
    fill(stacked, grads, step);
    const float* from = grads ? stacked.grads() : stacked.values();
    for (size_t k = 0; k < stacked.infos().size(); ++k) {
      const ParamInfo& p = stacked.infos()[k];
      for (int64_t g = 0; g < p.numel; ++g) {
        const ParamInfo& q = params.infos()[separate_of(k, g)];
        (grads ? params.grads() : params.values())[q.offset + (k == 0 ? g : g % expert_numel(k))] =
            from[p.offset + g];
      }
    }
  }
};

// kSteps steps of the stacked tensors on one rank (`stacked` false: as one tensor each, the
// old behaviour).
ParameterSet<float> one_rank(OptimizerKind kind, bool stacked,
                             std::unique_ptr<Optimizer<float>>* keep = nullptr) {
  ParameterSet<float> params(stacked_infos({}, stacked));
  auto opt = std::make_unique<Optimizer<float>>(config(kind), params);
  fill(params, false);
  for (int s = 0; s < kSteps; ++s) {
    fill(params, true, s);
    opt->step(params, 1e-2);
  }
  if (keep) *keep = std::move(opt);
  return params;
}

const OptimizerKind kKinds[] = {OptimizerKind::Lamb, OptimizerKind::Adam8bit};

TEST(ZooExperts, StackedExpertsStepAsSeparateTensors) {
  for (OptimizerKind kind : kKinds) {
    const char* name = zoo_optimizer_name(kind);
    const Separate want(kind);
    std::unique_ptr<Optimizer<float>> opt;
    const ParameterSet<float> got = one_rank(kind, true, &opt);
    const double per_expert = largest_difference(got, want.params);
    const double whole = largest_difference(one_rank(kind, false), want.params);
    // The checkpoint's state buffers: each element's (and each block's first element's) the
    // separate tensors' at the same element.
    double states = 0;
    for (const std::string& s : opt->state_names()) {
      const float* a = opt->state_buffer(s);
      const float* b = const_cast<Optimizer<float>&>(want.opt).state_buffer(s);
      for (size_t k = 0; k < got.infos().size(); ++k)
        for (int64_t g = 0; g < got.infos()[k].numel; ++g) {
          const ParamInfo& q = want.params.infos()[separate_of(k, g)];
          const int64_t j = k == 0 ? g : g % expert_numel(k);
          states =
              std::max(states, double(std::abs(a[got.infos()[k].offset + g] - b[q.offset + j])));
        }
    }
    std::printf(
        "%s: stacked experts vs separate tensors: parameters %.3g, states %.3g; as one tensor "
        "(the old behaviour): parameters %.3g\n",
        name, per_expert, states, whole);
    EXPECT_EQ(per_expert, 0.0) << name;
    EXPECT_EQ(states, 0.0) << name;
    EXPECT_GT(whole, 1e-4) << name;
  }
}

// adam8bit's min_8bit_size is compared with one expert's elements, as with separate tensors:
// at 32, fc1's experts (30) keep fp32 moments though the stacked tensor has 120.
TEST(ZooExperts, Adam8bitQuantisesAnExpertByItsOwnSize) {
  OptimizerConfig c = config(OptimizerKind::Adam8bit);
  c.zoo.adam8bit_min_8bit_size = 32;
  ParameterSet<float> stacked(stacked_infos({}));
  Optimizer<float> a(c, stacked);
  fill(stacked, false);
  fill(stacked, true, 0);
  a.step(stacked, 1e-2);
  const ParamInfo& fc1 = stacked.infos()[1];
  // fp32 moments hold the moment itself (not a code index), here (1 - b1) g.
  const float m = a.state_buffer("state1")[fc1.offset];
  std::printf("adam8bit, min_8bit_size 32: fc1's first state1 %.6g ((1 - b1) g %.6g)\n", m,
              float(1.0 - c.adam_beta1) * stacked.grads()[fc1.offset]);
  EXPECT_FLOAT_EQ(m, float(1.0 - c.adam_beta1) * stacked.grads()[fc1.offset]);
}

// Stops after two steps, carries the state buffers (the parameters' elements) and the step
// count into a fresh optimizer as a checkpoint does, and steps on: bit for bit the
// uninterrupted run (adam8bit's block maxima sit at each expert's blocks' first elements).
TEST(ZooExperts, ResumeThroughTheStateBuffersIsBitExact) {
  for (OptimizerKind kind : kKinds) {
    const ParameterSet<float> straight = one_rank(kind, true);
    ParameterSet<float> resumed(stacked_infos({}));
    auto opt = std::make_unique<Optimizer<float>>(config(kind), resumed);
    fill(resumed, false);
    for (int s = 0; s < kSteps; ++s) {
      if (s == kSteps / 2) {
        auto next = std::make_unique<Optimizer<float>>(config(kind), resumed);
        for (const std::string& name : opt->state_names())
          for (const ParamInfo& p : resumed.infos())
            std::copy_n(opt->state_buffer(name) + p.offset, p.numel,
                        next->state_buffer(name) + p.offset);
        next->set_steps(opt->steps());
        opt = std::move(next);
      }
      fill(resumed, true, s);
      opt->step(resumed, 1e-2);
    }
    for (int64_t i = 0; i < straight.size(); ++i)
      ASSERT_EQ(straight.values()[i], resumed.values()[i])
          << zoo_optimizer_name(kind) << " element " << i;
  }
}

// One layout on `ranks` in-process ranks: `make` builds a rank's parameters and its optimizer's
// step from its world and hands them to `go`, which runs kSteps steps; the largest difference
// of any rank's elements from the separate tensors' `want`.
using Step = std::function<void(ParameterSet<float>&, int)>;
using Go = std::function<void(ParameterSet<float>&, Step)>;
double run_layout(int ranks, const ParameterSet<float>& want,
                  const std::function<void(Communicator&, const Go&)>& make) {
  double worst = 0;
  std::mutex mu;
  run_ranks(ranks, [&](Communicator& world) {
    make(world, [&](ParameterSet<float>& params, Step step) {
      fill(params, false);
      for (int s = 0; s < kSteps; ++s) {
        fill(params, true, s);
        step(params, s);
      }
      const double d = largest_difference(params, want);
      std::lock_guard<std::mutex> lk(mu);
      worst = std::max(worst, d);
    });
  });
  return worst;
}

// Each layout's largest difference from the separate tensors' one-rank run: adam8bit's none,
// LAMB's within 1e-6 (its norms summed in another order).
void expect_within(OptimizerKind kind, const std::vector<std::pair<std::string, double>>& layouts) {
  const char* name = zoo_optimizer_name(kind);
  for (const auto& [layout, d] : layouts) {
    std::printf("%s, %s: parameters within %.3g of the separate tensors' one-rank run\n", name,
                layout.c_str(), d);
    EXPECT_LE(d, kind == OptimizerKind::Lamb ? 1e-6 : 0.0) << name << ", " << layout;
  }
}

// Without the distributed optimizer: the ranks' experts and slices of them.
TEST(ZooExperts, SplitExpertsMatchSeparateTensors) {
  for (OptimizerKind kind : kKinds) {
    const Separate want(kind);
    const OptimizerConfig c = config(kind);
    auto run = [&](ParameterSet<float>& params, Optimizer<float>& opt, auto&& go) {
      go(params, [&](ParameterSet<float>& p, int) { opt.step(p, 1e-2); });
    };
    // EP 2 under TP 2 (ETP 1): the dense matrix split over the pair, each rank two whole
    // experts (their group for slices is one rank: no sums over tp).
    const double ep2 = run_layout(2, want.params, [&](Communicator& world, auto&& go) {
      const auto etp = world.split(world.rank(), 0, "etp");
      ParameterSet<float> params(stacked_infos({2, world.rank(), 1, 0, 2, world.rank()}));
      std::vector<bool> experts = {false, true, true, true};
      Optimizer<float> opt(c, params, {}, &world, etp.get(), experts);
      run(params, opt, go);
    });
    // ETP 2 = TP 2: every expert's width and the dense rows split over the pair.
    const double etp2 = run_layout(2, want.params, [&](Communicator& world, auto&& go) {
      ParameterSet<float> params(stacked_infos({1, 0, 2, world.rank(), 2, world.rank()}));
      Optimizer<float> opt(c, params, {}, &world);
      run(params, opt, go);
    });
    // EP 2 x ETP 2 over DP 4 (TP 1): ranks {0, 1} hold experts 0 and 1, {2, 3} experts 2 and
    // 3, each pair split over its expert tensor-parallel group.
    const double ep2etp2 = run_layout(4, want.params, [&](Communicator& world, auto&& go) {
      const int r = world.rank();
      const auto etp = world.split(r / 2, r, "etp");
      ParameterSet<float> params(stacked_infos({2, r / 2, 2, r % 2}));
      std::vector<bool> experts = {false, true, true, true};
      Optimizer<float> opt(c, params, {}, nullptr, etp.get(), experts);
      run(params, opt, go);
    });
    expect_within(kind,
                  {{"EP 2 under TP 2", ep2}, {"ETP 2 = TP 2", etp2}, {"EP 2 x ETP 2", ep2etp2}});
  }
}

// Whether some shard range of `ddp` starts or ends inside an expert of fc1 (not at a multiple
// of its 30 elements): a shard that cuts an expert.
bool shards_cut_an_expert(const DataParallelBuckets<float>& ddp, const ParamInfo& fc1) {
  const int64_t each = fc1.numel / fc1.shape[0];
  for (const ShardRange& r : ddp.shard())
    for (int64_t at : {r.begin, r.end})
      if (at > fc1.offset && at < fc1.offset + fc1.numel && (at - fc1.offset) % each != 0)
        return true;
  return false;
}

// The distributed optimizer (each rank's shard of the data-parallel pair's buckets, which cut
// experts and adam8bit's blocks; the gradients the pair's average of equal ones, exact):
// whole experts at DP 2, experts split over ETP 2 (sums over both groups) and over EP 2.
TEST(ZooExperts, ShardedExpertsMatchSeparateTensors) {
  for (OptimizerKind kind : kKinds) {
    const char* name = zoo_optimizer_name(kind);
    const Separate want(kind);
    const OptimizerConfig c = config(kind);
    auto sharded = [&](Communicator& dp, ParameterSet<float>& params, Communicator* slices,
                       auto&& go) {
      DataParallelBuckets<float> ddp(dp, params, 24, GradReduce::ReduceScatter);
      EXPECT_TRUE(shards_cut_an_expert(ddp, params.infos()[1])) << name;
      DistributedOptimizer<float> opt(c, ddp, params, {}, slices);
      go(params, [&](ParameterSet<float>& p, int) {
        for (const ParamInfo& i : p.infos()) ddp.mark_ready(i.offset, i.offset + i.numel);
        ddp.finish();
        opt.step(p, 1e-2);
      });
    };
    const double dp2 = run_layout(2, want.params, [&](Communicator& world, auto&& go) {
      ParameterSet<float> params(stacked_infos({}));
      sharded(world, params, nullptr, go);
    });
    // ETP 2 x DP 2: expert tensor-parallel pairs {0, 1}, {2, 3}; data-parallel {0, 2}, {1, 3}.
    const double etp2 = run_layout(4, want.params, [&](Communicator& world, auto&& go) {
      const int r = world.rank();
      const auto etp = world.split(r / 2, r, "etp"), dp = world.split(r % 2, r, "dp");
      ParameterSet<float> params(stacked_infos({1, 0, 2, r % 2}));
      sharded(*dp, params, etp.get(), go);
    });
    // EP 2 x DP 2: expert-parallel pairs {0, 1}, {2, 3}; data-parallel {0, 2}, {1, 3}.
    const double ep2 = run_layout(4, want.params, [&](Communicator& world, auto&& go) {
      const int r = world.rank();
      const auto dp = world.split(r % 2, r, "dp");
      ParameterSet<float> params(stacked_infos({2, r % 2}));
      sharded(*dp, params, nullptr, go);
    });
    expect_within(kind, {{"distributed optimizer, DP 2", dp2},
                         {"distributed optimizer, ETP 2 x DP 2", etp2},
                         {"distributed optimizer, EP 2 x DP 2", ep2}});
  }
}

}  // namespace
}  // namespace omni
