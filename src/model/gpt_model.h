// GPTModel: a decoder-only transformer with an explicit forward and backward for every
// layer. Embedding -> num_layers x [norm, self-attention, residual, norm, MLP, residual]
// -> final norm -> output layer fused with cross-entropy. Which norm, MLP, position
// embedding, biases and attention grouping are used comes from TransformerConfig.
//
// Parallel layouts (ModelParallel) are written with the parallel primitives of parallel/,
// and one rank is not a special case (DESIGN.md invariant 3): with single-rank
// communicators every collective is a no-op or a copy.
//  - Tensor parallel (Megatron's; parallel/tensor_parallel.h): QKV and MLP fc1 are
//    column-parallel (this rank holds query groups [r*G/tp, (r+1)*G/tp) and ffn columns
//    [r*F/tp, (r+1)*F/tp), gate and up alike), attention output and fc2 row-parallel, word
//    embedding and output layer vocabulary-parallel (cross-entropy over the vocabulary
//    slices: full logits are never gathered). Norms and row-parallel biases are replicated.
//  - Sequence parallel (the same file's row gathers and scatters): the residual stream and
//    norms hold 1/tp of the micro-batch's rows (rows [r*N/tp, (r+1)*N/tp) of the batch-major
//    token order; with micro-batch 1 that is the sequence split Megatron makes);
//    all-gather before column-parallel layers and reduce-scatter after row-parallel ones
//    replace the all-reduces.
//  - Context parallel (parallel/context_parallel.h, which also slices micro-batches): this
//    rank holds two of the sequence's 2*cp chunks; attention is the causal ring there, or
//    with ModelParallel::ulysses DeepSpeed-Ulysses' all-to-all (parallel/ulysses.h).
//  - Pipeline parallel: this rank holds only its chunks' layers (one chunk per virtual
//    stage); chunk_forward/chunk_backward run one micro-batch through one chunk and hand
//    activations to the caller, which sends them to the neighbouring stage.
// Parameter names and initial values are the single-process model's: layer indices are
// global and every element is drawn from (seed, name, index in the full tensor), so a
// rank's parameters are exactly its slices of the one-rank model's (invariant 2).
//
// One model on every device: every op goes through the seam of backend/ops.h with the
// model's Exec, so the same code runs on the CPU or on one GPU per rank (float, or bf16/f16
// weights and activations with float gradients), with
// parameters, gradients and activations in that device's memory. Micro-batches stay host
// arrays; each chunk copies what its ops read to the device.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/ops.h"
#include "comm/communicator.h"
#include "model/transformer_config.h"
#include "parallel/context_parallel.h"
#include "parallel/micro_batch.h"
#include "parallel/pipeline.h"
#include "parallel/tensor_parallel.h"
#include "parallel/ulysses.h"
#include "tensor/parameters.h"

