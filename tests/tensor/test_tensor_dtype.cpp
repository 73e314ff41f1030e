// Tensors hold every DType, bf16 and f16 as the value types the GPU kernels use (base/dtype.h).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "base/dtype.h"
#include "base/error.h"
#include "tensor/tensor.h"

namespace omni {
namespace {

template <typename T>
class TensorElementType : public ::testing::Test {};
using ElementTypes = ::testing::Types<float, double, bf16, f16>;
TYPED_TEST_SUITE(TensorElementType, ElementTypes);

TYPED_TEST(TensorElementType, HoldsItsElementTypeAndConvertsThroughIt) {
  using T = TypeParam;
  const Tensor t = Tensor::zeros({3, 5}, dtype_of<T>());
  EXPECT_EQ(t.dtype(), dtype_of<T>());
  EXPECT_EQ(t.bytes(), 15 * sizeof(T));
  EXPECT_EQ(static_cast<void*>(t.data<T>()), t.raw());
  float in[15], out[5];
  for (int i = 0; i < 15; ++i) in[i] = static_cast<float>(i) * 0.25f - 1.0f;  // exact in all
  convert(in, DType::F32, t.raw(), t.dtype(), 15);
  // A view sees the same elements, through its own offset.
  const Tensor row = t.view(5, {5});
  EXPECT_EQ(static_cast<void*>(row.data<T>()), static_cast<void*>(t.data<T>() + 5));
  convert(row.raw(), row.dtype(), out, DType::F32, 5);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(out[i], in[i + 5]) << i;
}

TEST(TensorElementType, Bf16AndF16TensorsKeepTheRoundedBits) {
  const Tensor b = Tensor::zeros({2}, DType::BF16), h = Tensor::zeros({2}, DType::F16);
  b.data<bf16>()[0] = from_float<bf16>(1.0f + 0x1p-8f);  // a tie: to even, 1.0
  h.data<f16>()[0] = from_float<f16>(1.0f + 0x1p-11f);   // likewise
  b.data<bf16>()[1] = from_float<bf16>(3.0e38f);
  h.data<f16>()[1] = from_float<f16>(1e5f);  // beyond f16: infinity
  EXPECT_EQ(b.data<bf16>()[0].bits, 0x3f80);
  EXPECT_EQ(h.data<f16>()[0].bits, 0x3c00);
  EXPECT_EQ(b.data<bf16>()[1].bits, f32_to_bf16(3.0e38f));
  EXPECT_EQ(h.data<f16>()[1].bits, 0x7c00);
}

TEST(TensorElementType, AskingForAnotherElementTypeNamesBoth) {
  const Tensor t = Tensor::zeros({4}, DType::BF16);
  try {
    (void)t.data<f16>();
    FAIL() << "data<f16>() of a bf16 tensor returned";
  } catch (const InternalError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("f16 data of a bf16 tensor"), std::string::npos) << what;
  }
  EXPECT_THROW((void)t.data<float>(), InternalError);
}

}  // namespace
}  // namespace omni
