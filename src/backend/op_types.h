// Types the op seam's two halves share (backend/ops.h, backend/gpu_backend.h and the GPU
// kernels' backend/gpu/gpu_ops.h): plain C++17.
#pragma once

#include <cstdint>
#include <functional>

namespace omni {

// GELU in Megatron's two forms. Erf, its default (torch.nn.functional.gelu, Hugging Face's
// "gelu"): x Phi(x) = 0.5 x (1 + erf(x / sqrt 2)). Tanh, its --openai-gelu (GPT-2's
// "gelu_new", cuBLASLt's GELU epilogue): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
// Outside ops, so that a call with a GeluForm argument does not also find ops' functions.
enum class GeluForm { Erf, Tanh };
const char* to_string(GeluForm form);

}  // namespace omni

// Members the GPU kernels call too (nvcc and hipcc compile them for the device).
#if defined(__CUDACC__) || defined(__HIPCC__)
#define OMNI_OP_TYPES_HD __host__ __device__
#else
#define OMNI_OP_TYPES_HD
#endif

namespace omni::ops {

// One element-wise step of an optimizer of the zoo over n elements (optim/zoo_elementwise.cpp
// has each formula and its reference; the GPU runs the same float arithmetic). w: weights,
// g: gradients, s0..s2: the states the kind names.
enum class ZooUpdate {
  Lion,               // s0 exp_avg
  SophiaG,            // s0 exp_avg, s1 hessian
  AdamWScheduleFree,  // s0 z, s1 x, s2 exp_avg_sq
  SGDScheduleFree,    // s0 z, s1 x
  LambMoments,        // s0 exp_avg, s1 exp_avg_sq; s2 := the update u (for its norm)
  LambApply,          // s0 exp_avg, s1 exp_avg_sq: w -= scale * u
  MuonMomentum,       // s0 exp_avg; s2 := the momentum to orthogonalise (zoo_muon.cpp)
  MuonApply,          // s0 the orthogonalised update: w -= lr * s0
  GaLoreAdam,         // s0 exp_avg, s1 exp_avg_sq of the projected g; s2 := m / (sqrt(v) + eps)
  GaLoreApply,        // s0 the projected-back update: w += scale * s0, then w += decay * w
  Ema,                // s0 := beta2 * s0 + scale * g (Shampoo's factors; w unused)
  ShampooMoments,     // s0 exp_avg, s1 exp_avg_sq, s2 := m * bc1 (M^); w := Adam's direction
  ShampooApply        // s0 the direction: w -= lr * (s0 * scale + wd * w)
};
struct ZooStep {
  ZooUpdate kind = ZooUpdate::Lion;
  // Each as the CPU rounds it to float: lr; decay = 1 - lr wd (Lion, SophiaG); wd; the betas
  // (schedule-free SGD's momentum in beta1); eps; scale (LAMB's step size x trust ratio);
  // ckp1 (schedule-free's averaging weight); bc2 (1 - beta2^t); rho_bs (SophiaG's rho x bs).
  // Muon's momentum: decay = -lr wd, beta1 = momentum, beta2 = 1 - momentum, scale = 1 for
  // Nesterov's form (else 0). GaLoreAdam: beta1, beta2, eps, with ckp1 = 1 - beta1 and
  // rho_bs = 1 - beta2 as the CPU rounds them; ShampooMoments the same and bc1 = 1 / (1 -
  // beta1^t), bc2 = 1 / (1 - beta2^t).
  float lr = 0, decay = 1, wd = 0, beta1 = 0, beta2 = 0, eps = 0, scale = 0, ckp1 = 0, bc2 = 1,
        rho_bs = 0, bc1 = 1;
};

// Dropout (Megatron's --hidden-dropout and --attention-dropout): what makes one call's mask,
// which backend/dropout_mask.h turns into keep/drop decisions. p = 0: no dropout. Made on the
// host by dropout_key() (backend/ops.h) and filled in by the model with where its rows are.
struct DropoutKey {
  double p = 0;              // probability of dropping an element
  uint32_t threshold = 0;    // round(p 2^32): a Philox word below it drops its element
  uint32_t key[2] = {0, 0};  // Philox key drawn from (seed, iteration, layer, site)
  int64_t first_sample = 0;  // global index of the micro-batch's first sequence
  // The rows' context-parallel rank of cp (their positions in the full sequence); attention:
  // the rank whose keys the call's block holds.
  int cp = 1, cp_rank = 0, key_rank = 0;
  int head_offset = 0;    // attention: global index of the call's head 0 (tensor parallel)
  int64_t first_row = 0;  // hidden states: the call's row 0 among the micro-batch's tokens
  OMNI_OP_TYPES_HD bool active() const { return p > 0; }
  OMNI_OP_TYPES_HD double scale() const { return 1.0 / (1.0 - p); }  // of the kept values
};

// Shapes of one attention call. Grouped-query attention: `heads` query heads share
// `groups` key/value heads, heads / groups query heads per group.
struct AttentionDims {
  int batch, seq, heads, groups, head_dim;
  // Optional [batch * seq]: row n attends keys key_start[n] .. its own position (documents
  // packed in one sample, Megatron's --reset-attention-mask); null: from key 0.
  const int32_t* key_start = nullptr;
  // Optional [batch * seq]: each query row's last key (causal: its own position; in ring
  // attention, where the keys are another rank's block, the last one it may see, or -1 for
  // none); null: row i of a sequence is key i.
  const int32_t* q_index = nullptr;
  // Dropout on the probabilities (inactive by default); the backward draws the same mask.
  DropoutKey dropout = {};
  // Multi-latent attention: the values' (and so the output's) head dim when it is not the
  // queries' and keys' (0: head_dim), and the softmax scale when it is not 1/sqrt(head_dim)
  // (0: that; YaRN's mscale changes it).
  int v_head_dim = 0;
  double softmax_scale = 0;
  int heads_per_group() const { return heads / groups; }
  int qkv_width() const { return (heads + 2 * groups) * head_dim; }
  int v_dim() const { return v_head_dim ? v_head_dim : head_dim; }
  bool plain_shape() const { return v_dim() == head_dim && softmax_scale == 0; }
};

// The vocabulary-parallel cross-entropy's arguments (ops::classifier_cross_entropy).
struct ClassifierLossArgs {
  int rows = 0, hidden = 0, vocab = 0;
  double grad_scale = 1.0;
  int vocab_start = 0;
  // In-place across ranks over n values: maximum when `max`, else sum. Null: one rank.
  std::function<void(double* values, int n, bool max)> reduce;
};
}  // namespace omni::ops
