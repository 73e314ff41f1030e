#include "optim/mixed_precision.h"

#include <algorithm>
#include <bit>
#include <cmath>

#include "base/error.h"
#include "base/releasable_memory.h"

namespace omni {

namespace {

// An exponent field of all ones is inf or NaN; tested on the bits so that -ffast-math
// callers cannot fold it away.
constexpr bool finite_bits(float x) {
  return (std::bit_cast<uint32_t>(x) & 0x7f800000u) != 0x7f800000u;
}

// dst := src rounded (with kZero: zeros instead), and with kScaled scaled := the rounded
// values times scale, in one pass; whether any rounded value is inf or NaN. Written so that
// the loop vectorises: the flag or-ed without a branch (a short-circuit || kept it scalar) and
// the stores decided at compile time (a pointer tested in the loop, or one written by a
// lambda, kept it scalar too: 2-3x slower over 51M floats, and a --bf16 step runs two of
// these passes).
template <bool kScaled, bool kZero, typename Round>
bool round_all(const float* src, float* dst, int64_t n, Round round, float* scaled, float scale) {
  unsigned nonfinite = 0;
#pragma omp parallel for simd reduction(| : nonfinite) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float r = round(src[i]);
    dst[i] = kZero ? 0.0f : r;
    if constexpr (kScaled) scaled[i] = r * scale;
    nonfinite |= unsigned(!finite_bits(r));
  }
  return nonfinite != 0;
}

template <bool kScaled = false, bool kZero = false>
bool round_to(DType dtype, const float* src, float* dst, int64_t n, float* scaled = nullptr,
              float scale = 1.0f) {
  switch (dtype) {
    case DType::BF16:
      return round_all<kScaled, kZero>(
          src, dst, n, [](float x) { return bf16_to_f32(f32_to_bf16(x)); }, scaled, scale);
    case DType::F16:
      return round_all<kScaled, kZero>(
          src, dst, n, [](float x) { return f16_to_f32(f32_to_f16(x)); }, scaled, scale);
    case DType::F32:
      return round_all<kScaled, kZero>(
          src, dst, n, [](float x) { return x; }, scaled, scale);
    case DType::F64:
      break;
  }
  throw InternalError(
      detail::concat("[mixed precision] cannot store floats as ", dtype_name(dtype)));
}

}  // namespace

bool round_to_dtype(const float* src, float* dst, int64_t n, DType dtype) {
  return round_to(dtype, src, dst, n);
}

MixedPrecision::MixedPrecision(ParameterSet<float>& model, DType dtype, DType grad_dtype)
    : model_(&model), master_(model.infos()), dtype_(dtype), grad_dtype_(grad_dtype) {
  OMNI_CHECK(dtype == DType::BF16 || dtype == DType::F16, "[mixed precision] parameters in ",
             dtype_name(dtype), ", not bf16 or f16");
  OMNI_CHECK(grad_dtype == dtype || grad_dtype == DType::F32, "[mixed precision] gradients in ",
             dtype_name(grad_dtype), " with ", dtype_name(dtype), " parameters");
  OMNI_CHECK(master_.size() == model.size(), "[mixed precision] master layout differs");
  round_to_dtype(model.values(), model.values(), model.size(), dtype_);
  std::copy_n(model.values(), model.size(), master_.values());
  ranges_ = {{0, master_.size()}};
}

namespace {
template <typename F>
void with_storage(DType dtype, F&& f) {
  if (dtype == DType::BF16)
    f(bf16{});
  else
    f(f16{});
}
}  // namespace

MixedPrecision::MixedPrecision(const Stored& model, std::vector<ParamInfo> infos, Device device,
                               const DeviceMemory* master_memory)
    : stored_(model),
      master_(std::move(infos), device, master_memory ? master_memory : model.exec.memory()),
      dtype_(model.dtype),
      grad_dtype_(DType::F32) {
  with_storage(dtype_, [&](auto t) {
    using T = decltype(t);
    ops::to_float(stored_.exec, master_.values(), static_cast<const T*>(stored_.values),
                  size_t(master_.size()));
  });
  ranges_ = {{0, master_.size()}};
}

