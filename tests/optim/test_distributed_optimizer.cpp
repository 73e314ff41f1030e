// The distributed optimizer against Optimizer<T> on one rank fed the same reduced
// gradients (Megatron's average: each rank's gradient x 1/ranks, summed in rank order):
// parameters, gradient norm and gathered state, at 2 and 3 ranks (uneven shards).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>
#include <vector>

#include "comm/local_communicator.h"
#include "optim/distributed_optimizer.h"

namespace {

using omni::OptimizerConfig;
using omni::OptimizerKind;
using omni::ParamInfo;
using omni::ParameterSet;

// Offsets: w1 0 (63), b1 64 (9), w2 80 (33), norm 128 (16), w3 144 (25); 176 elements.
std::vector<ParamInfo> infos() {
  using omni::ParamInit;
  return {{"w1", {7, 9}},
          {"b1", {9}, ParamInit::Normal, false},
          {"w2", {33}},
          {"norm", {16}, ParamInit::Normal, false},
          {"w3", {5, 5}}};
}

void init(ParameterSet<float>& p) {
  for (int64_t i = 0; i < p.size(); ++i) p.values()[i] = float(std::sin(double(i))) * 0.1f;
}

float local_grad(int rank, int step, int64_t i) {
  return float((i * 31 + rank * 17 + step * 7) % 97 - 48) * 1e-2f;
}

// What the reduce-scatter leaves: sum over ranks, in rank order, of grad x float(1/ranks).
float averaged_grad(int ranks, int step, int64_t i) {
  const float scale = float(1.0 / ranks);
  volatile float scaled = local_grad(0, step, i) * scale;  // volatile: no fused multiply-add
  float s = scaled;
  for (int r = 1; r < ranks; ++r) {
    scaled = local_grad(r, step, i) * scale;
    s += scaled;
  }
  return s;
}

double lr_at(int step) { return 1e-2 * (1.0 + 0.5 * step); }

OptimizerConfig config(OptimizerKind kind, double clip) {
  OptimizerConfig c;
  c.kind = kind;
  c.weight_decay = 0.1;
  c.clip_grad = clip;
  return c;
}

// Megatron's clipping, as the trainer applies it.
double clip_coefficient(const OptimizerConfig& c, double norm) {
  return c.clip_grad > 0 ? c.clip_grad / (norm + 1e-6) : 1.0;
}

struct Reference {
  ParameterSet<float> params{infos()};
  omni::Optimizer<float> opt;
  std::vector<double> norms;
  explicit Reference(const OptimizerConfig& c) : opt(c, params) { init(params); }
  void steps(const OptimizerConfig& c, int ranks, int from, int to) {
    for (int s = from; s < to; ++s) {
      for (int64_t i = 0; i < params.size(); ++i) params.grads()[i] = averaged_grad(ranks, s, i);
      norms.push_back(omni::gradient_norm(params));
      if (const double k = clip_coefficient(c, norms.back()); k < 1.0)
        omni::scale_gradients(params, k);
      opt.step(params, lr_at(s));
    }
  }
};

// Runs steps [from, to) on `ranks` ranks; optionally loads `state` (full buffers by name)
// first and gathers it afterwards. Returns the largest parameter difference from `ref`.
double run_distributed(int ranks, double bucket, const OptimizerConfig& c, int from, int to,
                       const Reference& ref, std::map<std::string, std::vector<float>>* state,
                       double* largest_norm_error = nullptr) {
  double worst = 0;
  std::mutex mu;
  omni::run_ranks(ranks, [&](omni::Communicator& world) {
    ParameterSet<float> params(infos());
    init(params);
    if (from > 0)  // resuming from the parameters saved with the state
      for (int64_t i = 0; i < params.size(); ++i) params.values()[i] = state->at("values")[i];
    omni::DataParallelBuckets<float> ddp(world, params, bucket, omni::GradReduce::ReduceScatter);
    omni::DistributedOptimizer<float> opt(c, ddp, params);
    if (from > 0) {
      for (const std::string& name : opt.state_names()) opt.load_state(name, state->at(name).data());
      opt.set_steps(from);
    }
    for (int s = from; s < to; ++s) {
      for (int64_t i = 0; i < params.size(); ++i) params.grads()[i] = local_grad(world.rank(), s, i);
      for (const ParamInfo& p : params.infos()) ddp.mark_ready(p.offset, p.offset + p.numel);
      ddp.finish();
      const double norm = opt.gradient_norm(params);
      if (largest_norm_error) {
        std::lock_guard<std::mutex> lk(mu);
        *largest_norm_error = std::max(*largest_norm_error,
                                       std::abs(norm - ref.norms.at(s)) / ref.norms.at(s));
      }
      if (const double k = clip_coefficient(c, norm); k < 1.0) opt.scale_gradients(params, k);
      opt.step(params, lr_at(s));
    }
    double diff = 0;
    for (int64_t i = 0; i < params.size(); ++i)
      diff = std::max(diff, double(std::abs(params.values()[i] - ref.params.values()[i])));
    std::map<std::string, std::vector<float>> gathered;
    for (const std::string& name : opt.state_names()) {
      gathered[name].resize(params.size());
      opt.gather_state(name, gathered[name].data());
    }
    std::lock_guard<std::mutex> lk(mu);
    worst = std::max(worst, diff);
    if (state && world.rank() == 0) {
      *state = gathered;
      (*state)["values"].assign(params.values(), params.values() + params.size());
    }
  });
  return worst;
}

TEST(DistributedOptimizer, MatchesTheUnshardedOptimizerBitForBit) {
  for (OptimizerKind kind : {OptimizerKind::AdamW, OptimizerKind::SGD}) {
    for (int ranks : {2, 3}) {
      for (double bucket : {0.0, 40.0}) {
        const OptimizerConfig c = config(kind, 0.0);
        Reference ref(c);
        ref.steps(c, ranks, 0, 6);
        const double diff = run_distributed(ranks, bucket, c, 0, 6, ref, nullptr);
        EXPECT_EQ(diff, 0.0) << "optimizer " << int(kind) << ", " << ranks << " ranks, bucket "
                             << bucket;
      }
    }
  }
}

TEST(DistributedOptimizer, GradientNormAndClippingMatch) {
  for (int ranks : {2, 3}) {
    const OptimizerConfig c = config(OptimizerKind::AdamW, 0.05);  // clips every step
    Reference ref(c);
    ref.steps(c, ranks, 0, 6);
    double norm_error = 0;
    const double diff = run_distributed(ranks, 40, c, 0, 6, ref, nullptr, &norm_error);
    std::printf("%d ranks, clipped AdamW: gradient norm within %.3g relative, parameters within "
                "%.3g\n", ranks, norm_error, diff);
    EXPECT_LT(norm_error, 1e-12);
    EXPECT_LT(diff, 1e-6);
  }
}

TEST(DistributedOptimizer, StateGathersLikeTheUnshardedOneAndResumesAtAnotherSize) {
  for (OptimizerKind kind : {OptimizerKind::AdamW, OptimizerKind::SGD}) {
    const OptimizerConfig c = config(kind, 0.0);
    Reference ref(c);
    ref.steps(c, 2, 0, 3);
    std::map<std::string, std::vector<float>> state;
    ASSERT_EQ(run_distributed(2, 40, c, 0, 3, ref, &state), 0.0);
    for (const std::string& name : ref.opt.state_names()) {
      const float* want = ref.opt.state_buffer(name);
      for (int64_t i = 0; i < ref.params.size(); ++i)
        ASSERT_EQ(state.at(name)[i], want[i]) << name << " element " << i;
    }
    // Saved at 2 ranks, resumed at 3 with other buckets; the reference goes on from the
    // same point with the 3-rank average of the gradients.
    ref.steps(c, 3, 3, 6);
    const double diff = run_distributed(3, 0, c, 3, 6, ref, &state);
    EXPECT_EQ(diff, 0.0) << "optimizer " << int(kind);
  }
}

}  // namespace
