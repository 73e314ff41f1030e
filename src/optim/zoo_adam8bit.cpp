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
// and the blocks' new maxima are reduced (max) over the ranks holding parts of them. A stacked
// expert tensor's experts are tensors of their own (optimizer_zoo.h's zoo_tensors), as
// bitsandbytes sees DeepSpeed-MoE's one tensor per expert: the blocks restart at each expert's
// first element, and min_8bit_size is compared with one expert's elements.
//
// The per-element arithmetic is backend/zoo_adam8bit_math.h's, which the CPU's loop and the
// GPU's kernel (backend/gpu/zoo_adam8bit.cu) both run, in two passes so that no fp32 copy of
// the moments is kept (2 bytes per element for the 8-bit moments): pass 0 computes each
// element's new moments only for its block's new maxima; after they are reduced over ranks,
// pass 1 computes the same moments again, steps the weight and quantises them.
// GaLore's 8-bit variant steps its projected gradients with the same passes (Adam8bitMoments).
//
// Checkpoint state, laid out like the parameters (so resume is bit-exact): state1 and state2
// hold each element's code index (0..255) for 8-bit tensors and the fp32 moment otherwise;
// absmax1 and absmax2 hold block b's absolute maximum at the block's first element (zeros
// elsewhere). They are filled when asked for and read back at the next step.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "backend/ops.h"
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

Adam8bitCodes::Adam8bitCodes()
    : code1(dynamic_quantization_map(true)), code2(dynamic_quantization_map(false)) {}

uint8_t Adam8bitCodes::quantize_signed(float x, float absmax) const {
  return adam8bit::quantize_signed(code1.data(), x, absmax);
}

uint8_t Adam8bitCodes::quantize_unsigned(float x, float absmax) const {
  return adam8bit::quantize_unsigned(code2.data(), x, absmax);
}

Adam8bitUpdate::Adam8bitUpdate(const OptimizerConfig& config, double lr_, double wd_,
                               int64_t step) {
  b1 = float(config.adam_beta1), b2 = float(config.adam_beta2), eps = float(config.adam_eps);
  lr = float(lr_), wd = float(wd_);
  correction2 = std::sqrt(1.0f - float(std::pow(double(b2), double(step))));
  step_size = -float(lr_) * correction2 / (1.0f - float(std::pow(double(b1), double(step))));
}

namespace {

// adam8bit's two passes on the CPU over s.runs (backend/zoo_adam8bit_math.h's step_element,
// which the GPU's kernel runs too): the blocks' new maxima into s.max1/s.max2 (zeros at the
// start), then `reduce` (over the ranks holding other parts of a block), then the weights'
// step and the moments quantised against those maxima. The moments are recomputed in the
// second pass rather than kept in fp32.
template <typename T, typename Reduce>
void step_on_cpu(adam8bit::Step& s, T* w, const T* g, Reduce&& reduce) {
  auto raise = [&](int64_t b, float am, float av) {
    s.max1[b] = std::max(s.max1[b], am);
    s.max2[b] = std::max(s.max2[b], av);
  };
  for (s.pass = 0; s.pass < 2; ++s.pass) {
    if (s.pass == 1) reduce();
    for (int64_t k = 0; k < s.run_count; ++k)
      for (int64_t i = 0; i < s.runs[k].count; ++i)
        adam8bit::step_element(s, w, g, s.runs[k], i, raise);
  }
}

}  // namespace

Adam8bitMoments::Adam8bitMoments(const OptimizerConfig& config, const std::vector<int64_t>& sizes,
                                 const ops::Exec& exec, Device device)
    : cfg_(config), block_(config.zoo.adam8bit_block_size), exec_(exec) {
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
  if (!exec_.on_gpu()) return;
  auto floats = [&](size_t n) {
    return Tensor::zeros({std::max<int64_t>(int64_t(n), 1)}, DType::F32, device, exec_.memory());
  };
  codes_gpu_ = floats((2 * q1_.size() + 3) / 4);
  fp32_gpu_ = floats(2 * s1_.size());
  maxima_gpu_ = floats(4 * absmax1_.size());
  std::vector<adam8bit::Run> runs;
  for (const Segment& l : segments_)
    runs.push_back({0, 0, l.start, 0, l.block_start, l.size, l.quantized ? 1 : 0, 1});
  tables_gpu_ = floats(512 + runs.size() * sizeof(adam8bit::Run) / sizeof(float));
  float* tables = tables_gpu_.data<float>();
  ops::upload(exec_, tables, codes_.code1.data(), 256);
  ops::upload(exec_, tables + 256, codes_.code2.data(), 256);
  ops::upload(exec_, reinterpret_cast<adam8bit::Run*>(tables + 512), runs.data(), runs.size());
}

