// Shared by the GPU op tests: each test runs a GPU op and the CPU op (backend/cpu, the
// reference) on the same random inputs and compares with a tolerance per dtype. The same
// sources build twice: against the emulated GPU (runs everywhere, CI included) and against
// the real device (skips, saying why, where there is none).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "backend/gpu/gpu_ops.h"
#include "base/dtype.h"

namespace omni::gpu_test {

using gpu::bf16;
using gpu::f16;

#define OMNI_REQUIRE_GPU()                                                               \
  do {                                                                                   \
    if (::omni::gpu::device_count() == 0)                                                \
      GTEST_SKIP() << "no GPU device visible (check nvidia-smi / rocm-smi and "          \
                      "CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES); the emulated build " \
                      "of this test runs the same kernels on the CPU";                   \
  } while (0)

inline std::vector<float> random_vector(size_t n, uint32_t seed, float lo = -1.0f,
                                        float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// Element conversions between float and a storage type, on the host: base/dtype.h's, the
// functions the kernels call.
template <typename T>
T to_storage(float x) {
  return from_float<T>(x);
}
template <typename T>
float from_storage(T x) {
  return to_float(x);
}
// x rounded to T and back: the value the GPU op sees, so the CPU reference gets it too.
template <typename T>
std::vector<float> rounded(std::vector<float> x) {
  for (auto& v : x) v = from_storage(to_storage<T>(v));
  return x;
}

// A device array of T made from host floats (rounded to T), read back as floats.
template <typename T>
class Device {
 public:
  explicit Device(const std::vector<float>& host) : a_(host.size()) {
    std::vector<T> s(host.size());
    for (size_t i = 0; i < s.size(); ++i) s[i] = to_storage<T>(host[i]);
    gpu::copy_to_device(a_.data(), s.data(), s.size() * sizeof(T));
  }
  explicit Device(size_t n) : a_(n) { gpu::fill_zero(a_.data(), n * sizeof(T)); }
  T* get() const { return a_.data(); }
  std::vector<float> host() const {
    gpu::synchronize();
    std::vector<T> s(a_.size());
    gpu::copy_to_host(s.data(), a_.data(), s.size() * sizeof(T));
    std::vector<float> out(s.size());
    for (size_t i = 0; i < s.size(); ++i) out[i] = from_storage(s[i]);
    return out;
  }

 private:
  gpu::DeviceArray<T> a_;
};

// Integers (tokens, positions) on the device.
inline gpu::DeviceArray<int32_t> to_device(const std::vector<int32_t>& v) {
  gpu::DeviceArray<int32_t> a(v.size());
  gpu::copy_to_device(a.data(), v.data(), v.size() * sizeof(int32_t));
  return a;
}

// Tolerance on |gpu - cpu| <= atol + rtol * |cpu| per storage type: float kernels differ from
// the CPU only in summation order; bf16/f16 outputs are rounded once more (2^-8 / 2^-11).
template <typename T>
constexpr double default_rtol() {
  if constexpr (std::is_same_v<T, float>) return 1e-5;
  if constexpr (std::is_same_v<T, bf16>) return 1.6e-2;
  return 2e-3;
}

inline ::testing::AssertionResult close(const std::vector<float>& got,
                                        const std::vector<float>& want, double rtol, double atol) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " against " << want.size();
  size_t bad = 0, first = 0;
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(double(got[i]) - want[i]);
    const double allowed = atol + rtol * std::abs(double(want[i]));
    const bool same_special =
        (std::isnan(got[i]) && std::isnan(want[i])) || (std::isinf(want[i]) && got[i] == want[i]);
    if (!same_special && !(err <= allowed)) {
      if (bad++ == 0) first = i;
      worst = std::max(worst, err / std::max(allowed, 1e-30));
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << got.size() << " elements differ; first at " << first << ": got "
         << got[first] << ", want " << want[first] << " (worst error " << worst
         << "x the tolerance)";
}

}  // namespace omni::gpu_test
