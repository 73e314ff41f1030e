// Blending as Megatron-Core computes it (shared/specs/megatron-data.md, "Blending").
#include <gtest/gtest.h>

#include <fstream>
#include <vector>

#include "base/error.h"
#include "data/datasets/blended_dataset.h"

namespace {

TEST(BlendPlan, EqualWeightsAlternateWithTiesToTheLowerIndex) {
  const std::vector<double> w = {1, 1};
  omni::BlendPlan p = omni::plan_blend(w, 6);
  EXPECT_EQ(p.dataset_index, (std::vector<int16_t>{0, 1, 0, 1, 0, 1}));
  EXPECT_EQ(p.dataset_sample_index, (std::vector<int64_t>{0, 0, 1, 1, 2, 2}));
}

TEST(BlendPlan, InterleaveFollowsTheLargestWeightedDeficit) {
  // By hand, errors w_i * max(k, 1) - taken_i: k=0 .25/.75 -> 1; k=1 .25/-.25 -> 0;
  // k=2 -.5/.5 -> 1; k=3 -.25/.25 -> 1; k=4 0/0 -> 0 (tie); k=5..7 -.75/.75, -.5/.5, -.25/.25 -> 1.
  const std::vector<double> w = {1, 3};
  omni::BlendPlan p = omni::plan_blend(w, 8);
  EXPECT_EQ(p.targets, (std::vector<int64_t>{2, 6}));
  EXPECT_EQ(p.dataset_index, (std::vector<int16_t>{1, 0, 1, 1, 0, 1, 1, 1}));
}

TEST(BlendPlan, HoldsTheSumOfCeiledTargetsNotTheRequestedCount) {
  const std::vector<double> w = {1, 1, 1};
  omni::BlendPlan p = omni::plan_blend(w, 1000);
  EXPECT_EQ(p.targets, (std::vector<int64_t>{334, 334, 334}));
  EXPECT_EQ(p.dataset_index.size(), 1002u);
}

TEST(BlendPlan, DatasetsAreBuiltWithTheHalfPercentMarginInDoubleArithmetic) {
  // 200 * 1.005 = 200.99999999999997 in double, so the size is 201, not 202.
  const std::vector<double> w = {0.5, 0.5};
  omni::BlendPlan p = omni::plan_blend(w, 400);
  EXPECT_EQ(p.targets[0], 200);
  EXPECT_EQ(p.dataset_sizes[0], 201);
}

TEST(BlendPlan, RejectsAllZeroWeights) {
  const std::vector<double> w = {0, 0};
  EXPECT_THROW(omni::plan_blend(w, 10), omni::UsageError);
}

TEST(DataPath, SinglePrefixIsUnweightedAndPairsAreWeighted) {
  bool weighted = true;
  auto one = omni::parse_data_path("/data/a_text_document", &weighted);
  EXPECT_FALSE(weighted);
  ASSERT_EQ(one.size(), 1u);
  auto two = omni::parse_data_path("0.3 /data/a 0.7 /data/b", &weighted);
  EXPECT_TRUE(weighted);
  ASSERT_EQ(two.size(), 2u);
  EXPECT_DOUBLE_EQ(two[1].weight, 0.7);
  EXPECT_EQ(two[1].prefix, "/data/b");
  auto single_weighted = omni::parse_data_path("1.0 /data/a", &weighted);
  EXPECT_TRUE(weighted);  // Megatron blends even a single weighted prefix
  EXPECT_THROW(omni::parse_data_path("0.3 /data/a 0.7", &weighted), omni::UsageError);
  EXPECT_THROW(omni::parse_data_path("/data/a /data/b", &weighted), omni::UsageError);
}

TEST(DataFileList, ReadsWeightPrefixCorpusLinesAndDropsBin) {
  const std::string path = ::testing::TempDir() + "omnitron_data_list.txt";
  {
    std::ofstream out(path);
    out << "# weight prefix corpus\n0.25 /data/books_text_document.bin books\n\n"
           "0.75 /data/web_text_document web\n";
  }
  auto list = omni::read_data_file_list(path);
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[0].prefix, "/data/books_text_document");
  EXPECT_DOUBLE_EQ(list[1].weight, 0.75);
  EXPECT_THROW(omni::read_data_file_list("/nonexistent/list"), omni::UsageError);
}

}  // namespace
