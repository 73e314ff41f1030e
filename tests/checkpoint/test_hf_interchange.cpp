// Hugging Face interchange (issue 4 item 4), against models written by
// tests/fixtures/make_hf_fixtures.py: GPT2LMHeadModel, LlamaForCausalLM (grouped-query,
// head_dim != hidden/heads, untied, padded vocabulary, also sharded) and Qwen2ForCausalLM
// (qkv biases, one key/value head, bfloat16), each with logits of a float64 PyTorch
// forward pass written from the published formulas.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "base/error.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/hf_fixtures.h"
#include "checkpoint/hf_interchange.h"
#include "checkpoint/safetensors.h"
#include "comm/local_communicator.h"
#include "config/options.h"
#include "data/datasets/dataset.h"
#include "model/gpt_model.h"
#include "parallel/full_model.h"
#include "train/trainer.h"

namespace {

namespace fs = std::filesystem;
using namespace hf_test;

TEST(HfInterchange, Gpt2LogitsMatchTheReference) {
  EXPECT_LT(max_logit_error("gpt2_tiny"), 2e-5);
}
TEST(HfInterchange, LlamaLogitsMatchTheReference) {
  EXPECT_LT(max_logit_error("llama_tiny"), 2e-5);
}
TEST(HfInterchange, Qwen2Bf16LogitsMatchTheReference) {
  EXPECT_LT(max_logit_error("qwen2_tiny"), 2e-5);
}

// Qwen3 (q/k norms), and the mixtures of experts: Mixtral (every layer routed,
// renormalised top-2), Qwen2-MoE (top-2 not renormalised, a gated shared expert, a dense
// layer) and Qwen3-MoE (q/k norms, every second layer routed).
TEST(HfInterchange, Qwen3AndMixtureOfExpertsLogitsMatchTheReference) {
  for (const char* name : {"qwen3_tiny", "mixtral_tiny", "qwen2_moe_tiny", "qwen3_moe_tiny"})
    EXPECT_LT(max_logit_error(name), 2e-5) << name;
}

TEST(HfInterchange, MixtureOfExpertsConfigsMapToMegatronFlags) {
  omni::Options q;
  omni::load_checkpoint_model_options(kHf + "qwen2_moe_tiny", q);
  EXPECT_EQ(q.model.num_moe_experts, 4);
  EXPECT_EQ(q.model.moe_router_topk, 2);
  EXPECT_EQ(q.model.moe_ffn_size(), 8);
  EXPECT_EQ(q.model.ffn_size(), 20);
  EXPECT_EQ(q.model.moe_layer_pattern(), (std::vector<int>{1, 0}));
  EXPECT_TRUE(q.model.moe_router_pre_softmax) << "norm_topk_prob false";
  EXPECT_EQ(q.model.moe_shared_expert_intermediate_size, 12);
  EXPECT_TRUE(q.model.moe_shared_expert_gate);
  EXPECT_TRUE(q.model.qkv_bias());
  omni::Options m;
  omni::load_checkpoint_model_options(kHf + "mixtral_tiny", m);
  EXPECT_EQ(m.model.moe_layer_pattern(), (std::vector<int>{1, 1}));
  EXPECT_EQ(m.model.moe_ffn_size(), 12);
  EXPECT_FALSE(m.model.moe_router_pre_softmax);
  omni::Options t;
  omni::load_checkpoint_model_options(kHf + "qwen3_moe_tiny", t);
  EXPECT_EQ(t.model.moe_layer_pattern(), (std::vector<int>{0, 1}));
  EXPECT_TRUE(t.model.qk_layernorm);
  EXPECT_EQ(t.model.head_dim(), 8);
  EXPECT_FALSE(t.model.moe_router_pre_softmax);
}

TEST(HfInterchange, ConfigMapsToMegatronFlags) {
  omni::Options o;
  omni::load_checkpoint_model_options(kHf + "llama_tiny", o);
  const omni::TransformerConfig& c = o.model;
  EXPECT_EQ(c.num_layers, 2);
  EXPECT_EQ(c.hidden_size, 16);
  EXPECT_EQ(c.num_attention_heads, 4);
  EXPECT_EQ(c.query_groups(), 2);
  EXPECT_EQ(c.head_dim(), 8);
  EXPECT_EQ(c.ffn_size(), 40);
  EXPECT_EQ(c.vocab_size, 61);
  EXPECT_EQ(c.padded_vocab_size(), 128);
  EXPECT_EQ(c.normalization, omni::Normalization::RMSNorm);
  EXPECT_EQ(c.position_embedding_type, omni::PositionEmbedding::Rope);
  EXPECT_EQ(c.rotary_base, 500000.0);
  EXPECT_TRUE(c.swiglu);
  EXPECT_FALSE(c.add_bias_linear);
  EXPECT_TRUE(c.untie_embeddings_and_output_weights);
  EXPECT_EQ(c.seq_length, 32);
  EXPECT_EQ(omni::latest_checkpoint_iteration(kHf + "llama_tiny"), 0);
  omni::Options g;
  omni::load_checkpoint_model_options(kHf + "gpt2_tiny", g);
  EXPECT_EQ(g.model.normalization, omni::Normalization::LayerNorm);
  EXPECT_EQ(g.model.max_positions(), 16);
  EXPECT_TRUE(g.model.add_bias_linear);
  EXPECT_FALSE(g.model.untie_embeddings_and_output_weights);
  EXPECT_TRUE(g.model.openai_gelu) << "GPT-2's gelu_new is the tanh GELU";
}

TEST(HfInterchange, ShardedModelLoadsLikeTheSingleFile) {
  EXPECT_EQ(values(*load_model(kHf + "llama_tiny")),
            values(*load_model(kHf + "llama_tiny_sharded")));
}

// Export then import: the same parameters, bit for bit; for float32 models the exported
// safetensors also hold the imported file's tensors byte for byte under the same names.
TEST(HfInterchange, ExportThenImportGivesIdenticalParameters) {
  for (const std::string name : {"gpt2_tiny", "llama_tiny", "qwen2_tiny", "qwen3_tiny",
                                 "mixtral_tiny", "qwen2_moe_tiny", "qwen3_moe_tiny"}) {
    omni::Options o;
    auto m = load_model(kHf + name, &o);
    const std::string dir = fresh_dir("export_" + name);
    omni::save_hf_model(dir, o.model, m->params());
    EXPECT_EQ(values(*load_model(dir)), values(*m)) << name;
    if (name == "qwen2_tiny") continue;  // stored as bfloat16; we wrote float32
    const omni::SafetensorsFile original(kHf + name + "/model.safetensors");
    const omni::SafetensorsFile exported(dir + "/model.safetensors");
    EXPECT_EQ(exported.tensors().size(), original.tensors().size()) << name;
    for (const omni::SafetensorsTensor& t : original.tensors()) {
      const omni::SafetensorsTensor* e = exported.find(t.name);
      ASSERT_NE(e, nullptr) << name << ": " << t.name;
      EXPECT_EQ(e->shape, t.shape) << t.name;
      EXPECT_TRUE(e->bytes == t.bytes && std::memcmp(e->data, t.data, t.bytes) == 0) << t.name;
    }
  }
}

TEST(HfInterchange, ExportAsBf16RoundsEachWeightOnce) {
  omni::Options o;
  auto m = load_model(kHf + "qwen2_tiny", &o);
  const std::string dir = fresh_dir("export_bf16");
  omni::save_hf_model(dir, o.model, m->params(), omni::DType::BF16);
  const omni::SafetensorsFile exported(dir + "/model.safetensors");
  for (const omni::SafetensorsTensor& t : exported.tensors()) EXPECT_EQ(t.dtype, omni::DType::BF16);
  EXPECT_EQ(values(*load_model(dir)), values(*m));  // the weights were bfloat16 already
}

omni::Options random_model_options(const std::vector<std::string>& arch) {
  omni::Options o;
  std::vector<std::string> args = {
      "--mock-data", "--vocab-size",  "97", "--num-layers",
      "2",           "--hidden-size", "32", "--num-attention-heads",
      "4",           "--seq-length",  "8",  "--make-vocab-size-divisible-by",
      "64"};
  args.insert(args.end(), arch.begin(), arch.end());
  omni::parse_options(args, o);
  omni::finalize(o);
  return o;
}

// Our checkpoint -> Hugging Face -> our checkpoint: every parameter bit-identical, but
// the vocabulary padding rows (97 -> 128), which Hugging Face does not hold: they come
// back as zeros. The architecture options come back too.
TEST(HfInterchange, OmnitronToHfToOmnitronIsBitIdentical) {
  const std::vector<std::vector<std::string>> archs = {
      {"--position-embedding-type", "learned_absolute", "--max-position-embeddings", "12"},
      {"--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu",
       "--disable-bias-linear", "--group-query-attention", "--num-query-groups", "2",
       "--rotary-base", "500000", "--untie-embeddings-and-output-weights", "--ffn-hidden-size",
       "48"},
      {"--position-embedding-type", "rope", "--normalization", "RMSNorm", "--norm-epsilon", "1e-6",
       "--swiglu", "--disable-bias-linear", "--add-qkv-bias", "--kv-channels", "16"},
      {"--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu",
       "--disable-bias-linear", "--qk-layernorm", "--num-experts", "4", "--moe-router-topk", "3",
       "--moe-ffn-hidden-size", "24", "--ffn-hidden-size", "40", "--moe-layer-freq", "[0,1]",
       "--moe-router-pre-softmax"}};
  int k = 0;
  for (const auto& arch : archs) {
    const omni::Options o = random_model_options(arch);
    omni::GPTModel<float> ours(o.model, 1, 7 + k);
    const std::string ckpt = fresh_dir("ours_" + std::to_string(k));
    const std::string hf = fresh_dir("hf_" + std::to_string(k));
    const std::string back = fresh_dir("back_" + std::to_string(k++));
    omni::save_model_checkpoint(ckpt, o, ours.params());
    omni::Options loaded;
    auto from_ckpt = load_model(ckpt, &loaded);
    omni::save_hf_model(hf, loaded.model, from_ckpt->params());
    omni::Options via_hf;
    auto imported = load_model(hf, &via_hf);
    omni::save_model_checkpoint(back, via_hf, imported->params());
    auto again = load_model(back);

    const omni::TransformerConfig &a = o.model, &b = via_hf.model;
    EXPECT_EQ(b.num_parameters(), a.num_parameters());
    EXPECT_EQ(b.head_dim(), a.head_dim());
    EXPECT_EQ(b.query_groups(), a.query_groups());
    EXPECT_EQ(b.norm_epsilon, a.norm_epsilon);
    EXPECT_EQ(b.rotary_base, a.rotary_base);
    EXPECT_EQ(b.qkv_bias(), a.qkv_bias());
    EXPECT_EQ(b.untie_embeddings_and_output_weights, a.untie_embeddings_and_output_weights);
    EXPECT_EQ(b.qk_layernorm, a.qk_layernorm);
    EXPECT_EQ(b.moe_layer_pattern(), a.moe_layer_pattern());
    EXPECT_EQ(b.moe_router_topk, a.moe_router_topk);
    EXPECT_EQ(b.moe_router_pre_softmax, a.moe_router_pre_softmax);

    const auto& before = ours.params();
    const auto& after = again->params();
    ASSERT_EQ(after.infos().size(), before.infos().size());
    for (const omni::ParamInfo& p : before.infos()) {
      const omni::ParamInfo& q = after.info(p.name);
      ASSERT_EQ(q.shape, p.shape) << p.name;
      const bool vocab =
          p.name == "embedding.word_embeddings.weight" || p.name == "output_layer.weight";
      const int64_t kept = vocab ? int64_t(a.vocab_size) * a.hidden_size : p.numel;
      const float* x = before.values() + p.offset;
      const float* y = after.values() + q.offset;
      EXPECT_EQ(std::memcmp(x, y, size_t(kept) * sizeof(float)), 0) << p.name;
      for (int64_t i = kept; i < p.numel; ++i) ASSERT_EQ(y[i], 0.0f) << p.name << " padding";
    }
  }
}

// Options of `omnitron train --load HFDIR <layout>` at `ranks` ranks.
omni::Options hf_train_options(const std::string& dir, int ranks,
                               const std::vector<std::string>& layout) {
  std::vector<std::string> args = {"--load",      dir,
                                   "--mock-data", "--seq-length",
                                   "8",           "--micro-batch-size",
                                   "2",           "--train-iters",
                                   "1",           "--eval-iters",
                                   "0",           "--no-progress"};
  args.insert(args.end(), layout.begin(), layout.end());
  omni::Options o;
  omni::parse_options(args, o);
  omni::load_checkpoint_model_options(o.load, o);
  omni::parse_options(args, o);  // the command line wins, as in omnitron train
  o.data_parallel_size = ranks / (o.tensor_model_parallel_size * o.pipeline_model_parallel_size);
  omni::finalize(o);
  return o;
}

// At TP 2 x PP 2, PP 2 or EP 2 each rank reads only its part of the Hugging Face files: its
// slices, its stage's layers, its experts, equal to the one-rank load's.
TEST(HfInterchange, EachRankOfAParallelLayoutLoadsItsPartOfTheWeights) {
  for (const auto& [name, layout] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"llama_tiny",
            {"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"}},
           {"gpt2_tiny", {"--tensor-model-parallel-size", "2"}},
           {"qwen2_moe_tiny", {"--pipeline-model-parallel-size", "2"}},
           {"qwen2_moe_tiny", {"--expert-model-parallel-size", "2"}}}) {
    SCOPED_TRACE(name);
    const auto full = load_model(kHf + name);
    const int ranks = layout.size() == 4 ? 4 : 2;
    omni::run_ranks(ranks, [&](omni::Communicator& world) {
      const omni::Options o = hf_train_options(kHf + name, ranks, layout);
      omni::Trainer t(o, omni::make_mock_data(o.model.vocab_size, 1), 0, std::nullopt, &world);
      const omni::ParameterSet<float>& part = t.model().params();
      std::vector<float> want(size_t(part.size()));
      omni::take_slices(full->params(), full->params().values(), part, want.data());
      EXPECT_EQ(values(t.model()), want) << "rank " << world.rank();
    });
  }
}

