// Context parallelism (Megatron's --context-parallel-size): each rank of the group holds two
// of a sequence's 2*cp chunks of seq/(2*cp) tokens, rank r chunks r and 2*cp-1-r (so every
// rank has the same share of causal attention work). Here: the slicing of a micro-batch into
// a rank's part, the sums over the sequence that the ranks hold in parts (the loss, the
// unmasked tokens), and causal ring attention, the one layer that needs the other ranks'
// tokens. The model (model/gpt_layer.cpp) calls the ring in place of attention.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/ops.h"
#include "comm/communicator.h"
#include "parallel/micro_batch.h"
#include "tensor/tensor.h"

namespace omni {

// The index in the full sequence of row `local` (0 .. local_seq-1) of context-parallel rank
// `rank` of `cp`, where local_seq = seq / cp.
inline int context_parallel_index(int local, int local_seq, int cp, int rank) {
  const int half = local_seq / 2;
  return local < half ? rank * half + local : (2 * cp - 1 - rank) * half + (local - half);
}

// A rank's share of a micro-batch: its rows of tokens, labels, loss mask, positions and
// first keys, with each row's index in the full sequence.
class ContextParallelBatch {
 public:
  // `full` is the whole micro-batch [batch, seq]; seq must divide by 2 * cp.
  void slice(const MicroBatch& full, int cp, int rank);
  const MicroBatch& batch() const { return mb_; }
  void set_loss_divisor(double d) { mb_.loss_divisor = d; }

 private:
  std::vector<int32_t> tokens_, labels_, positions_, key_start_, seq_index_;
  std::vector<float> loss_mask_;
  MicroBatch mb_;
};

// A sum over the whole sequence from this rank's part of it (its chunks' masked loss, or
// their count of unmasked tokens): the sum over the context-parallel group.
inline double sum_over_sequence(Communicator& cp, double part) {
  cp.all_reduce(&part, 1);
  return part;
}

// Causal ring attention over the context-parallel group (as Megatron-Core runs attention with
// context parallelism over point-to-point sends). The forward passes the key/value blocks
// around the ring, each rank's block to the next while the rank attends to the block it
// holds, and merges each block's output into the result by its log-sum-exp
// (ops::attention_merge); every rank ends up holding every block, which the backward reuses.
// The backward computes each block's part of d(q), d(k), d(v) from the merged output and
// log-sum-exp, and passes each block's accumulating d(k), d(v) around the ring behind it, so
// after cp steps they arrive at the block's owner.
//
// Causality and packed documents (--reset-attention-mask) become per-row key ranges within
// each block, from the rows' indices in the full sequence (MicroBatch::seq_index) and their
// first keys (MicroBatch::key_start), computed on the host for each block.
template <typename T>
class RingAttention {
 public:
  using Grad = accum_t<T>;
  RingAttention() = default;
  // Scratch for micro-batches of up to max_batch x local_seq rows of this rank's `heads` query
  // heads and `groups` key/value groups of head_dim, on exec's device. `group` (not owned)
  // has more than one rank. Multi-latent attention: the values' head dim vd and the softmax
  // scale, as in ops::AttentionDims (0: head_dim, 1/sqrt(head_dim)).
  RingAttention(Communicator* group, const ops::Exec& exec, Device device, int max_batch,
                int local_seq, int heads, int groups, int head_dim, int v_head_dim = 0,
                double softmax_scale = 0);

  // out [tokens, heads*vd] and lse [batch, heads, seq] of this rank's queries q over the whole
  // sequence's keys; k [tokens, groups*hd], v [tokens, groups*vd] are this rank's. k_all, v_all
  // [cp * tokens, groups*hd or vd] receive every rank's keys and values, block r from rank r
  // (the backward reads them).
  // `drop`: attention dropout's key (inactive: none); each block's key_rank is set here.
  void forward(T* out, Grad* lse, const T* q, const T* k, const T* v, T* k_all, T* v_all,
               const MicroBatch& mb, const ops::DropoutKey& drop = {});
  // dq [tokens, heads*hd] and this rank's dk, dv (overwritten) from dout [tokens, heads*vd];
  // out, lse, k_all and v_all as the forward left them.
  void backward(T* dq, T* dk, T* dv, const T* dout, const T* out, const Grad* lse, const T* q,
                const T* k_all, const T* v_all, const MicroBatch& mb,
                const ops::DropoutKey& drop = {});
  // Bytes of the scratch the constructor allocated (blocks in flight, key bounds).
  int64_t scratch_bytes() const {
    int64_t b = bounds_ ? int64_t(bounds_->bytes()) : 0;
    for (const Tensor* t :
         {&out_, &lse_, &dq_, &dk_, &dv_, &acc_[0][0], &acc_[0][1], &acc_[1][0], &acc_[1][1]})
      b += t->held_bytes();
    return b;
  }

 private:
  // Rows' [first, last] keys within rank `src`'s block of keys, copied to bounds_.
  ops::AttentionDims block_dims(const MicroBatch& mb, int src);
  Tensor buffer(Shape shape, DType t) const;

  Communicator* group_ = nullptr;
  ops::Exec x_;
  Device device_;
  int heads_ = 0, groups_ = 0, head_dim_ = 0, v_dim_ = 0;
  double softmax_scale_ = 0;
  // One block's output and log-sum-exp, dq and dk/dv of one block, and two key/value
  // gradient accumulators in flight.
  Tensor out_, lse_, dq_, dk_, dv_, acc_[2][2];
  std::vector<int32_t> first_, last_;
  std::unique_ptr<Storage> bounds_;  // first_ then last_, where the ops read them
};

}  // namespace omni
