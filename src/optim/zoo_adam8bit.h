// bitsandbytes' 8-bit Adam moments (zoo_adam8bit.cpp says how they are quantised), for any
// list of segments: adam8bit's are the parameters, GaLore's 8-bit variant's the projected
// gradients of its matrices.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "backend/zoo_adam8bit_math.h"
#include "optim/optimizer.h"

namespace omni {

// bitsandbytes' two dynamic codes (signed for the first moment, unsigned for the second) and
// its rounding onto them, shared by Adam8bitMoments and adam8bit's sharded layout.
struct Adam8bitCodes {
  Adam8bitCodes();
  // The code of x / absmax (a first moment whose nearest code has the other sign moves one
  // code toward its own); the code of 0 where absmax is 0.
  uint8_t quantize_signed(float x, float absmax) const;
  uint8_t quantize_unsigned(float x, float absmax) const;
  std::array<float, 256> code1, code2;
};

// bitsandbytes' Adam update of one element in fp32 (backend/zoo_adam8bit_math.h): m and v by
// Adam's recurrences, then w += -lr * sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps *
// sqrt(1 - b2^t)), then w *= 1 - lr * wd; a gradient that is not finite zeroes the moments and
// skips the element.
struct Adam8bitUpdate : adam8bit::Constants {
  Adam8bitUpdate(const OptimizerConfig& config, double lr, double wd, int64_t step);
  template <typename T>
  void operator()(float grad, float& m, float& v, T& w) const {
    if (adam8bit::update_moments(*this, grad, m, v)) w = T(adam8bit::apply(*this, m, v, float(w)));
  }
};

class Adam8bitMoments {
 public:
  // One segment per size: 8-bit where it has at least config.zoo.adam8bit_min_8bit_size
  // elements, fp32 otherwise. With a GPU `exec` the moments live on `device` and step() takes
  // device pointers (float); save() and load() read the host copy that download() fills and
  // upload() sends back.
  Adam8bitMoments(const OptimizerConfig& config, const std::vector<int64_t>& sizes,
                  const ops::Exec& exec = {}, Device device = {});

  // bitsandbytes' Adam step on segment s (n elements): w += -lr * sqrt(1 - b2^t) / (1 - b1^t)
  // * m / (sqrt(v) + eps * sqrt(1 - b2^t)), then w *= 1 - lr * wd.
  template <typename T>
  void step(size_t s, T* w, const T* g, double lr, double wd, int64_t step);
  void download();
  void upload();

  // The checkpoint's view of segment s: state1/state2 hold code indices (8-bit) or the fp32
  // moments; absmax1/absmax2 each block's absolute maximum at the block's first element.
  // `out` points at the four views' first element for this segment.
  template <typename T>
  void save(size_t s, const std::array<T*, 4>& out) const;
  template <typename T>
  void load(size_t s, const std::array<const T*, 4>& in, const std::string& what);

  int64_t size(size_t s) const { return segments_[s].size; }
  // The bytes the moments take (the codes, the blocks' maxima, the fp32 segments).
  int64_t bytes() const {
    return int64_t(q1_.size() + q2_.size()) +
           int64_t(sizeof(float) * (absmax1_.size() + absmax2_.size() + s1_.size() + s2_.size()));
  }

 private:
  struct Segment {
    int64_t size = 0;
    bool quantized = false;
    int64_t start = 0;        // into q1_/q2_ (quantized) or s1_/s2_
    int64_t block_start = 0;  // into absmax1_/absmax2_
  };
  OptimizerConfig cfg_;
  Adam8bitCodes codes_;
  int64_t block_;
  std::vector<Segment> segments_;
  std::vector<uint8_t> q1_, q2_;
  std::vector<float> absmax1_, absmax2_, s1_, s2_;
  // On the GPU: the codes (q1 then q2), the fp32 moments (s1 then s2), the blocks' maxima
  // (absmax1, absmax2, then the step's new ones), the code values then each segment's run.
  ops::Exec exec_;
  Tensor codes_gpu_, fp32_gpu_, maxima_gpu_, tables_gpu_;
};

}  // namespace omni
