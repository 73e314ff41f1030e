// Releasable memory: buffers that hand ranges of their memory back and take it again while
// they keep their addresses, so every view into them stays valid (ZeRO 2 and 3,
// parallel/zero_sharding.h).
//
// Host memory (the CPU's tensors): released pages go back to the operating system (madvise,
// MADV_DONTNEED), read as zeros and are backed again by the next write, so commit() is not
// needed. A GPU's memory cannot be madvised: its flat buffers are allocated from
// releasable_memory(device), whose release() unmaps whole granules and whose commit() maps
// them again before they are touched (CUDA's and HIP's virtual memory management; on the
// emulated GPU host pages made inaccessible, so a touch of released memory faults there too).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "base/device_memory.h"

namespace omni {

class ReleasableMemory : public DeviceMemory {
 public:
  // The unit of release and commit, in bytes (a power of two; granules are aligned to it).
  virtual size_t granularity() const = 0;
  // Hands back the whole granules inside [p, p + bytes) of a buffer allocated here; the
  // partial ones at the ends stay as they are. A released granule must be neither read nor
  // written until commit(). Waits for the device's ops in flight first.
  virtual void release(void* p, size_t bytes) const = 0;
  // Backs every released granule overlapping [p, p + bytes) again, zero-filled.
  virtual void commit(void* p, size_t bytes) const = 0;
  // Bytes of [p, p + bytes)'s granules that are backed.
  virtual int64_t committed_bytes(const void* p, size_t bytes) const = 0;
};

// The releasable memory of `device` (a GPU backend's DeviceMemory). Null for a device that
// has none, with *why_not saying why; the GPU backend registers its own.
const ReleasableMemory* releasable_memory(const DeviceMemory* device, std::string* why_not);
void register_releasable_memory(const DeviceMemory* device, const ReleasableMemory* memory,
                                const char* why_not);

// Host memory. The contents of [p, p + bytes) are no longer needed: the whole pages inside go
// back to the operating system, the partial pages at the ends are zeroed; the range then
// reads as zeros.
void discard_memory(void* p, size_t bytes);
// Only the whole pages inside [p, p + bytes) go back (read as zeros); the rest is kept.
void release_pages(void* p, size_t bytes);
// Bytes of the pages overlapping [p, p + bytes) that are backed by memory (mincore).
int64_t resident_bytes(const void* p, size_t bytes);

}  // namespace omni