// A Hugging Face model trained here and exported gives the same logits as the trained
// model, read back through the importer.
TEST(HfInterchange, TrainedFromHfThenExportedKeepsItsLogits) {
  for (const std::string name : {"llama_tiny", "gpt2_tiny", "qwen2_moe_tiny"}) {
    const std::vector<std::string> args = {
        "--load", kHf + name,      "--mock-data", "--seq-length", "8",    "--micro-batch-size",
        "2",      "--train-iters", "3",           "--lr",         "1e-2", "--eval-iters",
        "0",      "--no-progress"};
    omni::Options o;
    omni::parse_options(args, o);
    omni::load_checkpoint_model_options(o.load, o);
    omni::parse_options(args, o);  // the command line wins, as in omnitron train
    omni::finalize(o);
    omni::Trainer t(o, omni::make_mock_data(o.model.vocab_size, static_cast<uint64_t>(o.seed)));
    const std::vector<float> start = values(t.model());
    EXPECT_EQ(start, values(*load_model(kHf + name)));
    omni::MetricsSink sink("", false, nullptr);
    const omni::TrainResult r = t.run(sink);
    EXPECT_EQ(r.train_losses.size(), 3u);
    EXPECT_NE(values(t.model()), start);

    const std::string dir = fresh_dir("trained_" + name);
    omni::save_hf_model(dir, o.model, t.model().params());
    auto exported = load_model(dir);
    const Reference ref = reference(name);
    const int seq = std::min(ref.seq, 8);
    std::vector<int32_t> tokens(ref.tokens.begin(), ref.tokens.begin() + seq);
    EXPECT_EQ(exported->forward_logits(tokens.data(), 1, seq),
              t.model().forward_logits(tokens.data(), 1, seq))
        << name;
  }
}

