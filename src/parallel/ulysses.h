// DeepSpeed-Ulysses sequence parallelism (Megatron-DeepSpeed's --ds-sequence-parallel-size, or
// Megatron's --cp-comm-type a2a): the context-parallel group splits each sequence as the ring
// does (parallel/context_parallel.h: rank r holds chunks r and 2*cp-1-r of 2*cp), and around
// attention an all-to-all trades the sequence split for a split of the heads. Each rank sends
// every other rank that rank's share of its query heads and key/value groups for its own
// rows, and receives its own share of the heads for every row of the sequence; it puts the
// rows back in sequence order (undoing the load-balanced chunk order), runs ordinary causal
// attention over the whole sequence for its heads, and a second all-to-all returns each rank
// its rows of every head. The backward runs the same exchanges the other way: d(out) in,
// d(q), d(k), d(v) back.
//
// Rope is applied before the exchange (on the rank's own rows, at their positions), and the
// per-row key ranges of packed documents are gathered over the group, so the local attention
// sees exactly the one-rank model's queries, keys and masks. Attention dropout keys its masks
// by global head and position (backend/dropout_mask.h), so the call passes this rank's first
// global head and the sequence as one rank's.
//
// Against the ring, each rank sends 4 tensors of its rows' (cp-1)/cp share per attention
// forward (q, k, v, out) and 4 per backward, whatever cp is; the ring passes k and v around
// cp-1 times. The heads (and key/value groups) of each tensor-parallel rank must divide by cp
// (as DeepSpeed's even-heads exchange requires; key/value groups are not replicated).
// Packing each destination's columns into one block is one strided copy (ops::copy_rows).
#pragma once

#include <cstdint>
#include <memory>

#include "backend/ops.h"
#include "comm/communicator.h"
#include "tensor/tensor.h"

namespace omni {

template <typename T>
class UlyssesAttention {
 public:
  using Grad = accum_t<T>;
  // What the forward keeps for the backward: this rank's heads over the whole sequence, rows
  // in sequence order. q [batch * seq, heads/cp * hd], k [batch * seq, groups/cp * hd],
  // v [batch * seq, groups/cp * vd], out [batch * seq, heads/cp * vd].
  struct Whole {
    T *q, *k, *v, *out;
  };

  UlyssesAttention() = default;
  // Scratch for micro-batches of up to max_batch x local_seq rows of this rank's `heads` query
  // heads and `groups` key/value groups (of its tensor-parallel share) of head_dim (values:
  // v_head_dim, 0 for head_dim, as multi-latent attention has them), on exec's device. `group`
  // (not owned) has more than one rank; heads and groups must divide by its size.
  UlyssesAttention(Communicator* group, const ops::Exec& exec, Device device, int max_batch,
                   int local_seq, int heads, int groups, int head_dim, int v_head_dim = 0);

  // out [tokens, heads*vd] of this rank's rows; lse [batch, heads/cp, seq * cp] of its heads
  // over the whole sequence. q [tokens, heads*hd], k [tokens, groups*hd] and v
  // [tokens, groups*vd] are this rank's rows after rope; `local` the attention dims of those
  // rows (key_start: their first keys on the device, dropout: the layer's key for this rank's
  // rows, and multi-latent attention's value head dim and softmax scale).
  void forward(T* out, Grad* lse, const T* q, const T* k, const T* v, const Whole& whole,
               const ops::AttentionDims& local);
  // dq, dk, dv (overwritten) from d(out) of this rank's rows; whole and lse as the forward left
  // them.
  void backward(T* dq, T* dk, T* dv, const T* dout, const Whole& whole, const Grad* lse,
                const ops::AttentionDims& local);
  // Bytes of the scratch the constructor allocated (exchange blocks, whole-sequence gradients,
  // gathered first keys).
  int64_t scratch_bytes() const {
    int64_t b = 0;
    for (const Tensor* t : {&send_, &recv_, &d_whole_[0], &d_whole_[1], &d_whole_[2], &d_whole_[3]})
      b += t->held_bytes();
    for (const auto& s : key_starts_) b += s ? int64_t(s->bytes()) : 0;
    return b;
  }

 private:
  // Rows [batch * local_seq, width * cp] of this rank to [batch * seq, width] of every rank's
  // rows in sequence order, this rank's `width` columns; and back.
  void to_heads(T* whole, const T* local, int batch, int width);
  void to_sequence(T* local, const T* whole, int batch, int width);
  // The whole-sequence attention call: dims of this rank's heads, with the gathered key ranges.
  ops::AttentionDims whole_dims(const ops::AttentionDims& local);

  Communicator* group_ = nullptr;
  ops::Exec x_;
  Device device_;
  int local_seq_ = 0, heads_ = 0, groups_ = 0, head_dim_ = 0, v_dim_ = 0;
  Tensor send_, recv_;  // one exchange's blocks, [cp][rows, width]
  Tensor d_whole_[4];   // the backward's d(out), d(q), d(k), d(v) of this rank's heads
  std::unique_ptr<Storage> key_starts_[2];  // gathered first keys: chunk order, sequence order
};

}  // namespace omni