namespace omni {

// The GELU MLP's form: Megatron's exact erf GELU unless --openai-gelu (tanh).
inline GeluForm gelu_form(const TransformerConfig& c) {
  return c.openai_gelu ? GeluForm::Tanh : GeluForm::Erf;
}

struct ModelParallel {
  Communicator* tp = nullptr;  // tensor-parallel group; null: this rank alone
  Communicator* cp = nullptr;  // context-parallel group; null: this rank alone
  // Attention over the cp group by all-to-all (parallel/ulysses.h) instead of the ring.
  bool ulysses = false;
  Communicator* ep = nullptr;  // expert-parallel group (MoE layers); null: this rank alone
  // The experts' own tensor-parallel group (--expert-tensor-parallel-size) and the tp x cp
  // group; null, or expert_tp of tp's size: the experts split over tp (Megatron's default).
  Communicator* expert_tp = nullptr;
  Communicator* tp_cp = nullptr;
  // With expert_tp wider than tp (ETP a multiple of TP): the expert grid's tp x ep group,
  // over which the allgather dispatcher gathers (null: expert_tp, enough at EP 1).
  Communicator* expert_tp_ep = nullptr;
  bool sequence_parallel = false;  // only with more than one tensor-parallel rank
  // This rank's model chunks (virtual pipeline stages), each a range [first, end) of global
  // layer indices; empty: one chunk with every layer.
  std::vector<std::pair<int, int>> chunks;
  bool pre_process = true;   // chunk 0 begins with the embedding (the first stage)
  bool post_process = true;  // the last chunk ends with the final norm and the loss
  // Where the flat parameter buffers live, if not in the device's ordinary memory (ZeRO 2/3's
  // releasable memory, base/releasable_memory.h).
  const DeviceMemory* params_memory = nullptr;
};

// Activation recompute (Megatron's --recompute-granularity): Selective recomputes the
// attention probabilities in the backward, which attention always does here (it keeps only
// its output and log-sum-exp: ops.h), so it keeps what None keeps; Full keeps only each recomputed
// layer's input and runs the layer's forward again before its backward (num_layers: the
// first N layers of each chunk, Megatron's "block" method; 0: every layer). Gradients are
// bit-identical to no recompute.
struct Recompute {
  enum Granularity { None, Selective, Full } granularity = None;
  int num_layers = 0;
};

// T: the storage of weights and activations: float or double on the CPU; float, bf16 or f16 on
// a GPU. Parameter gradients and per-row statistics are Grad (float for bf16/f16).
template <typename T>
class GPTModel final : public PipelineChunks<T> {
 public:
  using Grad = accum_t<T>;
  // Allocates parameters for this rank's part of the model and initialises them from
  // `seed`; activation memory for micro-batches of up to max_batch x config.seq_length
  // tokens is allocated per micro-batch in flight, on first use.
  // `exec` is the device the model lives and runs on (default: the CPU).
  GPTModel(const TransformerConfig& config, int max_batch, uint64_t seed,
           const ModelParallel& parallel = {}, const ops::Exec& exec = {});

  const TransformerConfig& config() const { return cfg_; }
  const ops::Exec& exec() const override { return x_; }
  Device device() const override { return device_; }
  ParameterSet<T>& params() { return params_; }
  const ParameterSet<T>& params() const { return params_; }
  int num_chunks() const override { return int(chunks_.size()); }
  int hidden_size() const override { return cfg_.hidden_size; }
  int tp_size() const { return tp_.size(); }
  int tp_rank() const { return tp_.rank(); }
  // The parameter layout tensor-parallel rank `rank` holds (for gathering full tensors).
  std::vector<ParamInfo> parameter_layout(int rank) const;

  // Forward and backward of one micro-batch through every chunk (no pipeline). Gradients
  // of (grad_scale * mean masked loss) are added to params().grads() (under context
  // parallelism: this rank's part of them; the group's parts sum to the gradient). Returns
  // the mean masked loss (over the whole sequence).
  double forward_backward(const MicroBatch& mb, double grad_scale);
  // Forward only; returns the mean masked loss.
  double forward_loss(const MicroBatch& mb);