TEST(HfInterchange, MistralWithoutASlidingWindowIsLlama) {
  const std::vector<std::pair<std::string, std::string>> mistral = {
      {"\"LlamaForCausalLM\"", "\"MistralForCausalLM\""},
      {"\"model_type\": \"llama\"", "\"model_type\": \"mistral\""}};
  EXPECT_EQ(values(*load_model(edited_copy("llama_tiny", mistral))),
            values(*load_model(kHf + "llama_tiny")));
  auto windowed = mistral;
  windowed.emplace_back("\"rope_scaling\": null", "\"sliding_window\": 16");
  expect_load_error(edited_copy("llama_tiny", windowed), "sliding_window (16) is not supported");
}

// The gpt2 repository on the Hub stores GPT2Model's names (wte.weight, h.0...), without
// GPT2LMHeadModel's "transformer." prefix.
TEST(HfInterchange, NamesWithoutTheBackbonePrefixLoad) {
  const std::string dir = fresh_dir("unprefixed");
  fs::create_directories(dir);
  fs::copy_file(kHf + "gpt2_tiny/config.json", dir + "/config.json");
  const omni::SafetensorsFile original(kHf + "gpt2_tiny/model.safetensors");
  std::vector<omni::SafetensorsOutput> renamed;
  for (const omni::SafetensorsTensor& t : original.tensors())
    renamed.push_back({t.name.substr(std::string("transformer.").size()), t.shape,
                       [&t](float* dst) { omni::read_as_f32(t, dst); }});
  omni::write_safetensors(dir + "/model.safetensors", renamed, omni::DType::F32);
  EXPECT_EQ(values(*load_model(dir)), values(*load_model(kHf + "gpt2_tiny")));
}

