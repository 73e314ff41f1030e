// 8-bit Adam with block-wise dynamic quantisation of both moments (Dettmers, Lewis, Shleifer,
// Zettlemoyer, "8-bit Optimizers via Block-wise Quantization", arXiv:2110.02861), as
// bitsandbytes' Adam8bit (the kernel kOptimizerStatic8bit2StateBlockwise, behind
// Megatron-DeepSpeed's OPT=adam8bit):
//  - each tensor's moments are stored as one byte per element, an index into a 256-value
//    "dynamic" code (signed for the first moment, unsigned for the second; bitsandbytes'
//    create_dynamic_map), times the absolute maximum of its block of 256 elements;
//  - a step dequantises the block, updates the moments in fp32 (Adam's recurrences), updates
//    the weights from those fp32 moments, then re-quantises them against the block's new
//    absolute maximum (nearest code; a first moment whose code has the other sign moves one
//    code toward its own);
//  - the weight update is bitsandbytes' Adam: w += -lr * sqrt(1 - b2^t) / (1 - b1^t) *
//    m / (sqrt(v) + eps * sqrt(1 - b2^t)), then w *= 1 - lr * wd (decoupled decay);
//  - tensors under min_8bit_size elements (4096) keep fp32 moments with the same update.
//
// Checkpoint state, laid out like the parameters (so resume is bit-exact): state1 and state2
// hold each element's code index (0..255) for 8-bit tensors and the fp32 moment otherwise;
// absmax1 and absmax2 hold block b's absolute maximum at the block's first element (zeros
// elsewhere). They are filled when asked for and read back at the next step.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

#include "base/error.h"
#include "optim/optimizer_zoo.h"
#include "optim/zoo_adam8bit.h"

