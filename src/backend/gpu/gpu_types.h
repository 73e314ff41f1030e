// Types shared by the GPU kernels and the host code that calls them (backend/gpu/gpu_ops.h):
// plain C++, no GPU headers.
#pragma once

#include <cstdint>

#include "base/dtype.h"

// The emulated build (OMNITRON_GPU_EMULATE: kernels run on the CPU, for tests) and the device
// build may be linked into one program: their symbols live in different inline namespaces,
// while code written against omni::gpu:: reads the same for both.
#if defined(OMNITRON_GPU_EMULATE)
#define OMNI_GPU_NAMESPACE_BEGIN \
  namespace omni::gpu {          \
  inline namespace emulated {
#else
#define OMNI_GPU_NAMESPACE_BEGIN \
  namespace omni::gpu {          \
  inline namespace device {
#endif
#define OMNI_GPU_NAMESPACE_END \
  }                            \
  }

OMNI_GPU_NAMESPACE_BEGIN

// The element types are base/dtype.h's, shared with the host code: bf16 and f16 (bit
// patterns), converted to and from float by to_float and from_float<T> in kernels.
using ::omni::bf16;
using ::omni::f16;

OMNI_GPU_NAMESPACE_END
