// Prefetching changes when samples are read, never which.
#include <gtest/gtest.h>

#include <vector>

#include "base/error.h"
#include "data/datasets/dataset.h"
#include "data/datasets/prefetch.h"

namespace omni {
namespace {

// Samples 0..limit-1 of mock data; asking past the end throws, as MegatronData does.
class Limited final : public TrainingData {
 public:
  explicit Limited(int64_t limit) : limit_(limit), inner_(make_mock_data(50, 3)) {}
  void train_samples(int64_t first, int count, int seq, int32_t* tokens,
                     int32_t* labels) const override {
    OMNI_REQUIRE(first + count <= limit_, "past the end");
    inner_->train_samples(first, count, seq, tokens, labels);
  }
  void valid_samples(int64_t first, int count, int seq, int32_t* tokens,
                     int32_t* labels) const override {
    inner_->valid_samples(first, count, seq, tokens, labels);
  }
  std::string describe() const override { return "limited"; }

 private:
  int64_t limit_;
  std::unique_ptr<TrainingData> inner_;
};

TEST(Prefetch, InOrderAndOutOfOrderReadsEqualDirectReads) {
  PrefetchingData prefetching(std::make_unique<Limited>(100));
  Limited direct(100);
  std::vector<int32_t> a(4 * 8), b(4 * 8), la(4 * 8), lb(4 * 8);
  for (int64_t first : {0, 4, 8, 12, 40, 44, 4, 0}) {
    prefetching.train_samples(first, 4, 8, a.data(), la.data());
    direct.train_samples(first, 4, 8, b.data(), lb.data());
    EXPECT_EQ(a, b) << first;
    EXPECT_EQ(la, lb) << first;
  }
}

TEST(Prefetch, AFailedPrefetchSurfacesOnlyWhenItsSamplesAreAskedFor) {
  PrefetchingData prefetching(std::make_unique<Limited>(8));
  std::vector<int32_t> t(4 * 8), l(4 * 8);
  prefetching.train_samples(0, 4, 8, t.data(), l.data());
  prefetching.train_samples(4, 4, 8, t.data(), l.data());  // its prefetch of 8..11 fails
  prefetching.train_samples(0, 4, 8, t.data(), l.data());  // not asked for: fine
  prefetching.train_samples(4, 4, 8, t.data(), l.data());
  EXPECT_THROW(prefetching.train_samples(8, 4, 8, t.data(), l.data()), UsageError);
}

}  // namespace
}  // namespace omni

namespace omni {
namespace {

TEST(DataParallelSlice, RanksTogetherReadEachGlobalBatchOnceInMegatronsOrder) {
  // Global batch 8, micro batch 2, 2 ranks: 2 micro-steps; rank 0 reads 0-1 then 4-5,
  // rank 1 reads 2-3 then 6-7 (MegatronPretrainingSampler).
  EXPECT_EQ(micro_batch_first_sample(16, 0, 2, 0, 2), 16);
  EXPECT_EQ(micro_batch_first_sample(16, 0, 2, 1, 2), 18);
  EXPECT_EQ(micro_batch_first_sample(16, 1, 2, 0, 2), 20);
  EXPECT_EQ(micro_batch_first_sample(16, 1, 2, 1, 2), 22);
  std::vector<int> seen(8, 0);
  for (int step = 0; step < 2; ++step)
    for (int rank = 0; rank < 2; ++rank)
      for (int i = 0; i < 2; ++i) ++seen[micro_batch_first_sample(0, step, 2, rank, 2) + i];
  EXPECT_EQ(seen, std::vector<int>(8, 1));
  EXPECT_EQ(micro_batch_first_sample(16, 3, 4, 0, 1), 28);  // one rank: consecutive
}

}  // namespace
}  // namespace omni