namespace omni {

// bitsandbytes' dynamic map (create_dynamic_map with 7 exponent bits, 8 bits in all): for
// each decade 10^(i-6), i = 0..6, the midpoints of linspace(0.1, 1, n_i + 1), n_i = 2^i
// (signed, with their negatives) or 2^(i+1) (unsigned); then 0 and 1; sorted. Computed in
// double and rounded once: bitsandbytes' float32 arithmetic leaves the last bit to how
// torch vectorises linspace on the machine at hand, and is within two ulps of these.
std::array<float, 256> dynamic_quantization_map(bool is_signed) {
  std::vector<float> data;
  for (int i = 0; i < 7; ++i) {
    const int items = is_signed ? (1 << i) + 1 : (1 << (i + 1)) + 1;
    const double step = (1.0 - 0.1) / double(items - 1), decade = std::pow(10.0, i - 6);
    for (int k = 0; k + 1 < items; ++k) {
      const double mean = ((0.1 + step * k) + (0.1 + step * (k + 1))) / 2.0;
      data.push_back(float(decade * mean));
      if (is_signed) data.push_back(float(-decade * mean));
    }
  }
  data.push_back(0.0f);
  data.push_back(1.0f);
  OMNI_REQUIRE(data.size() == 256, "[adam8bit] the dynamic map has ", data.size(), " codes");
  std::sort(data.begin(), data.end());
  std::array<float, 256> out{};
  std::copy(data.begin(), data.end(), out.begin());
  return out;
}

namespace {

// The nearest code to x in the sorted map (the lower one on a tie).
uint8_t nearest_code(const std::array<float, 256>& code, float x) {
  const auto it = std::lower_bound(code.begin(), code.end(), x);
  if (it == code.begin()) return 0;
  if (it == code.end()) return 255;
  const int hi = int(it - code.begin()), lo = hi - 1;
  return uint8_t(x - code[size_t(lo)] <= code[size_t(hi)] - x ? lo : hi);
}

}  // namespace

Adam8bitMoments::Adam8bitMoments(const OptimizerConfig& config, const std::vector<int64_t>& sizes)
    : b1_(float(config.adam_beta1)),
      b2_(float(config.adam_beta2)),
      eps_(float(config.adam_eps)),
      code1_(dynamic_quantization_map(true)),
      code2_(dynamic_quantization_map(false)),
      block_(config.zoo.adam8bit_block_size) {
  OMNI_REQUIRE(block_ > 0, "[adam8bit] the block size must be positive");
  for (int64_t n : sizes) {
    Segment l;
    l.size = n;
    l.quantized = n >= config.zoo.adam8bit_min_8bit_size;
    if (l.quantized) {
      l.start = int64_t(q1_.size());
      l.block_start = int64_t(absmax1_.size());
      q1_.resize(q1_.size() + size_t(n), 0);
      q2_.resize(q2_.size() + size_t(n), 0);
      const int64_t blocks = (n + block_ - 1) / block_;
      absmax1_.resize(absmax1_.size() + size_t(blocks), 0.0f);
      absmax2_.resize(absmax2_.size() + size_t(blocks), 0.0f);
    } else {
      l.start = int64_t(s1_.size());
      s1_.resize(s1_.size() + size_t(n), 0.0f);
      s2_.resize(s2_.size() + size_t(n), 0.0f);
    }
    segments_.push_back(l);
  }
  m_.resize(size_t(block_));
  v_.resize(size_t(block_));
}

uint8_t Adam8bitMoments::quantize_signed(float x, float absmax) const {
  if (absmax == 0.0f) return nearest_code(code1_, 0.0f);
  uint8_t c = nearest_code(code1_, x / absmax);
  if (std::signbit(code1_[c]) != std::signbit(x)) c = uint8_t(x > 0.0f ? c + 1 : c - 1);
  return c;
}

template <typename T>
void Adam8bitMoments::step(size_t s, T* w, const T* g, double lr, double wd_, int64_t step) {
  const float b1 = b1_, b2 = b2_, eps = eps_, wd = float(wd_);
  const float correction1 = 1.0f - float(std::pow(double(b1), double(step)));
  const float correction2 = std::sqrt(1.0f - float(std::pow(double(b2), double(step))));
  const float step_size = -float(lr) * correction2 / correction1;
  const Segment& l = segments_[s];
  auto update = [&](int64_t i, float& m, float& v) {
    const float grad = float(g[i]);
    if (!std::isfinite(grad)) {  // bitsandbytes zeroes the moments and skips the element
      m = v = 0.0f;
      return;
    }
    m = m * b1 + (1.0f - b1) * grad;
    v = v * b2 + (1.0f - b2) * (grad * grad);
    float x = float(w[i]) + step_size * (m / (std::sqrt(v) + eps * correction2));
    if (wd > 0.0f) x = x * (1.0f - float(lr) * wd);
    w[i] = T(x);
  };
  if (!l.quantized) {
    for (int64_t i = 0; i < l.size; ++i)
      update(i, s1_[size_t(l.start + i)], s2_[size_t(l.start + i)]);
    return;
  }
  for (int64_t b0 = 0, b = l.block_start; b0 < l.size; b0 += block_, ++b) {
    const int64_t n = std::min(block_, l.size - b0);
    uint8_t* c1 = q1_.data() + l.start + b0;
    uint8_t* c2 = q2_.data() + l.start + b0;
    float max1 = 0.0f, max2 = 0.0f;
    for (int64_t j = 0; j < n; ++j) {
      float& m = m_[size_t(j)];
      float& v = v_[size_t(j)];
      m = code1_[c1[j]] * absmax1_[size_t(b)];
      v = code2_[c2[j]] * absmax2_[size_t(b)];
      update(b0 + j, m, v);
      max1 = std::max(max1, std::fabs(m));
      max2 = std::max(max2, std::fabs(v));
    }
    absmax1_[size_t(b)] = max1;
    absmax2_[size_t(b)] = max2;
    for (int64_t j = 0; j < n; ++j) {
      c1[j] = quantize_signed(m_[size_t(j)], max1);
      c2[j] = nearest_code(code2_, max2 > 0.0f ? v_[size_t(j)] / max2 : 0.0f);
    }
  }
}

template <typename T>
void Adam8bitMoments::save(size_t s, const std::array<T*, 4>& out) const {
  const Segment& l = segments_[s];
  for (int64_t i = 0; i < l.size; ++i) {
    out[0][i] = l.quantized ? T(q1_[size_t(l.start + i)]) : T(s1_[size_t(l.start + i)]);
    out[1][i] = l.quantized ? T(q2_[size_t(l.start + i)]) : T(s2_[size_t(l.start + i)]);
  }
  if (!l.quantized) return;
  for (int64_t b0 = 0, b = l.block_start; b0 < l.size; b0 += block_, ++b) {
    out[2][b0] = T(absmax1_[size_t(b)]);
    out[3][b0] = T(absmax2_[size_t(b)]);
  }
}

template <typename T>
void Adam8bitMoments::load(size_t s, const std::array<const T*, 4>& in, const std::string& what) {
  const Segment& l = segments_[s];
  for (int64_t i = 0; i < l.size; ++i) {
    const T x1 = in[0][i], x2 = in[1][i];
    if (!l.quantized) {
      s1_[size_t(l.start + i)] = float(x1);
      s2_[size_t(l.start + i)] = float(x2);
      continue;
    }
    OMNI_REQUIRE(x1 >= 0 && x1 <= 255 && x2 >= 0 && x2 <= 255 && x1 == std::floor(x1) &&
                     x2 == std::floor(x2),
                 "[adam8bit] the state of ", what, " holds ", x1, " and ", x2,
                 " where code indices 0..255 belong (a checkpoint of another optimizer?)");
    q1_[size_t(l.start + i)] = uint8_t(x1);
    q2_[size_t(l.start + i)] = uint8_t(x2);
  }
  if (!l.quantized) return;
  for (int64_t b0 = 0, b = l.block_start; b0 < l.size; b0 += block_, ++b) {
    absmax1_[size_t(b)] = float(in[2][b0]);
    absmax2_[size_t(b)] = float(in[3][b0]);
  }
}

template void Adam8bitMoments::step(size_t, float*, const float*, double, double, int64_t);
template void Adam8bitMoments::step(size_t, double*, const double*, double, double, int64_t);
template void Adam8bitMoments::save(size_t, const std::array<float*, 4>&) const;
template void Adam8bitMoments::save(size_t, const std::array<double*, 4>&) const;
template void Adam8bitMoments::load(size_t, const std::array<const float*, 4>&, const std::string&);
template void Adam8bitMoments::load(size_t, const std::array<const double*, 4>&,
                                    const std::string&);

namespace {

template <typename T>
class Adam8bit : public ZooOptimizer<T> {
 public:
  Adam8bit(const OptimizerConfig& config, const ParameterSet<T>& params)
      : cfg_(config),
        moments_(config, sizes(params)),
        infos_(params.infos()),
        size_(params.size()) {}

