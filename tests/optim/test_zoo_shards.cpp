// The optimizer zoo on a rank's part of the model equals the zoo on one rank holding it all:
//  - under the distributed optimizer (each data-parallel rank updates its shard, whose ranges
//    cut tensors and adam8bit's blocks apart; GaLore and Shampoo step the tensors they hold
//    pieces of whole), at 2 ranks, parameters and gathered state;
//  - under tensor parallelism (each rank holds row or column slices of the matrices), at 2
//    ranks, the slices of the one-rank parameters.
// LAMB's norms may be sums in another order (within 1e-6); every other optimizer matches bit
// for bit. In-process ranks (comm/local_communicator.h) keep these cheap.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "comm/local_communicator.h"
#include "optim/distributed_optimizer.h"
#include "optim/optimizer_zoo.h"

namespace omni {
namespace {

const OptimizerKind kZoo[] = {OptimizerKind::Lamb,
                              OptimizerKind::Lion,
                              OptimizerKind::Muon,
                              OptimizerKind::AdamWScheduleFree,
                              OptimizerKind::SGDScheduleFree,
                              OptimizerKind::Adam8bit,
                              OptimizerKind::SophiaG};

// Whole tensors: matrices Muon orthogonalises (a fused QKV of four query groups, SwiGLU's
// fused [gate; up], a row-parallel one), a bias, a norm.
std::vector<ParamInfo> whole_infos() {
  return {{"decoder.layers.0.self_attention.linear_qkv.weight", {16, 10}},
          {"decoder.layers.0.self_attention.linear_qkv.bias", {16}, ParamInit::Zeros, false},
          {"decoder.layers.0.mlp.linear_fc1.weight", {8, 10}},
          {"decoder.layers.0.mlp.linear_fc2.weight", {6, 16}},
          {"decoder.final_layernorm.weight", {10}, ParamInit::Ones, false}};
}

// Tensor-parallel rank r of 2's slices: QKV rows by query group, [gate; up] rows in two
// segments, fc2 by columns; the norm whole.
std::vector<ParamInfo> tp_infos(int r) {
  std::vector<ParamInfo> infos = whole_infos();
  auto split = [&](ParamInfo& p, int dim, std::vector<ShardSegment> segments) {
    p.global_shape = p.shape;
    p.shape[size_t(dim)] /= 2;
    p.shard_dim = dim;
    p.segments = std::move(segments);
  };
  split(infos[0], 0, {{0, 8 * r, 8}});
  split(infos[1], 0, {{0, 8 * r, 8}});
  split(infos[2], 0, {{0, 2 * r, 2}, {2, 4 + 2 * r, 2}});
  split(infos[3], 1, {{0, 8 * r, 8}});
  infos[4].tp_replicated = true;
  return infos;
}

OptimizerConfig config(OptimizerKind kind) {
  OptimizerConfig c;
  c.kind = kind;
  c.weight_decay = 0.1;
  c.zoo.adam8bit_min_8bit_size = 32;   // the matrices take 8-bit states
  c.zoo.adam8bit_block_size = 16;      // blocks that shards and slices cut
  c.zoo.qkv_split_shapes = {2, 1, 1};  // four query groups of one key and value head
  c.zoo.galore_rank = 3, c.zoo.galore_update_proj_gap = 2;  // new projections at steps 1, 3, 5
  c.zoo.shampoo_update_freq = 2;             // roots at steps 2 and 4, preconditioned from 2 on
  c.zoo.shampoo_max_preconditioner_dim = 8;  // blocks cut the longer sides
  return c;
}

float value(int64_t k, int64_t i) {
  return float(std::sin(double(i * 7 + k * 3))) * 0.2f;
}
float grad(int step, int64_t k, int64_t i) {
  return float(std::cos(double(i * 13 + k * 5 + step * 11))) * 0.05f;
}

void set_values(ParameterSet<float>& params) {
  for (size_t k = 0; k < params.infos().size(); ++k) {
    const ParamInfo& p = params.infos()[k];
    for (int64_t i = 0; i < p.numel; ++i) params.values()[p.offset + i] = value(int64_t(k), i);
  }
}

void set_grads(ParameterSet<float>& params, int step) {
  for (size_t k = 0; k < params.infos().size(); ++k) {
    const ParamInfo& p = params.infos()[k];
    for (int64_t i = 0; i < p.numel; ++i) params.grads()[p.offset + i] = grad(step, int64_t(k), i);
  }
}

// The one-rank run.
struct Reference {
  ParameterSet<float> params{whole_infos()};
  Optimizer<float> opt;
  explicit Reference(OptimizerKind kind) : opt(config(kind), params) { set_values(params); }
  // Fed what the reduce-scatter of `ranks` equal gradients leaves: sum of g x float(1/ranks).
  void steps(int from, int to, int ranks) {
    for (int s = from; s < to; ++s) {
      set_grads(params, s);
      const float scale = float(1.0 / ranks);
      for (int64_t i = 0; i < params.size(); ++i) {
        volatile float part = params.grads()[i] * scale;  // volatile: no fused multiply-add
        float sum = part;
        for (int r = 1; r < ranks; ++r) sum += part;
        params.grads()[i] = sum;
      }
      opt.step(params, 1e-2);
    }
  }
};

// Parameters, whole state buffers and scalars, as a checkpoint holds them.
struct Saved {
  std::vector<float> values;
  std::map<std::string, std::vector<float>> states;
  std::map<std::string, double> scalars;
};

double largest_difference(const ParameterSet<float>& a, const float* b) {
  double d = 0;
  for (const ParamInfo& p : a.infos())
    for (int64_t i = 0; i < p.numel; ++i)
      d = std::max(d, double(std::abs(a.values()[p.offset + i] - b[p.offset + i])));
  return d;
}

// Steps [from, to) of the distributed optimizer on `ranks` ranks (each rank's gradient the
// reference's, so their average is too), from `saved` when from > 0; returns the largest
// parameter difference from `ref` and what a checkpoint would hold afterwards.
double run_sharded(OptimizerKind kind, int ranks, double bucket, int from, int to,
                   const Reference& ref, Saved& saved) {
  double worst = 0;
  std::mutex mu;
  run_ranks(ranks, [&](Communicator& world) {
    ParameterSet<float> params(whole_infos());
    set_values(params);
    if (from > 0) std::copy(saved.values.begin(), saved.values.end(), params.values());
    // Small buckets: shard ranges start and end inside tensors and adam8bit's blocks.
    DataParallelBuckets<float> ddp(world, params, bucket, GradReduce::ReduceScatter);
    DistributedOptimizer<float> opt(config(kind), ddp, params);
    if (from > 0) {
      for (const std::string& name : opt.state_names())
        opt.load_state(name, saved.states.at(name).data());
      for (const std::string& name : opt.scalar_names()) opt.scalar(name) = saved.scalars.at(name);
      opt.set_steps(from);
    }
    for (int s = from; s < to; ++s) {
      set_grads(params, s);
      for (const ParamInfo& p : params.infos()) ddp.mark_ready(p.offset, p.offset + p.numel);
      ddp.finish();
      opt.step(params, 1e-2);
    }
    Saved out;
    out.values.assign(params.values(), params.values() + params.size());
    for (const std::string& name : opt.state_names()) {
      out.states[name].resize(size_t(params.size()));
      opt.gather_state(name, out.states[name].data());
    }
    for (const std::string& name : opt.scalar_names()) out.scalars[name] = opt.scalar(name);
    const double diff = largest_difference(params, ref.params.values());
    std::lock_guard<std::mutex> lk(mu);
    worst = std::max(worst, diff);
    if (world.rank() == 0) saved = out;
  });
  return worst;
}

double tolerance(OptimizerKind kind) {
  return kind == OptimizerKind::Lamb ? 1e-6 : 0.0;
}

TEST(ZooShards, TensorParallelSlicesMatchOneRank) {
  for (OptimizerKind kind : kZoo) {
    Reference ref(kind);
    ref.steps(0, 4, 1);
    double worst = 0;
    std::mutex mu;
    run_ranks(2, [&](Communicator& tp) {
      // This rank's slices of the reference's starting values and of its gradients.
      ParameterSet<float> whole(whole_infos()), params(tp_infos(tp.rank()));
      set_values(whole);
      auto take = [&](const float* from, float* to) {
        for (size_t k = 0; k < params.infos().size(); ++k) {
          const ParamInfo& p = params.infos()[k];
          ParameterSet<float>::for_each_run(p, [&](int64_t l, int64_t g, int64_t n) {
            std::copy_n(from + whole.infos()[k].offset + g, n, to + p.offset + l);
          });
        }
      };
      take(whole.values(), params.values());
      Optimizer<float> opt(config(kind), params, {}, &tp);
      for (int s = 0; s < 4; ++s) {
        set_grads(whole, s);
        take(whole.grads(), params.grads());
        opt.step(params, 1e-2);
      }
      std::vector<float> want(size_t(params.size()));
      take(ref.params.values(), want.data());
      const double diff = largest_difference(params, want.data());
      std::lock_guard<std::mutex> lk(mu);
      worst = std::max(worst, diff);
    });
    std::printf("%s, TP 2: parameters within %.3g of one rank's slices\n", zoo_optimizer_name(kind),
                worst);
    EXPECT_LE(worst, tolerance(kind)) << zoo_optimizer_name(kind);
  }
}

TEST(ZooShards, DistributedOptimizerMatchesOneRankAndResumesAtAnotherSize) {
  std::vector<OptimizerKind> kinds(std::begin(kZoo), std::end(kZoo));
  // GaLore and Shampoo shard by whole tensors: each rank steps the tensors it holds pieces of
  // whole.
  for (OptimizerKind kind :
       {OptimizerKind::GaLoreAdamW, OptimizerKind::GaLoreAdamW8bit, OptimizerKind::Shampoo})
    kinds.push_back(kind);
  for (OptimizerKind kind : kinds) {
    const char* name = zoo_optimizer_name(kind);
    Reference ref(kind);
    ref.steps(0, 3, 2);
    Saved saved;
    const double first = run_sharded(kind, 2, 50, 0, 3, ref, saved);
    // The gathered state is the one-rank optimizer's (as checkpoints save it).
    double state_diff = 0;
    for (const std::string& s : ref.opt.state_names()) {
      const float* want = ref.opt.state_buffer(s);
      for (const ParamInfo& p : ref.params.infos())
        for (int64_t i = 0; i < p.numel; ++i)
          state_diff = std::max(
              state_diff,
              double(std::abs(saved.states.at(s)[size_t(p.offset + i)] - want[p.offset + i])));
    }
    // Resumed at 3 ranks with other buckets.
    ref.steps(3, 5, 3);
    const double resumed = run_sharded(kind, 3, 30, 3, 5, ref, saved);
    std::printf(
        "%s, distributed optimizer: parameters within %.3g (DP 2) and %.3g (resumed at "
        "DP 3), state within %.3g of one rank\n",
        name, first, resumed, state_diff);
    EXPECT_LE(first, tolerance(kind)) << name;
    EXPECT_LE(resumed, tolerance(kind)) << name;
    EXPECT_LE(state_diff, tolerance(kind)) << name;
  }
}

// GaLore keeps its states only for the tensors a rank steps: the float ones (projection,
// exp_avg, exp_avg_sq, each shards_.size() floats) and the 8-bit variant's moments (its bytes
// less its projection, a third of the float variant's). Two ranks split the tensors in halves
// (one bucket) with one tensor cut, which both hold.
TEST(ZooShards, GaLoreStatesOnlyForTheTensorsARankHolds) {
  std::map<OptimizerKind, std::map<int, std::vector<int64_t>>> bytes;  // per world, per rank
  for (OptimizerKind kind : {OptimizerKind::GaLoreAdamW, OptimizerKind::GaLoreAdamW8bit})
    for (int ranks : {1, 2}) {
      bytes[kind][ranks].resize(size_t(ranks));
      run_ranks(ranks, [&](Communicator& world) {
        ParameterSet<float> params(whole_infos());
        DataParallelBuckets<float> ddp(world, params, 1000, GradReduce::ReduceScatter);
        DistributedOptimizer<float> opt(config(kind), ddp, params);
        bytes[kind][ranks][size_t(world.rank())] = opt.zoo()->state_bytes();
      });
    }
  const auto& f = bytes[OptimizerKind::GaLoreAdamW];
  const auto& q = bytes[OptimizerKind::GaLoreAdamW8bit];
  auto moments = [&](int ranks, int r) { return q.at(ranks)[r] - f.at(ranks)[r] / 3; };
  for (int r = 0; r < 2; ++r) {
    std::printf(
        "rank %d of 2: galoreadamw's states %lld of one rank's %lld bytes, "
        "galoreadamw8bit's moments %lld of %lld\n",
        r, (long long)f.at(2)[r], (long long)f.at(1)[0], (long long)moments(2, r),
        (long long)moments(1, 0));
    EXPECT_LT(double(f.at(2)[r]), 0.8 * double(f.at(1)[0])) << "rank " << r;
    EXPECT_LT(double(moments(2, r)), 0.9 * double(moments(1, 0))) << "rank " << r;
  }
}

}  // namespace
}  // namespace omni
