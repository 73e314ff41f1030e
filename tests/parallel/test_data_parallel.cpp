// Data-parallel gradient buckets against a serial reference: every bucket layout, overlap
// order and mode gives each rank exactly Megatron's result, sum over ranks in rank order of
// (gradient x 1/ranks).
#include <gtest/gtest.h>

#include <algorithm>
#include <mutex>
#include <random>
#include <vector>

#include "base/error.h"
#include "comm/local_communicator.h"
#include "parallel/data_parallel.h"

namespace {

using omni::DataParallelBuckets;
using omni::GradReduce;
using omni::ParamInfo;
using omni::ParameterSet;

// Offsets (16-element aligned): a 0, b 16, c 48, d 96, e 112; 160 elements in all.
std::vector<ParamInfo> infos() {
  return {{"a", {5}}, {"b", {3, 7}}, {"c", {33}}, {"d", {1}}, {"e", {4, 10}}};
}

// Rank r's local gradient at element i: varied magnitudes so summation order shows.
float local_grad(int r, int64_t i) { return float((i * 7919 + r * 104729) % 1000) * 1e-3f + r; }

void fill(ParameterSet<float>& p, int r) {
  for (int64_t i = 0; i < p.size(); ++i) p.grads()[i] = local_grad(r, i);
}

std::vector<float> reference(int ranks, int64_t n) {
  const float scale = float(1.0 / ranks);
  std::vector<float> ref(n);
  for (int64_t i = 0; i < n; ++i) {
    // Each product rounded to float before the sum (volatile: no fused multiply-add).
    volatile float scaled = local_grad(0, i) * scale;
    float s = scaled;
    for (int r = 1; r < ranks; ++r) {
      scaled = local_grad(r, i) * scale;
      s += scaled;
    }
    ref[i] = s;
  }
  return ref;
}

TEST(DataParallelBuckets, BucketsAreLaidFromTheEndAtParameterBoundaries) {
  ParameterSet<float> params(infos());
  ASSERT_EQ(params.size(), 160);
  auto self = omni::make_self_communicator();
  DataParallelBuckets<float> ddp(*self, params, 40, GradReduce::AllReduce);
  // e alone reaches 48 >= 40; d + c reach 64; b + a are what is left.
  ASSERT_EQ(ddp.buckets().size(), 3u);
  EXPECT_EQ(ddp.buckets()[0].begin, 112);
  EXPECT_EQ(ddp.buckets()[0].end, 160);
  EXPECT_EQ(ddp.buckets()[1].begin, 48);
  EXPECT_EQ(ddp.buckets()[1].end, 112);
  EXPECT_EQ(ddp.buckets()[2].begin, 0);
  EXPECT_EQ(ddp.buckets()[2].end, 48);
  DataParallelBuckets<float> one(*self, params, 0, GradReduce::AllReduce);
  ASSERT_EQ(one.buckets().size(), 1u);
  EXPECT_EQ(one.buckets()[0].end, 160);
}

TEST(DataParallelBuckets, StartFirstMovesARangesBucketsToTheFrontOfTheStartOrder) {
  omni::run_ranks(2, [&](omni::Communicator& world) {
    ParameterSet<float> params(infos());
    // Buckets [112, 160), [48, 112), [0, 48) (as above); [0, 48) starts first once marked.
    DataParallelBuckets<float> ddp(world, params, 40, GradReduce::AllReduce);
    EXPECT_EQ(ddp.start_order(), (std::vector<size_t>{0, 1, 2}));
    ddp.start_first(0, 48);
    EXPECT_EQ(ddp.start_order(), (std::vector<size_t>{2, 0, 1}));
    EXPECT_THROW(ddp.start_first(0, 60), omni::InternalError);  // cuts [48, 112)
    float* g = params.grads();
    for (int64_t i = 0; i < params.size(); ++i) g[i] = float(world.rank() + 1);
    ddp.mark_ready(0, 48);  // started: averaged once finish() waits, whatever comes after
    ddp.mark_ready(48, 160);
    ddp.finish();
    for (int64_t i = 0; i < params.size(); ++i) EXPECT_EQ(g[i], 1.5f) << i;
  });
}

TEST(DataParallelBuckets, DefaultBucketSizeIsAnEighthWithinMegatronsAndOneMillion) {
  EXPECT_EQ(omni::default_bucket_size(30'000'000, 2), 3'750'000);      // bench_parallel's GPT-2
  EXPECT_EQ(omni::default_bucket_size(4'000'000, 2), 1'000'000);       // at least 1M
  EXPECT_EQ(omni::default_bucket_size(7'000'000'000, 8), 40'000'000);  // Megatron's above 320M
  EXPECT_EQ(omni::default_bucket_size(7'000'000'000, 64), 64'000'000);
}

TEST(DataParallelBuckets, AllReduceEqualsTheAverageOverRanksForEveryBucketSize) {
  for (int ranks : {2, 3}) {
    for (double bucket : {0.0, 1.0, 40.0, 100.0}) {
      const std::vector<float> ref = reference(ranks, 160);
      omni::run_ranks(ranks, [&](omni::Communicator& world) {
        ParameterSet<float> params(infos());
        DataParallelBuckets<float> ddp(world, params, bucket, GradReduce::AllReduce);
        for (int step = 0; step < 2; ++step) {  // finish() leaves it ready for the next step
          fill(params, world.rank());
          for (const ParamInfo& p : params.infos()) ddp.mark_ready(p.offset, p.offset + p.numel);
          ddp.finish();
          for (int64_t i = 0; i < params.size(); ++i)
            ASSERT_EQ(params.grads()[i], ref[i]) << "element " << i << " bucket " << bucket;
        }
      });
    }
  }
}

TEST(DataParallelBuckets, OverlapOrderDoesNotChangeResults) {
  const std::vector<float> ref = reference(3, 160);
  omni::run_ranks(3, [&](omni::Communicator& world) {
    ParameterSet<float> params(infos());
    DataParallelBuckets<float> ddp(world, params, 1, GradReduce::AllReduce);
    fill(params, world.rank());
    std::vector<ParamInfo> order = params.infos();
    // Rank 0 marks backward order, rank 1 forward order, rank 2 shuffled and leaves one
    // parameter for finish() to start.
    if (world.rank() == 0) std::reverse(order.begin(), order.end());
    if (world.rank() == 2) {
      std::shuffle(order.begin(), order.end(), std::mt19937(5));
      order.pop_back();
    }
    for (const ParamInfo& p : order) ddp.mark_ready(p.offset, p.offset + p.numel);
    ddp.finish();
    for (int64_t i = 0; i < params.size(); ++i) ASSERT_EQ(params.grads()[i], ref[i]) << i;
  });
}

TEST(DataParallelBuckets, ARangeOfSeveralParametersAtOnce) {
  const std::vector<float> ref = reference(2, 160);
  omni::run_ranks(2, [&](omni::Communicator& world) {
    ParameterSet<float> params(infos());
    DataParallelBuckets<float> ddp(world, params, 40, GradReduce::AllReduce);
    fill(params, world.rank());
    ddp.mark_ready(48, 160);  // c, d, e: the first two buckets start here
    ddp.mark_ready(0, 48);
    ddp.finish();
    for (int64_t i = 0; i < params.size(); ++i) ASSERT_EQ(params.grads()[i], ref[i]) << i;
  });
}

TEST(DataParallelBuckets, MarkingPartOfAParameterIsAnError) {
  ParameterSet<float> params(infos());
  auto self = omni::make_self_communicator();
  DataParallelBuckets<float> ddp(*self, params, 40, GradReduce::AllReduce);
  EXPECT_THROW(ddp.mark_ready(20, 160), omni::InternalError);
  ddp.mark_ready(112, 160);
  EXPECT_THROW(ddp.mark_ready(112, 160), omni::InternalError);
}

TEST(DataParallelBuckets, ReduceScatterGivesEachRankItsShardAndShardsTileTheBuffer) {
  for (int ranks : {2, 3}) {
    for (double bucket : {0.0, 40.0, 1.0}) {
      const std::vector<float> ref = reference(ranks, 160);
      std::vector<int> owner(160, -1);
      std::mutex mu;
      omni::run_ranks(ranks, [&](omni::Communicator& world) {
        ParameterSet<float> params(infos());
        DataParallelBuckets<float> ddp(world, params, bucket, GradReduce::ReduceScatter);
        fill(params, world.rank());
        for (const ParamInfo& p : params.infos()) ddp.mark_ready(p.offset, p.offset + p.numel);
        ddp.finish();
        for (const omni::ShardRange& s : ddp.shard()) {
          for (int64_t i = s.begin; i < s.end; ++i) {
            ASSERT_EQ(params.grads()[i], ref[i]) << "rank " << world.rank() << " element " << i;
            std::lock_guard<std::mutex> lk(mu);
            EXPECT_EQ(owner[i], -1) << "element " << i << " owned twice";
            owner[i] = world.rank();
          }
        }
      });
      EXPECT_EQ(std::count(owner.begin(), owner.end(), -1), 0);
    }
  }
}

TEST(DataParallelBuckets, AllGatherSpreadsEveryRanksShard) {
  omni::run_ranks(3, [](omni::Communicator& world) {
    ParameterSet<double> params(infos());
    DataParallelBuckets<double> ddp(world, params, 40, GradReduce::ReduceScatter);
    std::vector<double> data(params.size(), -1.0);
    for (const omni::ShardRange& s : ddp.shard())
      for (int64_t i = s.begin; i < s.end; ++i) data[i] = 1000.0 * world.rank() + double(i);
    ddp.all_gather(data.data());
    // Rank r owns piece r of each bucket; the last rank also the remainder.
    for (const omni::GradBucket& b : ddp.buckets()) {
      for (int64_t i = b.begin; i < b.end; ++i) {
        const int64_t owner = b.piece == 0 ? 2 : std::min<int64_t>((i - b.begin) / b.piece, 2);
        ASSERT_EQ(data[i], 1000.0 * owner + double(i)) << "element " << i;
      }
    }
  });
}

}  // namespace