  void step(ParameterSet<T>& params, double lr, int64_t step) override {
    if (!views_.empty()) import_views(params);
    for (size_t pi = 0; pi < infos_.size(); ++pi) {
      const ParamInfo& p = infos_[pi];
      moments_.step(pi, params.values() + p.offset, params.grads() + p.offset, lr,
                    p.weight_decay ? cfg_.weight_decay : 0.0, step);
    }
  }

  std::vector<std::string> state_names() const override {
    return {"state1", "state2", "absmax1", "absmax2"};
  }
  T* state_buffer(const std::string& name) override {
    if (views_.empty()) {
      views_.assign(4, std::vector<T>(size_t(size_), T(0)));
      for (size_t pi = 0; pi < infos_.size(); ++pi) {
        const int64_t o = infos_[pi].offset;
        moments_.save<T>(pi, {views_[0].data() + o, views_[1].data() + o, views_[2].data() + o,
                              views_[3].data() + o});
      }
    }
    const auto names = state_names();
    for (size_t i = 0; i < names.size(); ++i)
      if (names[i] == name) return views_[i].data();
    throw InternalError("[adam8bit] no state buffer '" + name + "'");
  }

 private:
  static std::vector<int64_t> sizes(const ParameterSet<T>& params) {
    std::vector<int64_t> out;
    for (const ParamInfo& p : params.infos()) out.push_back(p.numel);
    return out;
  }

  void import_views(const ParameterSet<T>& params) {
    OMNI_REQUIRE(params.size() == size_, "[adam8bit] the parameters changed size");
    for (size_t pi = 0; pi < infos_.size(); ++pi) {
      const int64_t o = infos_[pi].offset;
      moments_.load<T>(
          pi,
          {views_[0].data() + o, views_[1].data() + o, views_[2].data() + o, views_[3].data() + o},
          infos_[pi].name);
    }
    views_.clear();
  }

  OptimizerConfig cfg_;
  Adam8bitMoments moments_;
  std::vector<ParamInfo> infos_;
  int64_t size_ = 0;
  std::vector<std::vector<T>> views_;  // the checkpoint's state1, state2, absmax1, absmax2
};

}  // namespace

template <typename T>
std::shared_ptr<ZooOptimizer<T>> make_adam8bit(const OptimizerConfig& config,
                                               const ParameterSet<T>& params) {
  return std::make_shared<Adam8bit<T>>(config, params);
}

template std::shared_ptr<ZooOptimizer<float>> make_adam8bit(const OptimizerConfig&,
                                                            const ParameterSet<float>&);
template std::shared_ptr<ZooOptimizer<double>> make_adam8bit(const OptimizerConfig&,
                                                             const ParameterSet<double>&);

}  // namespace omni