// GPT-2's activation_function: gelu_new (and the other tanh spellings) is --openai-gelu,
// gelu the exact erf GELU, Megatron's default; the export writes the one the model uses.
TEST(HfInterchange, Gpt2ActivationFunctionNamesTheGeluForm) {
  for (const auto& [name, tanh] :
       std::vector<std::pair<std::string, bool>>{{"gelu_new", true},
                                                 {"gelu_pytorch_tanh", true},
                                                 {"gelu_fast", true},
                                                 {"gelu", false},
                                                 {"gelu_python", false}}) {
    const std::string dir = edited_copy("gpt2_tiny", "\"activation_function\": \"gelu_new\"",
                                        "\"activation_function\": \"" + name + "\"");
    omni::Options o;
    auto m = load_model(dir, &o);
    EXPECT_EQ(o.model.openai_gelu, tanh) << name;
    const std::string exported = fresh_dir("export_act_" + name);
    omni::save_hf_model(exported, o.model, m->params());
    const std::string written = tanh ? "gelu_new" : "gelu";
    std::ifstream config(exported + "/config.json");
    std::stringstream text;
    text << config.rdbuf();
    EXPECT_NE(text.str().find("\"activation_function\": \"" + written + "\""), std::string::npos)
        << name;
  }
}

TEST(HfInterchange, UnrepresentableConfigsAreRefusedNamingTheField) {
  expect_load_error(edited_copy("llama_tiny", "\"rope_scaling\": null",
                                "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0}"),
                    "rope_scaling is not supported");
  expect_load_error(
      edited_copy("llama_tiny", "\"attention_bias\": false", "\"attention_bias\": true"),
      "attention_bias = true is not supported");
  expect_load_error(
      edited_copy("llama_tiny", "\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\""),
      "hidden_act 'gelu' is not supported");
  expect_load_error(
      edited_copy("qwen2_tiny", "\"use_sliding_window\": false", "\"use_sliding_window\": true"),
      "use_sliding_window = true is not supported");
  expect_load_error(edited_copy("gpt2_tiny", "\"activation_function\": \"gelu_new\"",
                                "\"activation_function\": \"relu\""),
                    "activation_function 'relu' is not supported");
  expect_load_error(
      edited_copy("gpt2_tiny", "\"model_type\": \"gpt2\"", "\"model_type\": \"gpt_neox\""),
      "model_type 'gpt_neox' is not one omnitron converts");
  expect_load_error(
      edited_copy("llama_tiny", "\"LlamaForCausalLM\"", "\"LlamaForSequenceClassification\""),
      "architectures names 'LlamaForSequenceClassification'");
}