// The GPU's states to the host copy, and back.
void Adam8bitMoments::download() {
  if (!exec_.on_gpu()) return;
  const uint8_t* codes = reinterpret_cast<const uint8_t*>(codes_gpu_.data<float>());
  const float* fp32 = fp32_gpu_.data<float>();
  const float* maxima = maxima_gpu_.data<float>();
  ops::download(exec_, q1_.data(), codes, q1_.size());
  ops::download(exec_, q2_.data(), codes + q1_.size(), q2_.size());
  ops::download(exec_, s1_.data(), fp32, s1_.size());
  ops::download(exec_, s2_.data(), fp32 + s1_.size(), s2_.size());
  ops::download(exec_, absmax1_.data(), maxima, absmax1_.size());
  ops::download(exec_, absmax2_.data(), maxima + absmax1_.size(), absmax2_.size());
}

void Adam8bitMoments::upload() {
  if (!exec_.on_gpu()) return;
  uint8_t* codes = reinterpret_cast<uint8_t*>(codes_gpu_.data<float>());
  float* fp32 = fp32_gpu_.data<float>();
  float* maxima = maxima_gpu_.data<float>();
  ops::upload(exec_, codes, q1_.data(), q1_.size());
  ops::upload(exec_, codes + q1_.size(), q2_.data(), q2_.size());
  ops::upload(exec_, fp32, s1_.data(), s1_.size());
  ops::upload(exec_, fp32 + s1_.size(), s2_.data(), s2_.size());
  ops::upload(exec_, maxima, absmax1_.data(), absmax1_.size());
  ops::upload(exec_, maxima + absmax1_.size(), absmax2_.data(), absmax2_.size());
}