  // Pipeline stages. Rows of the activations handed between stages: [stage_rows(mb), hidden].
  int stage_rows(const MicroBatch& mb) const override;
  // Runs micro-batch `mb` through chunk `chunk`, keeping its activations in `slot` (one
  // slot per micro-batch in flight on this rank). `input` is the previous stage's output
  // (unused when the chunk starts with the embedding). Returns this chunk's output, or null
  // when the chunk ends with the loss: then *loss receives the mean masked loss and, when
  // `train`, the gradient of grad_scale * loss is prepared for chunk_backward.
  const T* chunk_forward(int chunk, int slot, const MicroBatch& mb, const T* input, bool train,
                         double grad_scale, double* loss) override;
  // Backward of the same micro-batch: `grad_output` is d/d(output) from the next stage
  // (unused when the chunk ends with the loss). Adds the parameters' gradients; returns
  // d/d(input), or null for the chunk that starts with the embedding.
  const T* chunk_backward(int chunk, int slot, const MicroBatch& mb, const T* grad_output) override;
  // Before the first forward.
  void set_recompute(const Recompute& r);
  // Bytes of activation memory allocated so far (every slot, and recompute's scratch).
  int64_t activation_bytes() const;
  // Bytes of the scratch allocated so far that activation_bytes() leaves out (what `omnitron
  // plan` calls the workspace, train/plan_memory.cpp): the layers' shared buffers, the ring's
  // or Ulysses' blocks, each slot's final norm and staged inputs, multi-latent attention's and
  // the MoE layers' backward scratch, multi-token prediction's state.
  int64_t workspace_bytes() const;
  // Called during backward with [begin, end) ranges of the flat gradient buffer that this
  // micro-batch's backward will not touch again (for data-parallel buckets); null: none.
  void set_grads_ready_hook(std::function<void(int64_t, int64_t)> hook) override {
    grads_ready_ = std::move(hook);
  }
  // --overlap-grad-reduce's sparse tied-embedding gradient (gpt_embedding_grad.cpp; one chunk
  // holding the embedding and the loss, on the CPU). With it on, the backward that has a
  // grads-ready hook (the step's last micro-batch) marks the embedding's range ready at its
  // start, when the range holds every gradient but this micro-batch's input-embedding rows
  // (the tied output layer's is summed in the forward), and keeps those rows' gradients, token
  // ids and positions; after the data-parallel buckets have averaged the range,
  // add_deferred_embedding_grads gathers every rank's rows over `group` and adds them x 1/size
  // in rank order. The sum is the dense path's, rounded in another order.
  void set_deferred_embedding_grads(bool on) { defer_embedding_ = on; }
  void add_deferred_embedding_grads(Communicator& group);
  // The flat range of the embedding's parameters (the grads-ready hook's).
  std::pair<int64_t, int64_t> embedding_range() const { return embedding_range_; }
  // ZeRO stage 3 (parallel/zero_sharding.h): called with (begin, end, true) before the
  // parameters of a flat range are read, (begin, end, false) after; null: always there.
  void set_params_hook(std::function<void(int64_t, int64_t, bool)> hook) {
    params_hook_ = std::move(hook);
  }

  // Mixture of experts (model/gpt_moe.cpp; float or double on the CPU, float, bf16 or f16 on a GPU
  // without context parallelism): what the training forwards since the last
  // take_moe_report() reported, per global layer (zero for dense layers and layers this rank
  // does not hold), multi-token prediction's layers (num_layers + k) after the decoder's.
  struct MoEReport {
    // Summed over the forwards, coefficients excluded (Megatron's tracker values).
    std::vector<double> load_balancing_loss, z_loss;
    // [(num_layers + mtp_num_layers) * experts]: the rows each expert processed (capacity
    // padding left out).
    std::vector<double> tokens_per_expert;
  };
  MoEReport take_moe_report();
  // --moe-router-enable-expert-bias: the routed rows per expert counted since the last update,
  // [(num_layers + mtp_num_layers) * experts] (zero for layers this rank does not hold); sum
  // them over the ranks
  // that saw other tokens of the global batch, then update_expert_bias applies Megatron's
  // bias += rate * sign(mean - count) per layer and restarts the counts.
  std::vector<double>& expert_token_counts() { return expert_tokens_; }
  void update_expert_bias();

  // Multi-token prediction (model/mtp.cpp): each depth's loss summed over the training forwards
  // since the last call (Megatron's "mtp_<k> loss" before averaging).
  std::vector<double> take_mtp_losses();

  // Logits [batch * seq, vocab_size] of every position, in host memory (for tests and tools;
  // training never materialises them). One rank only.
  std::vector<T> forward_logits(const int32_t* tokens, int batch, int seq);
  // Logits [vocab_size] of the last position of a single sequence (batch 1). One rank only.
  std::vector<float> next_token_logits(const int32_t* tokens, int seq);

