// bitsandbytes' 8-bit Adam moments (zoo_adam8bit.cpp says how they are quantised), for any
// list of segments: adam8bit's are the parameters, GaLore's 8-bit variant's the projected
// gradients of its matrices.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "optim/optimizer.h"

namespace omni {

class Adam8bitMoments {
 public:
  // One segment per size: 8-bit where it has at least config.zoo.adam8bit_min_8bit_size
  // elements, fp32 otherwise.
  Adam8bitMoments(const OptimizerConfig& config, const std::vector<int64_t>& sizes);

  // bitsandbytes' Adam step on segment s (n elements): w += -lr * sqrt(1 - b2^t) / (1 - b1^t)
  // * m / (sqrt(v) + eps * sqrt(1 - b2^t)), then w *= 1 - lr * wd.
  template <typename T>
  void step(size_t s, T* w, const T* g, double lr, double wd, int64_t step);

  // The checkpoint's view of segment s: state1/state2 hold code indices (8-bit) or the fp32
  // moments; absmax1/absmax2 each block's absolute maximum at the block's first element.
  // `out` points at the four views' first element for this segment.
  template <typename T>
  void save(size_t s, const std::array<T*, 4>& out) const;
  template <typename T>
  void load(size_t s, const std::array<const T*, 4>& in, const std::string& what);

  int64_t size(size_t s) const { return segments_[s].size; }

 private:
  struct Segment {
    int64_t size = 0;
    bool quantized = false;
    int64_t start = 0;        // into q1_/q2_ (quantized) or s1_/s2_
    int64_t block_start = 0;  // into absmax1_/absmax2_
  };
  uint8_t quantize_signed(float x, float absmax) const;

  float b1_, b2_, eps_;
  std::array<float, 256> code1_, code2_;
  int64_t block_;
  std::vector<Segment> segments_;
  std::vector<uint8_t> q1_, q2_;
  std::vector<float> absmax1_, absmax2_, s1_, s2_;
  std::vector<float> m_, v_;  // scratch of one block
};

}  // namespace omni
