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
// Blocks are those of each whole tensor (row-major, before tensor parallelism splits it), so
// a sharded or split run quantises exactly as one rank does: each rank updates its elements,
// and the blocks' new maxima are reduced (max) over the ranks holding parts of them.
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

Adam8bitCodes::Adam8bitCodes()
    : code1(dynamic_quantization_map(true)), code2(dynamic_quantization_map(false)) {}

uint8_t Adam8bitCodes::quantize_signed(float x, float absmax) const {
  if (absmax == 0.0f) return nearest_code(code1, 0.0f);
  uint8_t c = nearest_code(code1, x / absmax);
  if (std::signbit(code1[c]) != std::signbit(x)) c = uint8_t(x > 0.0f ? c + 1 : c - 1);
  return c;
}

uint8_t Adam8bitCodes::quantize_unsigned(float x, float absmax) const {
  return nearest_code(code2, absmax > 0.0f ? x / absmax : 0.0f);
}

Adam8bitUpdate::Adam8bitUpdate(const OptimizerConfig& config, double lr_, double wd_, int64_t step)
    : b1(float(config.adam_beta1)),
      b2(float(config.adam_beta2)),
      eps(float(config.adam_eps)),
      lr(float(lr_)),
      wd(float(wd_)),
      correction2(std::sqrt(1.0f - float(std::pow(double(b2), double(step))))),
      step_size(-float(lr_) * correction2 / (1.0f - float(std::pow(double(b1), double(step))))) {}