 private:
  struct MoEState;  // gpt_moe.cpp
  struct MLAState;  // gpt_mla.cpp
  struct MTPState;  // mtp.cpp
  struct LayerActivations {
    Tensor ln1, ln1_mean, ln1_rstd, ln1_full;  // ln1_full: all rows (sequence parallel)
    Tensor q, k, v;                            // after qk-layernorm and rope
    Tensor q_raw, k_raw, qn_mean, qn_rstd, kn_mean, kn_rstd;  // qk-layernorm only
    // Context parallel: every rank's keys and values, block r from rank r (ring attention
    // keeps the blocks it was passed).
    // Ulysses: k_all, v_all, q_all and out_all hold this rank's heads of the whole sequence.
    Tensor k_all, v_all, q_all, out_all;
    Tensor lse, attn;  // attention's [batch, heads, seq] log-sum-exp and output
    Tensor mid;        // residual stream after attention
    Tensor ln2, ln2_mean, ln2_rstd, ln2_full;
    Tensor fc1, act;
    std::shared_ptr<MoEState> moe;  // an MoE layer's routing and experts (gpt_moe.cpp)
    std::shared_ptr<MLAState> mla;  // multi-latent attention's latents (gpt_mla.cpp)
  };
  // The micro-batch's arrays where the ops read them: copies in the model's device memory
  // (mask and key_start null when the micro-batch has none).
  struct Inputs {
    const int32_t *tokens = nullptr, *labels = nullptr, *positions = nullptr, *key_start = nullptr;
    const float* mask = nullptr;
    bool dropout = false;  // a training forward with dropout on: masks are drawn
  };
  // Everything one micro-batch leaves for its backward in one chunk.
  struct Activations {
    std::vector<Tensor> residual;  // layers + 1 residual streams [rows, C]
    std::vector<LayerActivations> layers;
    Tensor final_norm, final_mean, final_rstd, final_full, d_final;
    std::vector<int32_t> positions;          // [tokens]: each row's position (host)
    std::unique_ptr<Storage> input_storage;  // what `in` points into
    Inputs in;
  };
  // A layer's parameters (P = T) or their gradients (P = Grad).
  template <typename P>
  struct LayerTensors {
    P *ln1_w, *ln1_b, *qkv_w, *qkv_b, *qln_w, *qln_b, *kln_w, *kln_b;
    P *proj_w, *proj_b, *ln2_w, *ln2_b, *fc1_w, *fc1_b, *fc2_w, *fc2_b;
  };
  // Sizes of one micro-batch on this rank.
  struct Geometry {
    int batch, seq, tokens, rows;  // rows: of the residual stream (tokens / tp under SP)
  };