bool MixedPrecision::unscale_and_check(float loss_scale, bool* zeroed) {
  OMNI_CHECK(loss_scale > 0 && finite_bits(loss_scale), "[mixed precision] loss scale ",
             loss_scale);
  const auto inv_scale = static_cast<float>(1.0 / double(loss_scale));
  const bool zero = zeroed && model_ && ranges_.size() == 1 && ranges_[0].begin == 0 &&
                    ranges_[0].end == model_->size();
  if (zeroed) *zeroed = zero;
  bool found_inf = false;
  for (const ShardRange& r : ranges_) {
    float* master_g = master_.grads() + r.begin;
    const int64_t n = r.end - r.begin;
    if (!model_) {  // float gradients on the device: scaled into the master's, then checked
      ops::copy(stored_.exec, master_g, stored_.grads + r.begin, size_t(n));
      ops::scale(stored_.exec, master_g, double(inv_scale), size_t(n));
      found_inf = !std::isfinite(ops::sum_squares(stored_.exec, master_g, size_t(n))) || found_inf;
      continue;
    }
    float* g = model_->grads() + r.begin;
    // Rounded in place (or zeroed), and times 1/loss_scale into the master's, in one pass.
    found_inf = (zero ? round_to<true, true>(grad_dtype_, g, g, n, master_g, inv_scale)
                      : round_to<true>(grad_dtype_, g, g, n, master_g, inv_scale)) ||
                found_inf;
  }
  return found_inf;
}

void MixedPrecision::copy_master_to_model() {
  for (const ShardRange& r : ranges_) {
    const int64_t n = r.end - r.begin;
    if (model_) {
      round_to_dtype(master_.values() + r.begin, model_->values() + r.begin, n, dtype_);
      continue;
    }
    with_storage(dtype_, [&](auto t) {
      using T = decltype(t);
      ops::from_float(stored_.exec, static_cast<T*>(stored_.values) + r.begin,
                      master_.values() + r.begin, size_t(n));
    });
  }
}

void MixedPrecision::keep_only(std::vector<ShardRange> ranges) {
  if (ranges.empty()) ranges = {{0, master_.size()}};
  std::sort(ranges.begin(), ranges.end(),
            [](const ShardRange& a, const ShardRange& b) { return a.begin < b.begin; });
  for (size_t i = 0; i < ranges.size(); ++i)
    OMNI_CHECK(ranges[i].begin <= ranges[i].end && ranges[i].end <= master_.size() &&
                   (i == 0 || ranges[i - 1].end <= ranges[i].begin),
               "[mixed precision] kept range [", ranges[i].begin, ", ", ranges[i].end,
               ") overlaps another or leaves the master's ", master_.size());
  ranges_ = std::move(ranges);
  release_rest();
}

void MixedPrecision::release_rest() {
  if (ranges_.size() == 1 && ranges_[0].begin == 0 && ranges_[0].end == master_.size()) return;
  // A GPU's master: the whole granules outside the ranges unmapped (the partial ones at a
  // range's ends stay, as the range needs them).
  const auto* device = dynamic_cast<const ReleasableMemory*>(master_.memory());
  OMNI_CHECK(model_ || device,
             "[mixed precision] a GPU master copy outside releasable memory cannot be released");
  int64_t at = 0;
  auto release = [&](int64_t end) {
    if (end <= at) return;
    const size_t bytes = size_t(end - at) * sizeof(float);
    if (device) {
      device->release(master_.values() + at, bytes);
      device->release(master_.grads() + at, bytes);
      return;
    }
    discard_memory(master_.values() + at, bytes);
    discard_memory(master_.grads() + at, bytes);
  };
  for (const ShardRange& r : ranges_) release(r.begin), at = r.end;
  release(master_.size());
}

void MixedPrecision::commit(int64_t begin, int64_t end) {
  if (const auto* device = dynamic_cast<const ReleasableMemory*>(master_.memory()); device) {
    device->commit(master_.values() + begin, size_t(end - begin) * sizeof(float));
    device->commit(master_.grads() + begin, size_t(end - begin) * sizeof(float));
  }
}

}  // namespace omni
