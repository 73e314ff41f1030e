// Megatron's network-size group: the transformer's shape, norms, positions, biases,
// initialisation and dropout. Rows in the group "model" are stored with a checkpoint's weights.
#include "config/option_rows.h"

namespace omni::option_rows {

void add_model_options(std::vector<OptionDef>& t) {
  const std::string M = "model";
  t.push_back(number<int>("--num-layers", "N", M, "transformer layers",
                          [](Options& o) -> int& { return o.model.num_layers; }));
  add_alias(t, "--encoder-num-layers", "--num-layers");  // Megatron's other name for it
  t.push_back(number<int>("--hidden-size", "N", M, "model width",
                          [](Options& o) -> int& { return o.model.hidden_size; }));
  t.push_back(number<int>("--ffn-hidden-size", "N", M, "MLP width (0: 4 x hidden size)",
                          [](Options& o) -> int& { return o.model.ffn_hidden_size; }));
  t.push_back(number<int>("--num-attention-heads", "N", M, "query heads",
                          [](Options& o) -> int& { return o.model.num_attention_heads; }));
  t.push_back(toggle("--group-query-attention", M,
                     "grouped-query attention: --num-query-groups key/value heads",
                     [](Options& o) -> bool& { return o.model.group_query_attention; }));
  t.push_back(number<int>("--num-query-groups", "N", M,
                          "key/value heads under --group-query-attention (without it: one per "
                          "query head)",
                          [](Options& o) -> int& { return o.model.num_query_groups; }));
  t.push_back(number<int>("--kv-channels", "N", M, "head dimension (0: hidden size / heads)",
                          [](Options& o) -> int& { return o.model.kv_channels; }));
  t.push_back(number<int>("--seq-length", "N", M, "tokens per sample",
                          [](Options& o) -> int& { return o.model.seq_length; }));
  t.push_back(number<int>("--max-position-embeddings", "N", M,
                          "rows of the learned position table (0: --seq-length)",
                          [](Options& o) -> int& { return o.model.max_position_embeddings; }));
  t.push_back(number<int>("--vocab-size", "N", M,
                          "vocabulary size (mock data; byte-level text is 256)",
                          [](Options& o) -> int& { return o.model.vocab_size; }));
  t.push_back(number<int>(
      "--make-vocab-size-divisible-by", "N", M,
      "pad the embedding rows to a multiple of N; padded logits are excluded from the loss",
      [](Options& o) -> int& { return o.model.make_vocab_size_divisible_by; }));
  t.push_back(OptionDef{
      "--normalization", "LayerNorm|RMSNorm", M, "normalisation layers",
      [](Options& o, const std::string& v) {
        if (v == "LayerNorm")
          o.model.normalization = Normalization::LayerNorm;
        else if (v == "RMSNorm")
          o.model.normalization = Normalization::RMSNorm;
        else
          throw UsageError("--normalization: '" + v + "' is not one of LayerNorm, RMSNorm");
      },
      [](const Options& o) { return std::string(to_string(o.model.normalization)); }});
  t.push_back(number<double>("--norm-epsilon", "X", M, "epsilon of the norms",
                             [](Options& o) -> double& { return o.model.norm_epsilon; }));
  t.push_back(toggle("--swiglu", M, "SwiGLU MLP (gate and up projections)",
                     [](Options& o) -> bool& { return o.model.swiglu; }));
  t.push_back(toggle("--openai-gelu", M,
                     "GELU's tanh approximation (GPT-2's gelu_new); default: Megatron's exact "
                     "erf GELU",
                     [](Options& o) -> bool& { return o.model.openai_gelu; }));
  t.push_back(OptionDef{
      "--position-embedding-type", "learned_absolute|rope|none", M,
      "position encoding (none: no position information, NoPE)",
      [](Options& o, const std::string& v) {
        if (v == "learned_absolute")
          o.model.position_embedding_type = PositionEmbedding::LearnedAbsolute;
        else if (v == "rope")
          o.model.position_embedding_type = PositionEmbedding::Rope;
        else if (v == "yarn")
          throw NotBuiltError("--position-embedding-type yarn", "YaRN rotary scaling");
        else if (v == "mrope")
          throw NotBuiltError("--position-embedding-type mrope", "multimodal rotary embedding");
        else if (v == "relative")
          throw NotBuiltError("--position-embedding-type relative",
                              "relative position buckets (T5)");
        else if (v == "none")
          o.model.position_embedding_type = PositionEmbedding::None;
        else
          throw UsageError("--position-embedding-type: '" + v +
                           "' is not one of learned_absolute, rope, yarn, mrope, relative, none");
      },
      [](const Options& o) { return std::string(to_string(o.model.position_embedding_type)); }});
  t.push_back(OptionDef{"--use-rotary-position-embeddings", "", M,
                        "the old name of --position-embedding-type rope",
                        [](Options& o, const std::string&) {
                          o.model.position_embedding_type = PositionEmbedding::Rope;
                        },
                        nullptr});
  t.push_back(number<double>("--rotary-base", "X", M, "RoPE base (Llama 2: 10000, Llama 3: 500000)",
                             [](Options& o) -> double& { return o.model.rotary_base; }));
  t.push_back(number<double>("--rotary-percent", "X", M,
                             "fraction of each head's channels rope rotates (the rest pass)",
                             [](Options& o) -> double& { return o.model.rotary_percent; }));
  t.push_back(toggle("--use-rope-scaling", M,
                     "Llama 3.1's rope frequency scaling (by --rope-scaling-factor)",
                     [](Options& o) -> bool& { return o.model.use_rope_scaling; }));
  t.push_back(number<double>("--rope-scaling-factor", "X", M,
                             "Llama 3.1 scaling's factor (with --use-rope-scaling)",
                             [](Options& o) -> double& { return o.model.rope_scaling_factor; }));
  // Megatron: deprecated; with rope (or none) there is no position table to drop, and with
  // learned_absolute it is an error pointing at --position-embedding-type.
  t.push_back(OptionDef{"--no-position-embedding", "", M,
                        "deprecated: only valid with rope or none (use --position-embedding-type)",
                        [](Options& o, const std::string&) { o.no_position_embedding = true; },
                        nullptr});
  t.push_back(toggle(
      "--disable-bias-linear", M, "no biases on the linear layers",
      [](Options& o) -> bool& { return o.model.add_bias_linear; }, false));
  t.push_back(toggle("--add-qkv-bias", M,
                     "bias on the QKV projection even without linear biases (Qwen2.5)",
                     [](Options& o) -> bool& { return o.model.add_qkv_bias; }));
  t.push_back(toggle("--apply-layernorm-1p", M,
                     "zero-centred norm weights: each norm stores gamma - 1 (initialised to 0)",
                     [](Options& o) -> bool& { return o.model.layernorm_zero_centered_gamma; }));
  t.push_back(toggle("--qk-layernorm", M, "normalise queries and keys per head",
                     [](Options& o) -> bool& { return o.model.qk_layernorm; }));
  t.push_back(
      toggle("--untie-embeddings-and-output-weights", M, "separate output layer",
             [](Options& o) -> bool& { return o.model.untie_embeddings_and_output_weights; }));
  t.push_back(number<double>("--init-method-std", "X", M, "std of the normal initialisation",
                             [](Options& o) -> double& { return o.model.init_method_std; }));
  t.push_back(number<double>(
      "--hidden-dropout", "P", M,
      "dropout after the embedding and each attention and MLP output (training only)",
      [](Options& o) -> double& { return o.model.hidden_dropout; }));
  t.push_back(number<double>("--attention-dropout", "P", M,
                             "dropout on the attention probabilities (training only)",
                             [](Options& o) -> double& { return o.model.attention_dropout; }));
}

}  // namespace omni::option_rows
