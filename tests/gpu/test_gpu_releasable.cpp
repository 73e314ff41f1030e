// The GPU's releasable memory (base/releasable_memory.h, backend/gpu/releasable.cu), which
// ZeRO 2 and 3 allocate their flat buffers from: a granule released and committed again is
// backed anew at the same address and reads zeros; the partial granules at a released
// range's ends, and every other granule, keep their bytes.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "base/releasable_memory.h"
#include "gpu/gpu_test.h"

namespace omni {
namespace {

TEST(GpuReleasableMemory, ReleasedGranulesComeBackAsZerosAtTheSameAddress) {
  OMNI_REQUIRE_GPU();
  std::string why;
  const ReleasableMemory* m = releasable_memory(&gpu::backend(), &why);
  ASSERT_NE(m, nullptr) << why;
  const size_t g = m->granularity(), bytes = 4 * g;
  auto* p = static_cast<unsigned char*>(m->allocate(bytes));
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(m->committed_bytes(p, bytes), int64_t(bytes));
  std::vector<unsigned char> host(bytes, 7);
  m->upload(p, host.data(), bytes);
  m->release(p + g / 2, 2 * g);  // granule 1 lies inside, 0 and 2 only partly
  EXPECT_EQ(m->committed_bytes(p, bytes), int64_t(3 * g));
  EXPECT_EQ(m->committed_bytes(p + g, g), 0);
  m->commit(p + g + 5, 1);  // the whole granule
  EXPECT_EQ(m->committed_bytes(p, bytes), int64_t(bytes));
  m->download(host.data(), p, bytes);
  size_t wrong = 0;
  for (size_t i = 0; i < bytes; ++i) wrong += host[i] != (i >= g && i < 2 * g ? 0 : 7);
  EXPECT_EQ(wrong, 0u) << "of " << bytes << " bytes (granule " << g << ")";
  m->release(p, bytes);
  EXPECT_EQ(m->committed_bytes(p, bytes), 0);
  m->deallocate(p);
}

}  // namespace
}  // namespace omni