  // An MoE layer's parameters (named after "<layer prefix>mlp."); its forward from the
  // pre-MLP norm's rows x into out (overwritten), and backward from dy into dx (overwritten).
  void add_moe_parameters(std::vector<ParamInfo>& p, const std::string& mlp) const;
  void moe_forward(int layer, LayerActivations& a, const T* x, T* out, const MicroBatch& mb,
                   const Geometry& g);
  void moe_backward(int layer, LayerActivations& a, const T* dy, T* dx);
  int64_t moe_activation_bytes(const LayerActivations& a) const;
  int64_t moe_scratch_bytes() const;  // the MoE layers' shared Scratch (workspace_bytes)
  // moe_tp_ for the layout (from the constructor), and the rows of a micro-batch of `tokens`
  // tokens an MoE layer takes.
  void init_moe_rows();
  int moe_tokens(int tokens) const { return tokens / tp_.size() * moe_tp_.size(); }
  // Multi-latent attention (gpt_mla.cpp, model/mla.h): its parameters (named after "<layer
  // prefix>self_attention."), through the layout's `replicated` and `rows` makers; the forward
  // from the input norm's rows (all of them) into a.q, a.k, a.v; the backward from dq, dk, dv
  // (overwritten) to this rank's part of d(input norm rows) in `partial`, which it returns
  // summed over the group (tp_.reduce_rows into d_rows).
  using AddReplicated = std::function<void(std::string, Shape, ParamInit, bool, bool)>;
  using AddRows = std::function<void(std::string, Shape, int64_t, ParamInit, bool)>;
  void add_mla_parameters(const std::string& attn, const AddReplicated& replicated,
                          const AddRows& rows) const;
  void allocate_mla(LayerActivations& l) const;
  int64_t mla_activation_bytes(const LayerActivations& l) const;
  int64_t mla_scratch_bytes() const;  // mla_scratch_ (workspace_bytes)
  void mla_forward(int layer, LayerActivations& a, const T* ln1_full, const Geometry& g,
                   const Inputs& in);
  const T* mla_backward(int layer, LayerActivations& a, T* dq, T* dk, T* dv, T* partial, T* d_rows,
                        const Geometry& g, const Inputs& in);
  // "decoder.layers.<layer>.": the names of a layer's parameters begin with it; layers from
  // config.num_layers on are the multi-token prediction depths'
  // ("mtp.layers.<k>.mtp_model_layer.").
  std::string layer_prefix(int layer) const;
  // Multi-token prediction (mtp.cpp): its parameters after the main model's through
  // `replicated` and `add_layer` (a transformer layer's, by global index); and, in the loss
  // chunk of a training pass, every depth's forward and backward from the final norm's output
  // h0: returns d(grad_scale * scaling factor * mean depth loss)/d(h0).
  void add_mtp_parameters(const AddReplicated& replicated,
                          const std::function<void(int)>& add_layer) const;
  const T* mtp_forward_backward(Activations& a, const MicroBatch& mb, const Geometry& g,
                                double grad_scale);
  int64_t mtp_bytes() const;  // mtp_'s tensors, depths' layers included (workspace_bytes)
  LayerTensors<T> layer_params(int layer) const;
  LayerTensors<Grad> layer_grads(int layer) const;
  // The layer's tensors by name through get (a value or gradient lookup).
  template <typename P, typename Get>
  LayerTensors<P> layer_tensors(int layer, Get get) const;
  // The output layer's weight (the word embeddings when tied), and its gradient.
  T* classifier_weight() const;
  Grad* classifier_grad() const;
  bool has_embedding(int chunk) const { return chunk == 0 && parallel_.pre_process; }
  bool has_loss(int chunk) const { return chunk == num_chunks() - 1 && parallel_.post_process; }
  Geometry geometry(const MicroBatch& mb) const;
  ops::AttentionDims attention_dims(const MicroBatch& mb, const Inputs& in) const;
  // The key of one dropout site's masks for this micro-batch (inactive without in.dropout):
  // hidden states (this rank's rows), or with Attention the probabilities of this rank's heads.
  ops::DropoutKey dropout_key(const MicroBatch& mb, const Inputs& in, const Geometry& g, int layer,
                              ops::DropoutSite site) const;
  // Hidden dropout's mask applied to `rows` (this rank's rows of the residual stream) in place.
  void hidden_dropout(T* rows, const MicroBatch& mb, const Inputs& in, const Geometry& g, int layer,
                      ops::DropoutSite site) const;
  // Copies the micro-batch's arrays (and the rows' positions) to the device, into a.in.
  void stage_inputs(Activations& a, const MicroBatch& mb, const Geometry& g);
  Tensor buffer(Shape shape) const;       // T
  Tensor stat_buffer(Shape shape) const;  // Grad: statistics (mean, rstd, lse), losses
  void check_batch(const MicroBatch& mb) const;
  Activations& activations(int chunk, int slot);
  void allocate_layer(LayerActivations& l);
  int64_t layer_bytes(const LayerActivations& l) const;
  bool recomputed(int i) const;
  // Layer i of the chunk's activations: its own, or the scratch a recomputed layer uses.
  LayerActivations& layer_activations(Activations& a, int i);
  void embed(Activations& a, const MicroBatch& mb, const Geometry& g);
  // Adds the input embedding's gradients of rows d_rows (their token ids, and positions of
  // this rank's rows).
  void embed_backward(const T* d_rows, const int32_t* tokens, const int32_t* positions,
                      const Geometry& g);
  // The step's last micro-batch's input-embedding rows, while deferred (see
  // set_deferred_embedding_grads).
  struct DeferredEmbedding {
    std::vector<int32_t> ids;  // tokens, then positions
    std::vector<T> rows;       // [rows, hidden]
    Geometry g{};
    bool pending = false;
  };
  void defer_embedding_grads(const T* d_rows, const Activations& a, const Geometry& g);
  void layer_forward(int layer, LayerActivations& a, const T* x, T* out, const MicroBatch& mb,
                     const Geometry& g, const Inputs& in);
  // dres holds d(out) on entry and d(x) on return.
  void layer_backward(int layer, LayerActivations& a, const T* x, T* dres, const MicroBatch& mb,
                      const Geometry& g, const Inputs& in);
  // Final norm, classifier and loss; with `train`, leaves d(final norm input) in d_final.
  double head_forward(Activations& a, const MicroBatch& mb, const Geometry& g, bool train,
                      double grad_scale);
  // Runs the chunk's layers forward from a.residual[0] (the chunk's input).
  void layers_forward(int chunk, Activations& a, const MicroBatch& mb, const Geometry& g);
  double masked_tokens(const MicroBatch& mb, const Geometry& g) const;
  // Norm over rows of width `width`: LayerNorm or RMSNorm per config.
  // The norm's applied gamma: w itself, or under --apply-layernorm-1p w + 1 (in gamma_).
  const T* norm_gamma(const T* w, int width) const;
  void norm_forward(T* out, Grad* mean, Grad* rstd, const T* x, const T* w, const T* b, int rows,
                    int width) const;
  void norm_backward(T* dx, Grad* dw, Grad* db, const T* dout, const T* x, const T* w,
                     const Grad* mean, const Grad* rstd, int rows, int width) const;
  void mark_ready(std::pair<int64_t, int64_t> range) const {
    if (grads_ready_ && range.second > range.first) grads_ready_(range.first, range.second);
  }
  void use_params(std::pair<int64_t, int64_t> range, bool use) const {
    if (params_hook_ && range.second > range.first) params_hook_(range.first, range.second, use);
  }
  void final_norm_forward(Activations& a, const Geometry& g);