Adam8bitMoments::Adam8bitMoments(const OptimizerConfig& config, const std::vector<int64_t>& sizes)
    : cfg_(config), block_(config.zoo.adam8bit_block_size) {
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

template <typename T>
void Adam8bitMoments::step(size_t s, T* w, const T* g, double lr, double wd, int64_t step) {
  const Adam8bitUpdate update(cfg_, lr, wd, step);
  const Segment& l = segments_[s];
  if (!l.quantized) {
    for (int64_t i = 0; i < l.size; ++i)
      update(float(g[i]), s1_[size_t(l.start + i)], s2_[size_t(l.start + i)], w[i]);
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
      m = codes_.code1[c1[j]] * absmax1_[size_t(b)];
      v = codes_.code2[c2[j]] * absmax2_[size_t(b)];
      update(float(g[b0 + j]), m, v, w[b0 + j]);
      max1 = std::max(max1, std::fabs(m));
      max2 = std::max(max2, std::fabs(v));
    }
    absmax1_[size_t(b)] = max1;
    absmax2_[size_t(b)] = max2;
    for (int64_t j = 0; j < n; ++j) {
      c1[j] = codes_.quantize_signed(m_[size_t(j)], max1);
      c2[j] = codes_.quantize_unsigned(v_[size_t(j)], max2);
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
  Adam8bit(const OptimizerConfig& config, const ParameterSet<T>& params, const ZooLayout<T>& layout)
      : cfg_(config),
        block_(config.zoo.adam8bit_block_size),
        infos_(params.infos()),
        layout_(layout) {
    OMNI_REQUIRE(block_ > 0, "[adam8bit] the block size must be positive");
    // Blocks are the whole (unsplit) tensor's, so every layout quantises the same way.
    for (const ParamInfo& p : infos_) {
      Tensor8 t;
      t.quantized = global_numel(p) >= config.zoo.adam8bit_min_8bit_size;
      t.block_start = blocks_;
      if (t.quantized) blocks_ += (global_numel(p) + block_ - 1) / block_;
      ParameterSet<T>::for_each_run(p, [&](int64_t l, int64_t g, int64_t n) {
        t.runs.push_back({l, g, n});
      });
      tensors_.push_back(std::move(t));
    }
    absmax1_.assign(size_t(blocks_), 0.0f);
    absmax2_.assign(size_t(blocks_), 0.0f);
    for (const ZooPiece& piece : layout_.pieces) {
      const int64_t n = piece.end - piece.begin;
      if (tensors_[piece.param].quantized) {
        starts_.push_back(int64_t(q1_.size()));
        q1_.resize(q1_.size() + size_t(n), 0);
      } else {
        starts_.push_back(int64_t(s1_.size()));
        s1_.resize(s1_.size() + size_t(n), 0.0f);
      }
    }
    q2_.resize(q1_.size(), 0);
    m_.resize(q1_.size());
    v_.resize(q1_.size());
    s2_.resize(s1_.size(), 0.0f);
  }

  void step(ParameterSet<T>& params, double lr, int64_t step) override {
    if (!views_.empty()) import_views();
    std::vector<float> max1(size_t(blocks_), 0.0f), max2(size_t(blocks_), 0.0f);
    for (size_t k = 0; k < layout_.pieces.size(); ++k) {
      const ZooPiece& piece = layout_.pieces[k];
      const ParamInfo& p = infos_[piece.param];
      const Adam8bitUpdate update(cfg_, lr, p.weight_decay ? cfg_.weight_decay : 0.0, step);
      T* w = params.values() + piece.begin;
      const T* g = params.grads() + piece.begin;
      const size_t at = size_t(starts_[k]);
      if (!tensors_[piece.param].quantized) {
        for (int64_t i = 0; i < piece.end - piece.begin; ++i)
          update(float(g[i]), s1_[at + size_t(i)], s2_[at + size_t(i)], w[i]);
        continue;
      }
      // Dequantise against the blocks' maxima, update, and note the blocks' new maxima.
      for_each_element(piece, [&](int64_t i, int64_t b) {
        float& m = m_[at + size_t(i)];
        float& v = v_[at + size_t(i)];
        m = codes_.code1[q1_[at + size_t(i)]] * absmax1_[size_t(b)];
        v = codes_.code2[q2_[at + size_t(i)]] * absmax2_[size_t(b)];
        update(float(g[i]), m, v, w[i]);
        max1[size_t(b)] = std::max(max1[size_t(b)], std::fabs(m));
        max2[size_t(b)] = std::max(max2[size_t(b)], std::fabs(v));
      });
    }
    max_over_parts(max1);
    max_over_parts(max2);
    absmax1_ = std::move(max1);
    absmax2_ = std::move(max2);
    for (size_t k = 0; k < layout_.pieces.size(); ++k) {
      const ZooPiece& piece = layout_.pieces[k];
      if (!tensors_[piece.param].quantized) continue;
      const size_t at = size_t(starts_[k]);
      for_each_element(piece, [&](int64_t i, int64_t b) {
        q1_[at + size_t(i)] = codes_.quantize_signed(m_[at + size_t(i)], absmax1_[size_t(b)]);
        q2_[at + size_t(i)] = codes_.quantize_unsigned(v_[at + size_t(i)], absmax2_[size_t(b)]);
      });
    }
  }

  std::vector<std::string> state_names() const override {
    return {"state1", "state2", "absmax1", "absmax2"};
  }
  T* state_buffer(const std::string& name) override {
    if (views_.empty()) export_views();
    const auto names = state_names();
    for (size_t i = 0; i < names.size(); ++i)
      if (names[i] == name) return views_[i].data();
    throw InternalError("[adam8bit] no state buffer '" + name + "'");
  }

 private:
  struct Run {
    int64_t local, global, count;  // ParameterSet::for_each_run's
  };
  struct Tensor8 {
    bool quantized = false;
    int64_t block_start = 0;  // into absmax1_/absmax2_
    std::vector<Run> runs;    // where this rank's elements sit in the whole tensor
  };

  // f(i, block) for the elements i (from the piece's start) of a quantised piece, with the
  // index into absmax of the whole tensor's block each belongs to.
  template <typename F>
  void for_each_element(const ZooPiece& piece, F&& f) const {
    const ParamInfo& p = infos_[piece.param];
    const Tensor8& t = tensors_[piece.param];
    const int64_t begin = piece.begin - p.offset, end = piece.end - p.offset;
    for (const Run& r : t.runs) {
      const int64_t lo = std::max(begin, r.local), hi = std::min(end, r.local + r.count);
      for (int64_t l = lo; l < hi; ++l)
        f(l - begin, t.block_start + (r.global + (l - r.local)) / block_);
    }
  }

  // Block maxima over every rank that holds part of a block (its pieces over the
  // data-parallel group, its slices over the tensor-parallel group): exact, as max is.
  void max_over_parts(std::vector<float>& maxima) const {
    if (maxima.empty()) return;
    if (layout_.data_parallel && layout_.data_parallel->size() > 1)
      layout_.data_parallel->all_reduce(maxima.data(), maxima.size(), ReduceOp::Max);
    if (layout_.tensor_parallel && layout_.tensor_parallel->size() > 1)
      layout_.tensor_parallel->all_reduce(maxima.data(), maxima.size(), ReduceOp::Max);
  }

  // The checkpoint's view: state1 and state2 per element as the file's comment says; absmax1
  // and absmax2 at the element that starts each block of the whole tensor (on the rank that
  // holds it).
  void export_views() {
    views_.assign(4, std::vector<T>(size_t(layout_.state_size), T(0)));
    for (size_t k = 0; k < layout_.pieces.size(); ++k) {
      const ZooPiece& piece = layout_.pieces[k];
      const size_t at = size_t(starts_[k]), state = size_t(piece.state);
      if (!tensors_[piece.param].quantized) {
        for (int64_t i = 0; i < piece.end - piece.begin; ++i) {
          views_[0][state + size_t(i)] = T(s1_[at + size_t(i)]);
          views_[1][state + size_t(i)] = T(s2_[at + size_t(i)]);
        }
        continue;
      }
      const Tensor8& t = tensors_[piece.param];
      for_each_element(piece, [&](int64_t i, int64_t b) {
        views_[0][state + size_t(i)] = T(q1_[at + size_t(i)]);
        views_[1][state + size_t(i)] = T(q2_[at + size_t(i)]);
        if (block_first(piece, i, b, t)) {
          views_[2][state + size_t(i)] = T(absmax1_[size_t(b)]);
          views_[3][state + size_t(i)] = T(absmax2_[size_t(b)]);
        }
      });
    }
  }

  // Whether element i of the piece is the first of block b of its whole tensor.
  bool block_first(const ZooPiece& piece, int64_t i, int64_t b, const Tensor8& t) const {
    const int64_t local = piece.begin - infos_[piece.param].offset + i;
    for (const Run& r : t.runs)
      if (local >= r.local && local < r.local + r.count)
        return r.global + (local - r.local) == (b - t.block_start) * block_;
    return false;
  }

  void import_views() {
    std::fill(absmax1_.begin(), absmax1_.end(), 0.0f);
    std::fill(absmax2_.begin(), absmax2_.end(), 0.0f);
    for (size_t k = 0; k < layout_.pieces.size(); ++k) {
      const ZooPiece& piece = layout_.pieces[k];
      const ParamInfo& p = infos_[piece.param];
      const size_t at = size_t(starts_[k]), state = size_t(piece.state);
      const T* s1 = views_[0].data() + state;
      const T* s2 = views_[1].data() + state;
      if (!tensors_[piece.param].quantized) {
        for (int64_t i = 0; i < piece.end - piece.begin; ++i) {
          s1_[at + size_t(i)] = float(s1[i]);
          s2_[at + size_t(i)] = float(s2[i]);
        }
        continue;
      }
      const Tensor8& t = tensors_[piece.param];
      for_each_element(piece, [&](int64_t i, int64_t b) {
        OMNI_REQUIRE(s1[i] >= 0 && s1[i] <= 255 && s2[i] >= 0 && s2[i] <= 255 &&
                         s1[i] == std::floor(s1[i]) && s2[i] == std::floor(s2[i]),
                     "[adam8bit] the state of ", p.name, " holds ", s1[i], " and ", s2[i],
                     " where code indices 0..255 belong (a checkpoint of another optimizer?)");
        q1_[at + size_t(i)] = uint8_t(s1[i]);
        q2_[at + size_t(i)] = uint8_t(s2[i]);
        if (block_first(piece, i, b, t)) {
          absmax1_[size_t(b)] = float(views_[2][state + size_t(i)]);
          absmax2_[size_t(b)] = float(views_[3][state + size_t(i)]);
        }
      });
    }
    max_over_parts(absmax1_);  // the blocks whose first element another rank holds
    max_over_parts(absmax2_);
    views_.clear();
  }

  OptimizerConfig cfg_;
  Adam8bitCodes codes_;
  int64_t block_ = 256, blocks_ = 0;
  std::vector<ParamInfo> infos_;
  ZooLayout<T> layout_;
  std::vector<Tensor8> tensors_;
  std::vector<int64_t> starts_;  // per piece, into q1_/q2_ (quantised tensors) or s1_/s2_
  std::vector<uint8_t> q1_, q2_;
  std::vector<float> m_, v_;  // the quantised pieces' moments during a step
  std::vector<float> absmax1_, absmax2_, s1_, s2_;
  std::vector<std::vector<T>> views_;  // the checkpoint's state1, state2, absmax1, absmax2
};

}  // namespace

template <typename T>
std::shared_ptr<ZooOptimizer<T>> make_adam8bit(const OptimizerConfig& config,
                                               const ParameterSet<T>& params,
                                               const ZooLayout<T>& layout) {
  return std::make_shared<Adam8bit<T>>(config, params, layout);
}

template std::shared_ptr<ZooOptimizer<float>> make_adam8bit(const OptimizerConfig&,
                                                            const ParameterSet<float>&,
                                                            const ZooLayout<float>&);
template std::shared_ptr<ZooOptimizer<double>> make_adam8bit(const OptimizerConfig&,
                                                             const ParameterSet<double>&,
                                                             const ZooLayout<double>&);

}  // namespace omni
