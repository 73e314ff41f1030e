// A knob of the GPU classifier_cross_entropy (gpu_ops.h), for tests: how many float logits one
// chunk of rows may hold (default 2^25, 128 MiB). Tests shrink it to run several chunks on
// shapes small enough for the emulator. Plain C++.
#pragma once

#include <cstddef>

#include "backend/gpu/gpu_types.h"

OMNI_GPU_NAMESPACE_BEGIN

size_t classifier_chunk_elements();
void set_classifier_chunk_elements(size_t elements);

OMNI_GPU_NAMESPACE_END
