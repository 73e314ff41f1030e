// Dropout's masks as a pure function of a key, shared by the CPU ops, the GPU kernels and the
// emulator, so every device, every parallel layout, activation recompute and a resumed run
// drop the same elements (Megatron's hidden and attention dropout, with its 1/(1-p) scaling
// of the kept values).
//
// Element e of sample s keeps its value when word e % 4 of Philox4x32-10 block
// (counter = e / 4 in words 0-1, s in words 2-3; key = DropoutKey::key) is at least
// DropoutKey::threshold = round(p 2^32). The key is drawn once per (seed, iteration, layer,
// site) by dropout_key() on the host; e is the element's index in the sample's whole
// unsharded tensor: position x hidden + channel for the hidden states, and
// (head x seq + query position) x seq + key position for the attention probabilities, with
// global heads and positions in the full sequence (parallel/context_parallel.h's split).
// Plain C++17 that nvcc and hipcc also compile for the device.
#pragma once

#include <cstdint>

#include "backend/op_types.h"

#if defined(__CUDACC__) || defined(__HIPCC__)
#define OMNI_DROPOUT_HD __host__ __device__ inline
#else
#define OMNI_DROPOUT_HD inline
#endif

namespace omni::dropout {

// Philox4x32-10 (base/philox.h has the same function for the host; a test checks they agree),
// written without std::array so device code needs no relaxed constexpr.
struct Block {
  uint32_t w[4];
};
OMNI_DROPOUT_HD Block philox(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
                             uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    if (round > 0) k0 += 0x9E3779B9u, k1 += 0xBB67AE85u;
    const uint64_t p0 = uint64_t{0xD2511F53u} * c0, p1 = uint64_t{0xCD9E8D57u} * c2;
    const uint32_t n0 = uint32_t(p1 >> 32) ^ c1 ^ k0, n2 = uint32_t(p0 >> 32) ^ c3 ^ k1;
    c1 = uint32_t(p1), c3 = uint32_t(p0), c0 = n0, c2 = n2;
  }
  return {{c0, c1, c2, c3}};
}

// The Philox block holding element e's word (e / 4) of sample s.
OMNI_DROPOUT_HD Block block(const ops::DropoutKey& k, int64_t sample, uint64_t block_index) {
  const uint64_t s = uint64_t(sample);
  return philox(uint32_t(block_index), uint32_t(block_index >> 32), uint32_t(s), uint32_t(s >> 32),
                k.key[0], k.key[1]);
}

OMNI_DROPOUT_HD bool keep(const ops::DropoutKey& k, int64_t sample, uint64_t element) {
  return block(k, sample, element >> 2).w[element & 3] >= k.threshold;
}

// The full-sequence position of row `local` of a context-parallel rank's share (the split of
// parallel/context_parallel.h, repeated here for the device; one rank: local itself).
OMNI_DROPOUT_HD int64_t sequence_position(int local, int local_seq, int cp, int rank) {
  const int half = local_seq / 2;
  if (cp == 1) return local;
  return local < half ? int64_t(rank) * half + local
                      : int64_t(2 * cp - 1 - rank) * half + (local - half);
}

// Attention probability (batch b, local head h, query row i, key j of the block) as an element
// index of its sample's [heads, seq, seq] probabilities.
OMNI_DROPOUT_HD uint64_t attention_element(const ops::DropoutKey& k, int local_seq, int h, int i,
                                           int j) {
  const uint64_t S = uint64_t(local_seq) * k.cp;
  const uint64_t qpos = uint64_t(sequence_position(i, local_seq, k.cp, k.cp_rank));
  const uint64_t kpos = uint64_t(sequence_position(j, local_seq, k.cp, k.key_rank));
  return (uint64_t(k.head_offset + h) * S + qpos) * S + kpos;
}

}  // namespace omni::dropout