TEST(HfInterchange, WeightsThatDisagreeWithConfigAreCleanErrors) {
  // One layer more than the file holds.
  expect_load_error(
      edited_copy("llama_tiny", "\"num_hidden_layers\": 2", "\"num_hidden_layers\": 3"),
      "no tensor model.layers.2.input_layernorm.weight");
  // A narrower MLP than the stored one: the tensor and both shapes are named.
  expect_load_error(
      edited_copy("llama_tiny", "\"intermediate_size\": 40", "\"intermediate_size\": 32"),
      "tensor model.layers.0.mlp.gate_proj.weight in");
  // A tied model: lm_head.weight may be present (ignored); untied it must be.
  expect_load_error(
      edited_copy("qwen2_tiny", "\"tie_word_embeddings\": true", "\"tie_word_embeddings\": false"),
      "no tensor lm_head.weight");
  // One layer fewer: the file's extra tensors have no place.
  expect_load_error(edited_copy("gpt2_tiny", "\"n_layer\": 2", "\"n_layer\": 1"),
                    "tensor transformer.h.1.");
  // A damaged weight file is named.
  const std::string dir = edited_copy("gpt2_tiny", "\"n_layer\": 2", "\"n_layer\": 2");
  fs::resize_file(dir + "/model.safetensors", 1000);
  expect_load_error(dir, dir + "/model.safetensors");
}

