// Multi-latent attention's configuration (model/mla.h): what is refused, in one line naming the
// flags, and YaRN's frequencies and softmax scale against hand-worked values. The layer's
// gradients are checked in test_gradients.cpp, its formulas against PyTorch in
// test_pytorch_fixtures.cpp (mla_tiny) and its tensor-parallel layout in
// parallel/test_model_parallel.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <string>

#include "base/error.h"
#include "model/gpt_model.h"
#include "model/mla.h"

namespace omni {
namespace {

TransformerConfig tiny_mla() {
  TransformerConfig c;
  c.num_layers = 1, c.hidden_size = 16, c.num_attention_heads = 2, c.seq_length = 4;
  c.vocab_size = 11, c.normalization = Normalization::RMSNorm, c.add_bias_linear = false;
  c.position_embedding_type = PositionEmbedding::Rope, c.swiglu = true, c.ffn_hidden_size = 8;
  c.multi_latent_attention = true, c.kv_lora_rank = 8, c.qk_head_dim = 4;
  c.qk_pos_emb_head_dim = 4, c.v_head_dim = 6;
  return c;
}

std::string error_of(const TransformerConfig& c) {
  try {
    c.validate();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(MultiLatentAttention, BadConfigurationsAreOneLineNamingTheFlags) {
  EXPECT_EQ(error_of(tiny_mla()), "");
  TransformerConfig c = tiny_mla();
  c.position_embedding_type = PositionEmbedding::LearnedAbsolute;
  EXPECT_EQ(error_of(c),
            "--multi-latent-attention needs --position-embedding-type rope (its decoupled rope "
            "key; got learned_absolute)");
  c = tiny_mla(), c.kv_lora_rank = 0;
  EXPECT_EQ(error_of(c), "--multi-latent-attention needs a positive --kv-lora-rank (got 0)");
  c = tiny_mla(), c.qk_pos_emb_head_dim = 3;
  EXPECT_NE(error_of(c).find("--qk-pos-emb-head-dim"), std::string::npos);
  c = tiny_mla(), c.add_bias_linear = true;
  EXPECT_NE(error_of(c).find("--disable-bias-linear"), std::string::npos);
  c = tiny_mla(), c.rotary_scaling_factor = 40, c.mscale = 1, c.mscale_all_dim = 0.707;
  EXPECT_NE(error_of(c).find("--mscale 1 and --mscale-all-dim 0.707"), std::string::npos)
      << error_of(c);
  c.yarn = false;  // plain rope: no cos/sin factor, only the softmax scale's
  EXPECT_EQ(error_of(c), "");
}

TEST(MultiLatentAttention, HeadDimsAndParameterCount) {
  TransformerConfig c = tiny_mla();
  c.q_lora_rank = 6, c.qk_layernorm = true;
  EXPECT_EQ(c.head_dim(), 8);
  EXPECT_EQ(c.value_head_dim(), 6);
  EXPECT_EQ(c.query_groups(), 2);
  // q: 16x6 + norm 6 + 6x16; kv: 16x12 + norm 8 + 8x20; proj: 12x16.
  EXPECT_EQ(mla_attention_parameter_count(c), 96 + 6 + 96 + 192 + 8 + 160 + 192);
  GPTModel<double> m(c, 1, 1);
  int64_t n = 0;
  for (const ParamInfo& p : m.params().infos()) n += p.numel;
  EXPECT_EQ(n, c.num_parameters() + (c.padded_vocab_size() - c.vocab_size) * 16);
}

// Megatron's defaults (factor 1) are plain rope and 1/sqrt(d); DeepSeek-V3's factor 40 with
// mscale_all_dim 1 scales the softmax by (0.1 ln 40 + 1)^2 and blends the frequencies.
TEST(MultiLatentAttention, YarnFrequenciesAndSoftmaxScale) {
  TransformerConfig c = tiny_mla();
  c.qk_head_dim = 128, c.qk_pos_emb_head_dim = 64;
  EXPECT_DOUBLE_EQ(mla_softmax_scale(c), 1 / std::sqrt(192.0));
  std::vector<double> f = mla_rotary_inv_freq(c);
  ASSERT_EQ(f.size(), 32u);
  for (int i = 0; i < 32; ++i) EXPECT_DOUBLE_EQ(f[i], std::pow(10000.0, -2.0 * i / 64));
  c.rotary_scaling_factor = 40, c.mscale = c.mscale_all_dim = 1;
  const double m = 0.1 * std::log(40.0) + 1;
  EXPECT_DOUBLE_EQ(mla_softmax_scale(c), m * m / std::sqrt(192.0));
  f = mla_rotary_inv_freq(c);
  // Correction range over 4096 positions: floor(64 ln(4096 / 64 pi) / 2 ln 1e4) = 10 turns
  // fast, ceil(64 ln(4096 / 2 pi) / 2 ln 1e4) = 23 slow: kept up to 10, divided from 23 on.
  const auto plain = [](int i) { return std::pow(10000.0, -2.0 * i / 64); };
  EXPECT_DOUBLE_EQ(f[10], plain(10));
  EXPECT_DOUBLE_EQ(f[23], plain(23) / 40);
  const double ramp = (16.0 - 10) / 13;
  EXPECT_NEAR(f[16], plain(16) / 40 * ramp + plain(16) * (1 - ramp), 1e-18);
}

TEST(MultiLatentAttention, RopeRowsDeinterleave) {
  // Two blocks of 5 rows, rope rows 1..4 of each: interleaved channels 0 1 2 3 held as 0 2 1 3.
  EXPECT_EQ(mla_deinterleaved_rope_rows(10, 5, 1, 4),
            (std::vector<int64_t>{0, 1, 3, 2, 4, 5, 6, 8, 7, 9}));
}

}  // namespace
}  // namespace omni
