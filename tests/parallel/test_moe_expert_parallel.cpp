// Expert parallelism against the one-rank model, in float64 on in-process ranks: the
// expert-parallel ranks are data-parallel ranks (Megatron carves them out of data parallelism),
// each running its own micro-batches of the global batch, so the reference is one rank running
// every micro-batch. Dense gradients are averaged over the data-parallel group, the experts'
// summed over the expert-data-parallel group (the ranks holding the same experts) and divided
// by the data-parallel size, as Megatron's finalize_model_grads does. Every rank's parameters
// must be its slice of the one-rank model's, and loss and gradients equal to rounding, for
// both token dispatchers, dropless and with a capacity factor that drops tokens.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "base/error.h"
#include "comm/counting_communicator.h"
#include "model/moe_layer.h"
#include "parallel/expert_dispatch.h"
#include "parallel/layout_run.h"

namespace omni {
namespace {

using namespace layout_test;

// layout_run.h's four-layer MoE model, with a capacity factor (0: dropless).
TransformerConfig tiny_moe(const std::string& dispatcher, double capacity_factor = 0) {
  TransformerConfig c = moe_layout_config(dispatcher);
  c.moe_expert_capacity_factor = capacity_factor;
  c.validate();
  return c;
}

struct EpLayout {
  int ep = 2, dp = 2, pp = 1;
  bool recompute = false;  // full recompute of every layer (the dispatch runs again)
};

// One step on dp * pp ranks (kMicroBatches micro-batches split over the data-parallel ranks);
// checks every rank against `ref` (which ran them all) and returns the loss.
double run_expert_parallel(const TransformerConfig& cfg, const EpLayout& l, const Data& data,
                           const GPTModel<double>& ref) {
  const int world = l.dp * l.pp, per_rank = kMicroBatches / l.dp;
  std::vector<RankResult<double>> results(world);
  run_ranks(world, [&](Communicator& w) {
    ProcessGrid grid(w, ParallelLayout{.ep = l.ep, .pp = l.pp});
    PipelineSplit split;
    split.num_layers = cfg.num_layers;
    split.pipeline_model_parallel_size = l.pp;
    ModelParallel mp;
    mp.ep = &grid.ep();
    for (const LayerRange& r : pipeline_rank_layers(split, grid.pp_rank()))
      mp.chunks.push_back({r.begin, r.end});
    mp.pre_process = grid.is_first_stage(), mp.post_process = grid.is_last_stage();
    GPTModel<double> model(cfg, kBatch, kSeed, mp);
    if (l.recompute) model.set_recompute(Recompute{Recompute::Full, 0});
    PipelineExecutor<double> pipe(model, grid.pp());
    const int first = grid.dp_rank() * per_rank;
    auto batch = [&](int m) -> const MicroBatch& { return data.batches[first + m]; };
    double loss = pipe.run(per_rank, batch, true, 1.0 / per_rank);
    grid.dp().all_reduce(&loss, 1);
    ParameterSet<double>& ps = model.params();
    for (const ParamInfo& p : ps.infos()) {
      Communicator& group = is_expert_parameter(p.name) ? grid.expert_dp() : grid.dp();
      group.all_reduce(ps.grads() + p.offset, p.numel);
      for (int64_t i = 0; i < p.numel; ++i) ps.grads()[p.offset + i] /= grid.dp_size();
    }
    RankResult<double>& r = results[w.rank()];
    r.last_stage = grid.is_last_stage(), r.loss = loss / (grid.dp_size() * per_rank),
    r.infos = ps.infos();
    r.values.assign(ps.values(), ps.values() + ps.size());
    r.grads.assign(ps.grads(), ps.grads() + ps.size());
  });
  double loss = NAN, worst = 0;
  for (const RankResult<double>& r : results) {
    if (r.last_stage) loss = r.loss;
    for (const ParamInfo& p : r.infos) {
      const ParamInfo& full = ref.params().info(p.name);
      ParameterSet<double>::for_each_run(p, [&](int64_t local, int64_t global, int64_t n) {
        for (int64_t i = 0; i < n; ++i) {
          EXPECT_EQ(r.values[p.offset + local + i], ref.params().values()[full.offset + global + i])
              << p.name;
          const double g = ref.params().grads()[full.offset + global + i];
          worst =
              std::max(worst, std::abs(r.grads[p.offset + local + i] - g) / (std::abs(g) + 1e-3));
        }
      });
    }
  }
  EXPECT_LT(worst, 1e-9);
  return loss;
}

void check_expert_parallel(const EpLayout& l, double capacity_factor = 0) {
  for (const char* dispatcher : {"alltoall", "allgather"}) {
    SCOPED_TRACE(dispatcher);
    const TransformerConfig cfg = tiny_moe(dispatcher, capacity_factor);
    const Data data = make_data(cfg, false);
    GPTModel<double> ref(cfg, kBatch, kSeed);
    double ref_loss = 0;
    for (const MicroBatch& mb : data.batches)
      ref_loss += ref.forward_backward(mb, 1.0 / kMicroBatches) / kMicroBatches;
    const double loss = run_expert_parallel(cfg, l, data, ref);
    EXPECT_NEAR(loss, ref_loss, 1e-12 * std::abs(ref_loss));
  }
}

TEST(MoEExpertParallel, Ep2) {
  check_expert_parallel({.ep = 2, .dp = 2});
}
TEST(MoEExpertParallel, Ep4) {
  check_expert_parallel({.ep = 4, .dp = 4});
}
TEST(MoEExpertParallel, Ep2TimesDp2) {
  check_expert_parallel({.ep = 2, .dp = 4});
}
TEST(MoEExpertParallel, Ep2TimesPipeline2) {
  check_expert_parallel({.ep = 2, .dp = 2, .pp = 2});
}
TEST(MoEExpertParallel, Ep2TimesPipeline2FullRecompute) {
  check_expert_parallel({.ep = 2, .dp = 2, .pp = 2, .recompute = true});
}
TEST(MoEExpertParallel, Ep2WithCapacityDrops) {
  check_expert_parallel({.ep = 2, .dp = 2}, 1.0);
}

// The exchange of expert tensor parallelism wider than TP (parallel/expert_dispatch.h) on 3
// ranks with 2 local experts, rank r holding r + l + (l == 1 && r == 1 ? -2 : 0) rows of
// expert l (rank 1 none of expert 1), each row one value (100 r + its index): gathered
// expert-major, the ranks in order within each expert; then each rank's contribution to every
// gathered row (the row's value times r + 1) summed back to the row's owner, in rank order.
TEST(MoEExpertParallel, ExpertTensorExchangeGathersExpertMajorAndSumsBackToTheOwners) {
  const int n = 3, L = 2;
  auto rows_of = [](int r, int l) { return r + l + (l == 1 && r == 1 ? -2 : 0); };
  run_ranks(n, [&](Communicator& w) {
    const int me = w.rank();
    std::vector<int32_t> offsets{0};
    for (int l = 0; l < L; ++l) offsets.push_back(offsets.back() + rows_of(me, l));
    std::vector<double> mine(size_t(offsets.back()));
    for (size_t i = 0; i < mine.size(); ++i) mine[i] = 100.0 * me + double(i);
    ExpertTensorExchange x(w, offsets.data(), L);
    std::vector<double> want;  // expert-major, ranks in order
    std::vector<int32_t> want_offsets{0};
    for (int l = 0; l < L; ++l) {
      for (int r = 0; r < n; ++r) {
        const int first = l == 0 ? 0 : rows_of(r, 0);
        for (int i = 0; i < rows_of(r, l); ++i) want.push_back(100.0 * r + first + i);
      }
      want_offsets.push_back(int32_t(want.size()));
    }
    ASSERT_EQ(x.own_rows(), offsets.back());
    ASSERT_EQ(x.rows(), int(want.size()));
    EXPECT_EQ(x.expert_offsets(), want_offsets);
    std::vector<double> all(want.size()), staging(size_t(x.staging_rows()));
    x.gather(all.data(), mine.data(), 1, ops::Exec{}, staging.data());
    EXPECT_EQ(all, want);
    for (double& v : all) v *= me + 1;  // this rank's part of every gathered row
    std::vector<double> back(mine.size());
    x.reduce_scatter(back.data(), all.data(), 1, ops::Exec{}, staging.data());
    for (size_t i = 0; i < mine.size(); ++i) EXPECT_EQ(back[i], mine[i] * (1 + 2 + 3)) << i;
  });
}

// CountingCommunicator with every send's and receive's count and bytes per peer.
class PeerCountingCommunicator : public CountingCommunicator {
 public:
  using CountingCommunicator::CountingCommunicator;
  struct Messages {
    int sends = 0, receives = 0;
    size_t sent = 0, received = 0;  // bytes
  };
  std::map<int, Messages> peers;
  std::unique_ptr<CommRequest> isend(const void* data, size_t bytes, int peer, int tag) override {
    ++peers[peer].sends, peers[peer].sent += bytes;
    return CountingCommunicator::isend(data, bytes, peer, tag);
  }
  std::unique_ptr<CommRequest> irecv(void* data, size_t bytes, int peer, int tag) override {
    ++peers[peer].receives, peers[peer].received += bytes;
    return CountingCommunicator::irecv(data, bytes, peer, tag);
  }
};

// The exchange sends one message to each other rank and receives one from each, per gather
// and per reduce-scatter, whatever the number of local experts (3 here, every rank holding
// 1 + r + l rows of expert l, 2 values each), with each rank's rows' bytes, and its results are
// the rows gathered expert-major and their sum back in rank order.
TEST(MoEExpertParallel, ExpertTensorExchangeSendsOneMessagePerPeer) {
  const int n = 3, L = 3, width = 2;
  auto rows_of = [](int r, int l) { return 1 + r + l; };
  auto total = [&](int r) { return rows_of(r, 0) + rows_of(r, 1) + rows_of(r, 2); };
  run_ranks(n, [&](Communicator& w) {
    Tally tally;
    PeerCountingCommunicator counted(w, tally);
    const int me = w.rank();
    std::vector<int32_t> offsets{0};
    for (int l = 0; l < L; ++l) offsets.push_back(offsets.back() + rows_of(me, l));
    std::vector<double> mine(size_t(offsets.back()) * width);
    for (size_t i = 0; i < mine.size(); ++i) mine[i] = 1000.0 * me + double(i);
    ExpertTensorExchange x(counted, offsets.data(), L);
    std::vector<double> all(size_t(x.rows()) * width);
    std::vector<double> staging(size_t(x.staging_rows()) * width);
    counted.peers.clear();
    tally.on = true;
    // One message to and one from each other rank per call, of this rank's rows one way and
    // the other rank's the other.
    auto expect_one_each_way = [&](const char* call, bool to_mine) {
      const size_t row = width * sizeof(double);
      for (int r = 0; r < n; ++r) {
        if (r == me) continue;
        const PeerCountingCommunicator::Messages& m = counted.peers[r];
        EXPECT_EQ(m.sends, 1) << call << " to " << r;
        EXPECT_EQ(m.receives, 1) << call << " from " << r;
        EXPECT_EQ(m.sent, size_t(total(to_mine ? me : r)) * row) << call << " to " << r;
        EXPECT_EQ(m.received, size_t(total(to_mine ? r : me)) * row) << call << " from " << r;
      }
      EXPECT_EQ(counted.peers.count(me), 0u);
      counted.peers.clear();
    };
    x.gather(all.data(), mine.data(), width, ops::Exec{}, staging.data());
    expect_one_each_way("gather", true);  // this rank's rows out, the others' in
    // Expert-major, ranks in order within an expert.
    size_t at = 0;
    for (int l = 0; l < L; ++l)
      for (int r = 0; r < n; ++r) {
        const int first = l == 0 ? 0 : rows_of(r, 0) + (l == 2 ? rows_of(r, 1) : 0);
        for (int i = 0; i < rows_of(r, l) * width; ++i)
          EXPECT_EQ(all[at++], 1000.0 * r + first * width + i) << l << " " << r << " " << i;
      }
    for (size_t i = 0; i < all.size(); ++i) all[i] = all[i] / (me + 1) + 0.1 * (me + 1);
    std::vector<double> back(mine.size());
    x.reduce_scatter(back.data(), all.data(), width, ops::Exec{}, staging.data());
    expect_one_each_way("reduce-scatter", false);  // the others' rows out, this rank's in
    // The tally's count of sends, both calls: one per peer each.
    ASSERT_EQ(tally.entries.size(), 1u);
    EXPECT_EQ(tally.entries.begin()->second.calls, 2 * (n - 1));
    for (size_t i = 0; i < mine.size(); ++i) {  // rank 0's part plus rank 1's, then rank 2's
      double want = mine[i] / 1 + 0.1 * 1;
      for (int r = 1; r < n; ++r) want = want + (mine[i] / (r + 1) + 0.1 * (r + 1));
      EXPECT_EQ(back[i], want) << i;
    }
  });
}

// Capacity drops at ETP 2 x EP 2 over DP 4 (TP 1): each rank drops over its own tokens
// before the exchange, as the one rank running its micro-batch does.
TEST(MoEExpertParallel, ExpertTensor2WithCapacityDrops) {
  for (const char* dispatcher : {"alltoall", "allgather"}) {
    SCOPED_TRACE(dispatcher);
    const TransformerConfig cfg = tiny_moe(dispatcher, 1.0);
    const Data data = make_data(cfg, false);
    GPTModel<double> ref(cfg, kBatch, kSeed);
    double ref_loss = 0;
    for (const MicroBatch& mb : data.batches)
      ref_loss += ref.forward_backward(mb, 1.0 / kMicroBatches);
    const std::vector<RankResult<double>> ranks = run_layout<double>(
        cfg, Layout{.ep = 2, .dp = 4, .etp = 2}, data, [](int) { return ops::Exec{}; });
    double worst = 0;
    for (const RankResult<double>& r : ranks)
      for (const ParamInfo& p : r.infos) {
        const ParamInfo& full = ref.params().info(p.name);
        ParameterSet<double>::for_each_run(p, [&](int64_t local, int64_t global, int64_t run) {
          for (int64_t i = 0; i < run; ++i) {
            const double g = ref.params().grads()[full.offset + global + i];
            worst =
                std::max(worst, std::abs(r.grads[p.offset + local + i] - g) / (std::abs(g) + 1e-3));
          }
        });
      }
    EXPECT_LT(worst, 1e-9);
    EXPECT_NEAR(ranks.back().loss, ref_loss, 1e-12 * std::abs(ref_loss));
  }
}

TEST(MoEExpertParallel, ExpertsNotDivisibleByTheGroupAreRefusedByName) {
  TransformerConfig cfg = tiny_moe("alltoall");
  cfg.num_moe_experts = 6;
  cfg.moe_router_topk = 2;
  std::string error;
  try {
    run_ranks(4, [&](Communicator& w) {
      ProcessGrid grid(w, ParallelLayout{.ep = 4});
      ModelParallel mp;
      mp.ep = &grid.ep();
      GPTModel<double> model(cfg, kBatch, kSeed, mp);
    });
  } catch (const UsageError& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("--num-experts (6) must be divisible by --expert-model-parallel-size (4)"),
            std::string::npos)
      << error;
}

TEST(MoEExpertParallel, ExpertGroupsFollowMegatronsOrder) {
  // World 8, PP 2, EP 2: data parallel 4 per stage; expert groups are consecutive data-parallel
  // ranks, expert-data-parallel groups the ranks EP apart.
  const ParallelLayout l{.ep = 2, .pp = 2};
  EXPECT_EQ(expert_rank_groups(8, l, "ep"),
            (std::vector<std::vector<int>>{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(expert_rank_groups(8, l, "edp"),
            (std::vector<std::vector<int>>{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
}

}  // namespace
}  // namespace omni
