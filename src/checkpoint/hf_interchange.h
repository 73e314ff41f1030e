// Hugging Face model directories in and out of omnitron: config.json plus
// model.safetensors (or model.safetensors.index.json and its shards), with the tensor
// names of GPT2LMHeadModel, LlamaForCausalLM, MistralForCausalLM (without a sliding
// window), Qwen2ForCausalLM, Qwen3ForCausalLM, or the mixtures of experts
// MixtralForCausalLM, Qwen2MoeForCausalLM and Qwen3MoeForCausalLM (hf_config.cpp says how
// their routers map to Megatron's flags), and DeepseekV3ForCausalLM (multi-latent attention;
// its multi-token prediction layers are not imported).
//
// What the mapping knows (both directions use the same table, so they are inverses):
//  - GPT-2's Conv1D layers store W as [in, out]; ours (and nn.Linear) as [out, in].
//  - Megatron's fused QKV rows are interleaved per key/value group ([the group's query
//    heads, its key head, its value head] per group); Hugging Face keeps q, k and v apart
//    (GPT-2: one c_attn output [q | k | v]). Query head h belongs to group h / (heads /
//    groups) in both, as repeat_kv has it.
//  - Rotary embeddings: both rotate the two halves of each head (rotate_half), so q_proj
//    and k_proj rows map without Meta's interleaving permutation.
//  - SwiGLU's linear_fc1 is [gate_proj; up_proj] (Mixtral's experts: [w1; w3], w2 down).
//  - DeepSeek-V3's rope channels of q_b_proj (q_proj) per head and of kv_a_proj_with_mqa are
//    in interleaved pair order (rope_interleave true, the default: its attention reorders
//    them even-then-odd before rotate_half); ours hold them de-interleaved (model/mla.h), so
//    import permutes those rows and export permutes them back (and writes rope_interleave
//    true). With rope_interleave false the rows map as they are.
//  - Our experts are one tensor per layer: linear_fc1 [E, 2F, hidden] stacks each expert's
//    [gate; up], linear_fc2 [E, hidden, F] each expert's down projection.
//  - Our embedding and output matrices have --make-vocab-size-divisible-by padded rows;
//    Hugging Face has exactly vocab_size. Import fills the padding with zeros; export
//    drops it.
#pragma once

#include <string>
#include <vector>

#include "base/dtype.h"
#include "config/options.h"
#include "tensor/parameters.h"

namespace omni {

// True when `dir` holds a Hugging Face model: a config.json and no omnitron checkpoint
// (latest_checkpointed_iteration.txt).
bool is_hf_model_dir(const std::string& dir);

// The omnitron flags (Megatron's spelling) for the model DIR/config.json describes.
// Fields omnitron cannot represent (rope_scaling, sliding windows, attention or MLP
// biases on Llama, another activation or architecture) are a UsageError naming the field.
// --seq-length is set to the model's maximum positions.
std::vector<std::string> hf_model_args(const std::string& dir);

// Replaces the architecture in opts.model by DIR/config.json's (keeping
// --make-vocab-size-divisible-by, which Hugging Face does not store).
void load_hf_model_options(const std::string& dir, Options& opts);

// Loads DIR's weights into `params`, a model built from load_hf_model_options (the
// vocabulary padding rows become zeros). Every tensor must find its place and every
// parameter its tensor; a mismatch names the tensor, the file and the shapes.
void load_hf_weights(const std::string& dir, ParameterSet<float>& params);
// The same for one rank's part of the model in any parallel layout (tensor-parallel slices,
// a pipeline stage's layers, an expert-parallel rank's experts: `infos` with their
// global_shape and segments), into host memory `values` laid out as `infos` say. Only the
// rank's elements are read from the (memory-mapped) files, so no rank holds the whole model.
void load_hf_weights(const std::string& dir, const std::vector<ParamInfo>& infos, float* values);

// Writes DIR/config.json and DIR/model.safetensors (tensors stored as `dtype`: F32, BF16
// or F16) for the model `config` describes, holding `params`. A model of none of the
// architectures above is a UsageError naming what has no Hugging Face equivalent.
void save_hf_model(const std::string& dir, const TransformerConfig& config,
                   const ParameterSet<float>& params, DType dtype = DType::F32);

}  // namespace omni