TEST(HfInterchange, ModelsWithoutAHfEquivalentAreRefused) {
  const std::vector<std::string> llama = {
      "--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu",
      "--disable-bias-linear"};
  auto with = [&llama](std::vector<std::string> more) {
    more.insert(more.begin(), llama.begin(), llama.end());
    return more;
  };
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--qk-layernorm"}, "--qk-layernorm) has no Hugging Face equivalent"},
      {with({"--qk-layernorm", "--add-qkv-bias"}),
       "--add-qkv-bias, --qk-layernorm) has no Hugging Face equivalent"},
      {with({"--num-experts", "4", "--moe-layer-freq", "[1,0]"}),
       "--num-experts 4) has no Hugging Face equivalent"},
      {with({"--num-experts", "4", "--moe-shared-expert-intermediate-size", "8", "--add-qkv-bias"}),
       "a shared expert without a gate) has no Hugging Face equivalent"},
      {with({"--num-experts", "4", "--moe-router-score-function", "sigmoid"}),
       "uses --moe-router-score-function sigmoid, which MixtralForCausalLM does not have"},
      {with({"--num-experts", "4", "--moe-router-pre-softmax"}),
       "uses --moe-router-pre-softmax, which MixtralForCausalLM does not have"}};
  for (const auto& [arch, message] : cases) {
    const omni::Options o = random_model_options(arch);
    omni::GPTModel<float> m(o.model, 1, 1);
    try {
      omni::save_hf_model(fresh_dir("refused"), o.model, m.params());
      ADD_FAILURE() << "no error for " << message;
    } catch (const omni::UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  }
}

}  // namespace