  TransformerConfig cfg_;
  int max_batch_;
  uint64_t seed_;  // also dropout's
  ModelParallel parallel_;
  ops::Exec x_;
  Device device_;
  std::unique_ptr<Communicator> own_tp_, own_cp_, moe_self_;  // moe_self_: init_moe_rows
  Communicator* cp_;
  TensorParallel<T> tp_;  // the tensor-parallel group's primitives
  // The ranks an MoE layer's input rows are gathered from and its output summed over: tp_,
  // or without a shared expert under ETP < TP the experts' own block of etp tp ranks
  // (moe_takes_block_rows; ETP 1: this rank alone) and under ETP > TP this rank alone.
  TensorParallel<T> moe_tp_;
  bool sp_;
  int heads_, groups_, ffn_;  // this rank's query heads, groups, ffn columns
  VocabShard vocab_;          // the word embedding's and output layer's rows held
  std::vector<std::pair<int, int>> chunks_;
  ParameterSet<T> params_;
  std::vector<double> rope_cos_, rope_sin_;  // the CPU's tables
  Tensor rope_device_;                       // a GPU's: float cos, then sin
  ops::RopeTables rope_;
  Tensor ones_, gamma_;  // --apply-layernorm-1p: [hidden] ones, and w + 1
  std::vector<std::vector<std::unique_ptr<Activations>>> acts_;  // [chunk][slot]
  std::function<void(int64_t, int64_t)> grads_ready_;
  std::function<void(int64_t, int64_t, bool)> params_hook_;
  Recompute recompute_;
  LayerActivations recompute_scratch_;  // Full: the layer being recomputed
  // Scratch reused by every layer.
  // full_ and d_full_ hold all of a micro-batch's rows; d_resid_ and d_rows_ its rows of
  // the residual stream.
  Tensor qkv_, full_, d_resid_, d_rows_, d_full_, d_ffn_, d_fc1_, d_attn_, dq_, dk_, dv_, dq_raw_,
      dk_raw_;
  Tensor token_losses_;  // [tokens]: the classifier's per-row losses (MicroBatch::token_losses)
  // Context parallel: attention over the group's ring, with its scratch.
  RingAttention<T> ring_;
  UlyssesAttention<T> ulysses_;  // or, with ModelParallel::ulysses, the all-to-all
  // Flat-buffer ranges, for set_grads_ready_hook: per global layer, the embedding's, the
  // final norm's and output layer's.
  std::vector<std::pair<int64_t, int64_t>> layer_ranges_;
  std::pair<int64_t, int64_t> embedding_range_{0, 0}, head_range_{0, 0};
  // Mixture of experts: whether the running forward trains (and is a recompute's), its
  // gradient scale, and what training forwards reported (see MoEReport).
  bool moe_training_ = false, moe_recomputing_ = false;
  double moe_grad_scale_ = 0;
  MoEReport moe_report_;
  std::shared_ptr<void> moe_scratch_;  // the MoE layers' one MoELayer::Scratch (gpt_moe.cpp)
  std::vector<double> expert_tokens_;
  std::shared_ptr<MLAState> mla_scratch_;  // multi-latent attention's backward scratch
  std::shared_ptr<MTPState> mtp_;          // multi-token prediction's activations and losses
  bool defer_embedding_ = false;
  DeferredEmbedding deferred_;
};

}  // namespace omni
