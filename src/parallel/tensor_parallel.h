// Tensor- and sequence-parallel primitives, as Megatron-Core's tensor_parallel package draws
// them (mappings, layers, cross_entropy): what a layer calls to run with its weights split
// over the tensor-parallel group. The model (model/gpt_layer.cpp, model/gpt_model.cpp) is
// written with these; with a group of one rank every collective is a copy or nothing
// (DESIGN.md invariant 3).
//  - Column-parallel linear: this rank holds rows [r*out/tp, (r+1)*out/tp) of the weight, so it
//    computes its columns of the output from the whole input; row-parallel linear: it holds
//    columns of the weight and the matching columns of the input, so its product is a partial
//    sum that the group adds up. Megatron pairs them (QKV then the attention's projection, fc1
//    then fc2) so that one collective per pair, forward and backward, is enough.
//  - Sequence parallel: between those pairs (norms and the residual stream) each rank holds
//    1/tp of the rows (rows [r*N/tp, (r+1)*N/tp) of the batch-major token order), so the
//    row-parallel sum becomes a reduce-scatter and the column-parallel layer all-gathers its
//    input first; without it every rank holds every row and the sum is an all-reduce.
//  - Vocabulary parallel: the word embedding and the output layer hold a slice of the padded
//    vocabulary each; the lookup is summed over the group (ids outside the slice give zero),
//    and cross-entropy combines per-row maxima and sums across the slices, so full logits
//    are never gathered.
// Activations are [tokens, channels] row-major in the Exec's memory; T is the storage type
// (float or double on the CPU; float, bf16 or f16 on a GPU), parameter gradients accum_t<T>.
#pragma once

#include <cstdint>

#include "backend/ops.h"
#include "comm/communicator.h"

namespace omni {

// The slice of the vocabulary a tensor-parallel rank holds: Megatron pads the vocabulary to a
// multiple of --make-vocab-size-divisible-by x TP and gives each rank `rows` ids from `start`,
// of which `real` (possibly 0 on the last ranks) are ids of the unpadded vocabulary.
struct VocabShard {
  int rows = 0, start = 0, real = 0;
};
VocabShard vocab_shard(int vocab_size, int divisible_by, int tp, int rank);

template <typename T>
class TensorParallel {
 public:
  using Grad = accum_t<T>;
  TensorParallel() = default;
  // `group`: the tensor-parallel ranks (not owned); sequence parallelism applies only with
  // more than one of them. Rows are `hidden` wide.
  TensorParallel(Communicator* group, bool sequence_parallel, int hidden, const ops::Exec& exec);

  int size() const { return group_->size(); }
  int rank() const { return group_->rank(); }
  bool sequence_parallel() const { return sp_; }
  // Rows of the residual stream this rank holds for a micro-batch of `tokens` tokens.
  int rows(int tokens) const { return sp_ ? tokens / size() : tokens; }
  // The first of them, in the micro-batch's token order.
  int first_row(int tokens) const { return sp_ ? rank() * rows(tokens) : 0; }

  // ---- Sequence-parallel regions (Megatron's mappings) -------------------------------------
  // All of a micro-batch's rows [tokens, hidden] from this rank's `part` [rows, hidden]:
  // all-gathered into `full` under sequence parallelism (returns full), else `part` itself.
  const T* gather_rows(T* full, const T* part, int tokens) const;
  // The sum over the group of `partial` [tokens, hidden]: reduce-scattered into `out`'s rows
  // under sequence parallelism (returns out), else all-reduced in place (returns partial).
  const T* reduce_rows(T* out, T* partial, int tokens) const;
  // Where a layer whose result reduce_rows sums should write it: `scratch` [tokens, hidden]
  // under sequence parallelism, else the output itself (summed in place).
  T* partial_rows(T* out, T* scratch) const { return sp_ ? scratch : out; }

  // ---- Column-parallel linear (input [rows, hidden], output columns [tokens, out]) --------
  // y = gather_rows(x) w^T + b, w [out, hidden]; x_full [tokens, hidden] receives the gathered
  // input under sequence parallelism (the backward reads it; else pass x itself).
  void column_forward(T* y, T* x_full, const T* x, const T* w, const T* b, int out,
                      int tokens) const;
  // Adds the weight's and bias's gradients; d(x) of the whole group is summed: returns where
  // this rank's rows of it are (dx [rows, hidden], or `partial` [tokens, hidden], which it
  // overwrites, without sequence parallelism). x_full: the forward's gathered input.
  const T* column_backward(T* dx, T* partial, Grad* dw, Grad* db, const T* dy, const T* x_full,
                           const T* w, int out, int tokens) const;

  // ---- Row-parallel linear (input columns [tokens, in], output [rows, hidden]) -------------
  // y = sum over the group of x w^T, then + b (b replicated: added once, after the sum);
  // w [hidden, in]. scratch [tokens, hidden] holds the partial product under sequence
  // parallelism.
  void row_forward(T* y, T* scratch, const T* x, const T* w, const T* b, int in, int tokens) const;
  // dx [tokens, in] = dy w, with dy this rank's rows [rows, hidden] gathered into dy_full
  // under sequence parallelism; adds the weight's and bias's gradients.
  void row_backward(T* dx, Grad* dw, Grad* db, T* dy_full, const T* dy, const T* x, const T* w,
                    int in, int tokens) const;

  // ---- Vocabulary parallel -----------------------------------------------------------------
  // The word embedding's rows [rows, hidden] of `tokens` ids [tokens] (seq per sample) from
  // this rank's slice w [shard.rows, hidden]; scratch as row_forward's.
  void embedding_forward(T* out, T* scratch, const int32_t* ids, const T* w, const VocabShard& s,
                         int tokens, int seq) const;
  // Adds the slice's gradient from d(out) rows [rows, hidden] (gathered into d_full under
  // sequence parallelism).
  void embedding_backward(Grad* dw, T* d_full, const T* d_rows, const int32_t* ids,
                          const VocabShard& s, int tokens, int seq) const;
  // The output layer fused with cross-entropy (ops::classifier_cross_entropy) over this
  // rank's slice s of the vocabulary (w [s.rows, hidden]), h the whole input [tokens, hidden]:
  // the per-row maxima and sums are combined over the group, so each rank's losses are the
  // full softmax's and dh (when non-null) is this rank's part of d(grad_scale * loss)/dh, for
  // reduce_rows to sum. Returns the masked sum of the rows' losses.
  double vocab_cross_entropy(Grad* losses, T* dh, Grad* dw, const T* h, const T* w,
                             const int32_t* targets, const float* mask, const VocabShard& s,
                             int tokens, double grad_scale) const;

 private:
  Communicator* group_ = nullptr;
  bool sp_ = false;
  int hidden_ = 0;
  ops::Exec x_;
};

}  // namespace omni
