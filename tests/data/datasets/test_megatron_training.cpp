// Training from a Megatron indexed dataset (--data-path): the samples are GPTDataset's, and a
// model learns from them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

#include "config/options.h"
#include "data/datasets/blended_dataset.h"
#include "data/datasets/dataset.h"
#include "data/datasets/gpt_dataset.h"
#include "data/datasets/indexed_dataset.h"
#include "train/trainer.h"

namespace {

// 40 documents, each a run of the cycle 0, 1, ..., 9 of varying length and phase: every
// label is predictable from the token before it. One per test: ctest runs two tests at once.
std::string write_cyclic_dataset() {
  const std::string prefix = ::testing::TempDir() + "omnitron_cyclic_" +
                             ::testing::UnitTest::GetInstance()->current_test_info()->name();
  omni::IndexedDatasetWriter w(prefix, omni::IndexedDtype::kUInt16);
  for (int d = 0; d < 40; ++d) {
    std::vector<int32_t> doc(30 + d % 7);
    for (size_t i = 0; i < doc.size(); ++i) doc[i] = static_cast<int32_t>((d + i) % 10);
    w.add_document(doc);
  }
  w.finalize();
  return prefix;
}

omni::Options options(const std::string& prefix) {
  omni::Options o;
  omni::parse_options({"--data-path",
                       prefix,
                       "--vocab-size",
                       "10",
                       "--num-layers",
                       "1",
                       "--hidden-size",
                       "32",
                       "--num-attention-heads",
                       "2",
                       "--seq-length",
                       "16",
                       "--micro-batch-size",
                       "4",
                       "--train-iters",
                       "40",
                       "--lr",
                       "1e-2",
                       "--split",
                       "90,10,0",
                       "--eval-iters",
                       "2",
                       "--eval-interval",
                       "0",
                       "--no-progress"},
                      o);
  omni::finalize(o);
  return o;
}

TEST(MegatronTraining, TrainSamplesAreGPTDatasetSamplesInOrder) {
  const std::string prefix = write_cyclic_dataset();
  const omni::Options o = options(prefix);
  auto data =
      omni::make_megatron_data({{1.0, prefix}}, false, o.split, 16, o.seed, o.train_samples(),
                               o.valid_samples());
  auto indexed = std::make_shared<const omni::IndexedDataset>(prefix);
  auto ranges = omni::split_document_ranges(o.split, indexed->num_sequences());
  omni::GPTDataset reference(indexed, *ranges[0], o.train_samples(), 16,
                             static_cast<uint32_t>(o.seed));
  std::vector<int32_t> tokens(3 * 16), labels(3 * 16), expected(17);
  data->train_samples(5, 3, 16, tokens.data(), labels.data());
  for (int s = 0; s < 3; ++s) {
    reference.sample(5 + s, expected.data());
    for (int t = 0; t < 16; ++t) {
      EXPECT_EQ(tokens[s * 16 + t], expected[t]);
      EXPECT_EQ(labels[s * 16 + t], expected[t + 1]);
    }
  }
}

TEST(MegatronTraining, WeightedPrefixesInterleaveAsTheBlendPlanSays) {
  // Two prefixes of the same data with weights 1:3: blend sample k is sample
  // dataset_sample_index[k] of dataset dataset_index[k], each built for its own size.
  const std::string prefix = write_cyclic_dataset();
  const omni::Options o = options(prefix);
  auto data = omni::make_megatron_data({{1.0, prefix}, {3.0, prefix}}, true, o.split, 16, o.seed,
                                       o.train_samples(), o.valid_samples());
  const std::vector<double> w = {1.0, 3.0};
  const omni::BlendPlan plan = omni::plan_blend(w, o.train_samples());
  auto indexed = std::make_shared<const omni::IndexedDataset>(prefix);
  auto ranges = omni::split_document_ranges(o.split, indexed->num_sequences());
  std::vector<int32_t> tokens(16), labels(16), expected(17);
  for (int64_t k : {0, 1, 2, 7, 100}) {
    const int i = plan.dataset_index[k];
    omni::GPTDataset reference(indexed, *ranges[0], plan.dataset_sizes[i], 16,
                               static_cast<uint32_t>(o.seed));
    reference.sample(plan.dataset_sample_index[k], expected.data());
    data->train_samples(k, 1, 16, tokens.data(), labels.data());
    EXPECT_EQ(tokens, std::vector<int32_t>(expected.begin(), expected.end() - 1)) << k;
  }
}

TEST(MegatronTraining, ModelLearnsFromIndexedData) {
  const std::string prefix = write_cyclic_dataset();
  const omni::Options o = options(prefix);
  omni::Trainer t(o, omni::make_megatron_data({{1.0, prefix}}, false, o.split,
                                              o.model.seq_length, o.seed, o.train_samples(),
                                              o.valid_samples()));
  omni::MetricsSink sink("", false, nullptr);
  omni::TrainResult r = t.run(sink);
  EXPECT_NEAR(r.train_losses.front(), std::log(10.0), 0.3);
  ASSERT_EQ(r.val_losses.size(), 1u);
  // Labels cross document boundaries (where the cycle jumps), so a little loss remains.
  EXPECT_LT(r.val_losses.back().second, 0.7);
}

TEST(MegatronTraining, DataPathNeedsAVocabularySize) {
  omni::Options o;
  omni::parse_options({"--data-path", "/nonexistent/prefix"}, o);
  EXPECT_THROW(omni::finalize(o), omni::UsageError);
}

TEST(MegatronTraining, MissingPrefixIsNamed) {
  try {
    omni::make_megatron_data({{1.0, "/nonexistent/prefix"}}, false, "969,30,1", 8, 1, 10, 0);
    FAIL() << "no error for a missing dataset";
  } catch (const omni::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/prefix"), std::string::npos) << e.what();
  }
}

}  // namespace