template <typename T>
void Adam8bitMoments::step(size_t s, T* w, const T* g, double lr, double wd, int64_t step) {
  const Segment& l = segments_[s];
  const int64_t blocks = l.quantized ? (l.size + block_ - 1) / block_ : 0;
  if (exec_.on_gpu()) {
    if constexpr (std::is_same_v<T, float>) {
      // The GPU's two passes (backend/gpu/zoo_adam8bit.cu) on the segment's run; its blocks'
      // new maxima in the second pair, then copied over the first.
      const size_t total = absmax1_.size();
      float* maxima = maxima_gpu_.data<float>();
      uint8_t* codes = reinterpret_cast<uint8_t*>(codes_gpu_.data<float>());
      float* fp32 = fp32_gpu_.data<float>();
      const float* tables = tables_gpu_.data<float>();
      adam8bit::Step st;
      st.with_decay = Adam8bitUpdate(cfg_, lr, wd, step);
      st.block = block_, st.run_count = 1, st.n = l.size;
      st.runs = reinterpret_cast<const adam8bit::Run*>(tables + 512) + s;
      st.code1 = tables, st.code2 = tables + 256;
      st.w = w, st.g = g;
      st.q1 = codes, st.q2 = codes + q1_.size(), st.s1 = fp32, st.s2 = fp32 + s1_.size();
      st.absmax1 = maxima, st.absmax2 = maxima + total;
      st.max1 = maxima + 2 * total, st.max2 = maxima + 3 * total;
      const size_t b0 = size_t(l.block_start), nb = size_t(blocks);
      ops::zero(exec_, st.max1 + b0, nb);
      ops::zero(exec_, st.max2 + b0, nb);
      for (st.pass = 0; st.pass < 2; ++st.pass) exec_.gpu->adam8bit_update(st);
      ops::copy(exec_, maxima + b0, st.max1 + b0, nb);
      ops::copy(exec_, maxima + total + b0, st.max2 + b0, nb);
    } else {
      ops::detail::gpu_has_no_double("galoreadamw8bit");
    }
    return;
  }
  const adam8bit::Run run{0, 0, l.start, 0, 0, l.size, l.quantized ? 1 : 0, 1};
  std::vector<float> max1(size_t(blocks), 0.0f), max2(size_t(blocks), 0.0f);
  adam8bit::Step st;
  st.with_decay = Adam8bitUpdate(cfg_, lr, wd, step);
  st.block = block_, st.runs = &run, st.run_count = 1, st.n = l.size;
  st.q1 = q1_.data(), st.q2 = q2_.data(), st.s1 = s1_.data(), st.s2 = s2_.data();
  st.absmax1 = absmax1_.data() + l.block_start, st.absmax2 = absmax2_.data() + l.block_start;
  st.max1 = max1.data(), st.max2 = max2.data();
  st.code1 = codes_.code1.data(), st.code2 = codes_.code2.data();
  step_on_cpu(st, w, g, [] {});
  std::copy(max1.begin(), max1.end(), absmax1_.begin() + l.block_start);
  std::copy(max2.begin(), max2.end(), absmax2_.begin() + l.block_start);
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
    // Blocks are the whole (unsplit) tensor's, each expert's apart, so every layout quantises
    // the same way: the runs are cut where an expert ends, each with its expert's block 0.
    for (const ParamInfo& p : infos_) {
      Tensor8 t;
      const int64_t size = zoo_tensor_numel(p), blocks = (size + block_ - 1) / block_;
      t.quantized = size >= config.zoo.adam8bit_min_8bit_size;
      ParameterSet<T>::for_each_run(p, [&](int64_t l, int64_t g, int64_t n) {
        for (const int64_t end = g + n; g < end;) {
          const int64_t e = g / size, k = std::min(end, (e + 1) * size) - g;
          t.runs.push_back({l, g - e * size, k, blocks_ + e * blocks});
          l += k, g += k;
        }
      });
      if (t.quantized) blocks_ += zoo_tensor_count(p) * blocks;
      tensors_.push_back(std::move(t));
    }
    for (size_t k = 0; k < layout_.pieces.size(); ++k) {
      const ZooPiece& piece = layout_.pieces[k];
      const bool quantized = tensors_[piece.param].quantized;
      int64_t& size = quantized ? codes_size_ : fp32_size_;
      starts_.push_back(size);
      add_runs(piece, size);
      size += piece.end - piece.begin;
    }
    if (!layout_.exec.on_gpu()) {
      allocate_host();
      return;
    }
    OMNI_REQUIRE((std::is_same_v<T, float>), "[adam8bit] the GPU steps float parameters");
    const Device device = params.values_tensor().device();
    auto floats = [&](int64_t n) {
      return Tensor::zeros({std::max<int64_t>(n, 1)}, DType::F32, device, layout_.exec.memory());
    };
    gpu_codes_ = floats((2 * codes_size_ + 3) / 4);  // q1 then q2, one byte each
    gpu_fp32_ = floats(2 * fp32_size_);
    gpu_maxima_ = floats(4 * blocks_);  // absmax1, absmax2, then the next step's two
    gpu_tables_ = floats(512 + int64_t(runs_.size() * sizeof(adam8bit::Run) / sizeof(float)));
    float* tables = gpu_tables_.template data<float>();
    ops::upload(layout_.exec, tables, codes_.code1.data(), 256);
    ops::upload(layout_.exec, tables + 256, codes_.code2.data(), 256);
    ops::upload(layout_.exec, reinterpret_cast<adam8bit::Run*>(tables + 512), runs_.data(),
                runs_.size());
  }

  void step(ParameterSet<T>& params, double lr, int64_t step) override {
    if (!views_.empty()) import_views();
    adam8bit::Step s;
    s.with_decay = Adam8bitUpdate(cfg_, lr, cfg_.weight_decay, step);
    s.without_decay = Adam8bitUpdate(cfg_, lr, 0.0, step);
    s.block = block_;
    s.run_count = int64_t(runs_.size());
    s.n = runs_.empty() ? 0 : runs_.back().first + runs_.back().count;
    if (layout_.exec.on_gpu()) return gpu_step(s, params);
    // Two passes, so that no fp32 copy of the moments is kept: the blocks' new maxima, then
    // the same moments again, the weights' step and the moments quantised against them.
    std::vector<float> max1(size_t(blocks_), 0.0f), max2(size_t(blocks_), 0.0f);
    s.runs = runs_.data(), s.code1 = codes_.code1.data(), s.code2 = codes_.code2.data();
    s.q1 = q1_.data(), s.q2 = q2_.data(), s.s1 = s1_.data(), s.s2 = s2_.data();
    s.absmax1 = absmax1_.data(), s.absmax2 = absmax2_.data();
    s.max1 = max1.data(), s.max2 = max2.data();
    step_on_cpu(s, params.values(), params.grads(), [&] {
      layout_.max_over_parts(max1);
      layout_.max_over_parts(max2);
    });
    absmax1_ = std::move(max1);
    absmax2_ = std::move(max2);
  }

  std::vector<std::string> state_names() const override {
    return {"state1", "state2", "absmax1", "absmax2"};
  }
  T* state_buffer(const std::string& name) override {
    if (views_.empty()) export_views();
    const auto names = state_names();
    for (size_t i = 0; i < names.size(); ++i)
      if (names[i] == name) return view(i);
    throw InternalError("[adam8bit] no state buffer '" + name + "'");
  }

 private:
  // ParameterSet::for_each_run's runs cut at the experts' boundaries: `global` counts from
  // the first element of its expert (of the tensor where it stacks none), whose block 0 is
  // block_start (into absmax1_/absmax2_).
  struct Run {
    int64_t local, global, count, block_start;
  };
  struct Tensor8 {
    bool quantized = false;
    std::vector<Run> runs;  // where this rank's elements sit in the whole tensor
  };

  // The step's runs of the piece whose states start at `state`: the piece whole (fp32
  // moments), or where it meets each run of its whole tensor (8-bit moments).
  void add_runs(const ZooPiece& piece, int64_t state) {
    const ParamInfo& p = infos_[piece.param];
    const Tensor8& t = tensors_[piece.param];
    const int32_t decay = p.weight_decay && cfg_.weight_decay != 0.0 ? 1 : 0;
    const int64_t first = runs_.empty() ? 0 : runs_.back().first + runs_.back().count;
    if (!t.quantized) {
      if (piece.end > piece.begin)
        runs_.push_back({first, piece.begin, state, 0, 0, piece.end - piece.begin, 0, decay});
      return;
    }
    const int64_t begin = piece.begin - p.offset, end = piece.end - p.offset;
    for (const Run& r : t.runs) {
      const int64_t lo = std::max(begin, r.local), hi = std::min(end, r.local + r.count);
      if (lo >= hi) continue;
      const int64_t at = runs_.empty() ? 0 : runs_.back().first + runs_.back().count;
      runs_.push_back({at, p.offset + lo, state + (lo - begin), r.global + (lo - r.local),
                       r.block_start, hi - lo, 1, decay});
    }
  }

  void allocate_host() {
    q1_.assign(size_t(codes_size_), 0);
    q2_.assign(size_t(codes_size_), 0);
    s1_.assign(size_t(fp32_size_), 0.0f);
    s2_.assign(size_t(fp32_size_), 0.0f);
    absmax1_.assign(size_t(blocks_), 0.0f);
    absmax2_.assign(size_t(blocks_), 0.0f);
  }

  // The GPU's step (backend/gpu/zoo_adam8bit.cu): the same two passes; the blocks' maxima
  // are reduced over the ranks on the host between them.
  void gpu_step(adam8bit::Step& s, ParameterSet<T>& params) {
    if constexpr (!std::is_same_v<T, float>) {
      ops::detail::gpu_has_no_double("adam8bit");
    } else {
      const ops::Exec& x = layout_.exec;
      float* maxima = gpu_maxima_.template data<float>();
      const size_t blocks = size_t(blocks_);
      float* old_max = maxima + (flip_ ? 2 * blocks : 0);
      float* new_max = maxima + (flip_ ? 0 : 2 * blocks);
      uint8_t* codes = reinterpret_cast<uint8_t*>(gpu_codes_.template data<float>());
      float* fp32 = gpu_fp32_.template data<float>();
      const float* tables = gpu_tables_.template data<float>();
      s.runs = reinterpret_cast<const adam8bit::Run*>(tables + 512);
      s.code1 = tables, s.code2 = tables + 256;
      s.w = params.values(), s.g = params.grads();
      s.q1 = codes, s.q2 = codes + codes_size_;
      s.s1 = fp32, s.s2 = fp32 + fp32_size_;
      s.absmax1 = old_max, s.absmax2 = old_max + blocks;
      s.max1 = new_max, s.max2 = new_max + blocks;
      ops::zero(x, new_max, 2 * blocks);
      s.pass = 0;
      x.gpu->adam8bit_update(s);
      if (layout_.parts_elsewhere() && blocks > 0) {
        std::vector<float> host(2 * blocks);
        ops::download(x, host.data(), new_max, host.size());
        layout_.max_over_parts(host);
        ops::upload(x, new_max, host.data(), host.size());
      }
      s.pass = 1;
      x.gpu->adam8bit_update(s);
      flip_ = !flip_;
    }
  }

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
        f(l - begin, r.block_start + (r.global + (l - r.local)) / block_);
    }
  }

  // The GPU's states into the host arrays that export_views and import_views read and write
  // (only while a checkpoint is saved or loaded), and back.
  void download_states() {
    const ops::Exec& x = layout_.exec;
    allocate_host();
    const uint8_t* codes = reinterpret_cast<const uint8_t*>(gpu_codes_.template data<float>());
    const float* fp32 = gpu_fp32_.template data<float>();
    const float* maxima = gpu_maxima_.template data<float>() + (flip_ ? 2 * blocks_ : 0);
    ops::download(x, q1_.data(), codes, q1_.size());
    ops::download(x, q2_.data(), codes + codes_size_, q2_.size());
    ops::download(x, s1_.data(), fp32, s1_.size());
    ops::download(x, s2_.data(), fp32 + fp32_size_, s2_.size());
    ops::download(x, absmax1_.data(), maxima, absmax1_.size());
    ops::download(x, absmax2_.data(), maxima + blocks_, absmax2_.size());
  }
  void upload_states() {
    const ops::Exec& x = layout_.exec;
    uint8_t* codes = reinterpret_cast<uint8_t*>(gpu_codes_.template data<float>());
    float* fp32 = gpu_fp32_.template data<float>();
    float* maxima = gpu_maxima_.template data<float>() + (flip_ ? 2 * blocks_ : 0);
    ops::upload(x, codes, q1_.data(), q1_.size());
    ops::upload(x, codes + codes_size_, q2_.data(), q2_.size());
    ops::upload(x, fp32, s1_.data(), s1_.size());
    ops::upload(x, fp32 + fp32_size_, s2_.data(), s2_.size());
    ops::upload(x, maxima, absmax1_.data(), absmax1_.size());
    ops::upload(x, maxima + blocks_, absmax2_.data(), absmax2_.size());
    for (auto* v : {&q1_, &q2_}) std::vector<uint8_t>().swap(*v);
    for (auto* v : {&s1_, &s2_, &absmax1_, &absmax2_}) std::vector<float>().swap(*v);
  }

  T* view(size_t i) {
    return layout_.exec.on_gpu() ? gpu_views_[i].template data<T>() : views_[i].data();
  }

  // The checkpoint's view: state1 and state2 per element as the file's comment says; absmax1
  // and absmax2 at the element that starts each block of the whole tensor (on the rank that
  // holds it). On the GPU it is made on the host and uploaded.
  void export_views() {
    if (layout_.exec.on_gpu()) download_states();
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
    if (!layout_.exec.on_gpu()) return;
    gpu_views_.clear();
    for (const std::vector<T>& v : views_) {
      gpu_views_.push_back(Tensor::zeros({std::max<int64_t>(layout_.state_size, 1)}, dtype_of<T>(),
                                         gpu_codes_.device(), layout_.exec.memory()));
      ops::upload(layout_.exec, gpu_views_.back().template data<T>(), v.data(), v.size());
    }
    upload_states();  // (frees the host arrays)
  }

  // Whether element i of the piece is the first of block b of its whole tensor (expert).
  bool block_first(const ZooPiece& piece, int64_t i, int64_t b, const Tensor8& t) const {
    const int64_t local = piece.begin - infos_[piece.param].offset + i;
    for (const Run& r : t.runs)
      if (local >= r.local && local < r.local + r.count)
        return r.global + (local - r.local) == (b - r.block_start) * block_;
    return false;
  }

  void import_views() {
    const bool gpu = layout_.exec.on_gpu();
    if (gpu) {
      allocate_host();
      for (size_t i = 0; i < views_.size(); ++i)
        ops::download(layout_.exec, views_[i].data(), gpu_views_[i].template data<T>(),
                      views_[i].size());
    }
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
    layout_.max_over_parts(absmax1_);  // the blocks whose first element another rank holds
    layout_.max_over_parts(absmax2_);
    views_.clear();
    if (!gpu) return;
    gpu_views_.clear();
    upload_states();
  }

  OptimizerConfig cfg_;
  Adam8bitCodes codes_;
  int64_t block_ = 256, blocks_ = 0;
  std::vector<ParamInfo> infos_;
  ZooLayout<T> layout_;
  std::vector<Tensor8> tensors_;
  std::vector<int64_t> starts_;  // per piece, into the codes (quantised tensors) or fp32 moments
  int64_t codes_size_ = 0, fp32_size_ = 0;
  std::vector<adam8bit::Run> runs_;  // the step's, in the launch's element order
  // The states on the CPU (on the GPU only while a checkpoint is saved or loaded).
  std::vector<uint8_t> q1_, q2_;
  std::vector<float> absmax1_, absmax2_, s1_, s2_;
  std::vector<std::vector<T>> views_;  // the checkpoint's state1, state2, absmax1, absmax2
  // On the GPU: the codes, the fp32 moments, the blocks' maxima (two pairs, `flip_` says
  // which is the current one), the codes' values then the runs, and the checkpoint's views.
  Tensor gpu_codes_, gpu_fp32_, gpu_maxima_, gpu_tables_;
  std::vector<Tensor> gpu_views_;
  bool flip_ = false;
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
