// Packed documents: Megatron's masks, and a model that sees packed documents exactly as it
// would see them one per sample.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "model/gpt_model.h"
#include "train/document_masks.h"

namespace {

TEST(DocumentMasks, MatchMegatronsLeftToRightMasksByHand) {
  // eod = 9 at positions 2 and 5 of one sample of 8 tokens.
  const std::vector<int32_t> tokens = {4, 4, 9, 4, 4, 9, 4, 4};
  std::vector<int32_t> pos(8), start(8);
  std::vector<float> mask(8);
  omni::document_masks(tokens.data(), 1, 8, {9, true, true, true}, pos.data(), start.data(),
                       mask.data());
  EXPECT_EQ(pos, (std::vector<int32_t>{0, 1, 2, 0, 1, 2, 0, 1}));
  EXPECT_EQ(start, (std::vector<int32_t>{0, 0, 0, 3, 3, 3, 6, 6}));
  EXPECT_EQ(mask, (std::vector<float>{1, 1, 0, 1, 1, 0, 1, 1}));
  omni::document_masks(tokens.data(), 1, 8, {9, false, false, false}, pos.data(), start.data(),
                       mask.data());
  EXPECT_EQ(pos, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(start, std::vector<int32_t>(8, 0));
  EXPECT_EQ(mask, std::vector<float>(8, 1.0f));
}

omni::TransformerConfig tiny(bool llama) {
  omni::TransformerConfig c;
  c.num_layers = 2, c.hidden_size = 16, c.num_attention_heads = 4, c.seq_length = 10;
  c.vocab_size = 23, c.make_vocab_size_divisible_by = 8, c.init_method_std = 0.2;
  if (llama) {
    c.normalization = omni::Normalization::RMSNorm, c.swiglu = true, c.ffn_hidden_size = 24;
    c.position_embedding_type = omni::PositionEmbedding::Rope;
    c.add_bias_linear = false, c.group_query_attention = true, c.num_query_groups = 2;
  }
  return c;
}

// Two documents of 5 tokens packed into one sample of 10 with reset positions and attention
// give the same logits, loss and gradients as the two documents as a batch of 2 x 5.
void expect_packed_equals_separate(bool llama) {
  const std::vector<int32_t> tokens = {3, 7, 1, 22, 5, 8, 8, 2, 0, 13};
  const std::vector<int32_t> labels = {7, 1, 22, 5, 4, 8, 2, 0, 13, 6};
  std::vector<int32_t> pos = {0, 1, 2, 3, 4, 0, 1, 2, 3, 4};
  std::vector<int32_t> start = {0, 0, 0, 0, 0, 5, 5, 5, 5, 5};

  omni::GPTModel<double> packed(tiny(llama), 2, 11), separate(tiny(llama), 2, 11);
  omni::MicroBatch p{tokens.data(), labels.data(), nullptr, 1, 10, pos.data(), start.data()};
  omni::MicroBatch s{tokens.data(), labels.data(), nullptr, 2, 5};
  const double lp = packed.forward_backward(p, 1.0), ls = separate.forward_backward(s, 1.0);
  EXPECT_NEAR(lp, ls, 1e-12);
  const auto& gp = packed.params(), &gs = separate.params();
  double worst = 0, scale = 0;
  for (int64_t i = 0; i < gp.size(); ++i) {
    worst = std::max(worst, std::abs(gp.grads()[i] - gs.grads()[i]));
    scale = std::max(scale, std::abs(gs.grads()[i]));
  }
  EXPECT_LT(worst, 1e-12 * scale);
  EXPECT_GT(scale, 1e-3);
}

TEST(PackedDocuments, MatchSeparateSequencesWithLearnedPositions) {
  expect_packed_equals_separate(false);
}

TEST(PackedDocuments, MatchSeparateSequencesWithRope) { expect_packed_equals_separate(true); }

}  // namespace
