// The emulator's checks bite: each test plants one bug in a small kernel written for the purpose
// and expects the emulator's report (emulator.h): a missing barrier whose result is the same in
// every order on the test data, a shuffle that assumes 32 lanes, reads and writes past a tile,
// a read of shared memory nobody wrote, blocks racing on device memory; atomics are exempt.
// Built into both emulated test binaries (32 and 64 lanes). The race and bounds checks need
// the kernels' access hooks, which the AddressSanitizer build has not: there, AddressSanitizer
// itself must catch the out-of-bounds accesses.
#include <gtest/gtest.h>

#include <numeric>
#include <string>

#include "backend/gpu/gpu_runtime.h"
#include "gpu/gpu_test.h"

OMNI_GPU_NAMESPACE_BEGIN
namespace planted {

// Rotates a tile by one place; the barrier between reading the neighbour's element and
// overwriting one's own is missing. On equal inputs every order gives the same output.
__global__ void rotate_without_barrier_kernel(float* out, const float* x) {
  __shared__ float tile[64];
  const int t = threadIdx.x, i = blockIdx.x * blockDim.x + t;
  tile[t] = x[i];
  __syncthreads();
  const float next = tile[(t + 1) % blockDim.x];
  tile[t] = next;  // planted: no __syncthreads() before this write
  __syncthreads();
  out[i] = tile[t];
}

// A warp sum written for 32 lanes: on a 64-lane wavefront each half sums only itself.
__global__ void sum_assuming_32_lanes_kernel(float* out, const float* x) {
  float v = x[threadIdx.x];
  for (int m = 16; m > 0; m /= 2) v += warp_shfl_xor(v, m);  // planted: 16 is not kWarpSize / 2
  if (threadIdx.x == 0) out[0] = v;
}

// Each thread adds its element of the tile and the next: the last one reads past the tile.
__global__ void pairs_past_dynamic_tile_kernel(float* out, const float* x) {
  OMNI_DYNAMIC_SHARED(raw);
  float* tile = reinterpret_cast<float*>(raw);
  const int t = threadIdx.x;
  tile[t] = x[t];
  __syncthreads();
  out[t] = tile[t] + tile[t + 1];  // planted: off by one for t = blockDim.x - 1
}
__global__ void pairs_past_static_tile_kernel(float* out, const float* x) {
  __shared__ float tile[64];
  const int t = threadIdx.x;
  tile[t] = x[t];
  __syncthreads();
  out[t] = tile[t] + tile[t + 1];  // planted: off by one for t = 63
}
// Stores one place further than it should: the last thread writes past the tile.
__global__ void store_past_dynamic_tile_kernel(float* out, const float* x) {
  OMNI_DYNAMIC_SHARED(raw);
  float* tile = reinterpret_cast<float*>(raw);
  const int t = threadIdx.x;
  tile[t + 1] = x[t];  // planted
  __syncthreads();
  if (t > 0) out[t] = tile[t];
}
// Reads one element past the end of a device array.
__global__ void pairs_past_device_array_kernel(float* out, const float* x) {
  const int t = threadIdx.x;
  out[t] = x[t] + x[t + 1];  // planted: x has blockDim.x elements
}

// Threads [stored, blockDim.x) read elements of the tile nobody stored.
__global__ void read_unstored_kernel(float* out, int stored) {
  __shared__ float tile[64];
  const int t = threadIdx.x;
  if (t < stored) tile[t] = 1.0f;
  __syncthreads();
  out[t] = tile[t];  // planted: should read tile[t % stored]
}

// Every block stores the same value to the same element: a race between blocks.
__global__ void every_block_stores_kernel(float* out) {
  if (threadIdx.x == 0) out[0] = 1.0f;
}

// Shared-memory atomics between barriers are no race.
__global__ void count_with_atomics_kernel(float* out) {
  __shared__ int count;
  if (threadIdx.x == 0) count = 0;
  __syncthreads();
  atomicAdd(&count, 1);
  __syncthreads();
  if (threadIdx.x == 0) out[blockIdx.x] = static_cast<float>(count);
}

}  // namespace planted
OMNI_GPU_NAMESPACE_END

namespace omni::gpu_test {
namespace {

using gpu::emulator::Checks;
namespace planted = gpu::planted;

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAddressSanitizer = true;
#else
constexpr bool kAddressSanitizer = false;
#endif
#define OMNI_REQUIRE_ACCESS_HOOKS()                                                         \
  if (kAddressSanitizer)                                                                    \
  GTEST_SKIP() << "the AddressSanitizer build compiles the kernels without the emulator's " \
                  "access hooks (TSan instrumentation); the other builds run this check"

// Runs f with the emulator's checks set to c; returns what it threw ("" when nothing).
template <typename F>
std::string report_of(Checks c, F&& f) {
  const Checks before = gpu::emulator::checks();
  gpu::emulator::set_checks(c);
  std::string what;
  try {
    f();
  } catch (const InternalError& e) {
    what = e.what();
  }
  gpu::emulator::set_checks(before);
  return what;
}

#define EXPECT_REPORT_HAS(report, text) \
  EXPECT_NE((report).find(text), std::string::npos) << "report: " << (report)

TEST(EmulatorRaceCheck, FindsAMissingBarrierThatEveryOrderHides) {
  OMNI_REQUIRE_ACCESS_HOOKS();
  const std::vector<float> x(128, 3.0f);
  Device<float> dx(x), out(x.size());
  auto run = [&] {
    gpu::launch(planted::rotate_without_barrier_kernel, 2, 64, 0, nullptr, out.get(), dx.get());
  };
  // Without the check the result is right: fiber order cannot show this race.
  EXPECT_EQ(report_of(Checks::Off, run), "");
  EXPECT_EQ(out.host(), x);
  const std::string r = report_of(Checks::Shared, run);
  EXPECT_REPORT_HAS(r, "race: thread (");
  EXPECT_REPORT_HAS(r, "with no __syncthreads() between");
  EXPECT_REPORT_HAS(r, "rotate_without_barrier_kernel(float*, float const*)::tile + ");
  EXPECT_REPORT_HAS(r, "kernel omni::gpu::emulated::planted::rotate_without_barrier_kernel");
  EXPECT_REPORT_HAS(r, "test_emulator_checks.cpp:");
  EXPECT_REPORT_HAS(r, "block (");
}

TEST(EmulatorRaceCheck, AtomicsAreExempt) {
  OMNI_REQUIRE_ACCESS_HOOKS();
  Device<float> out(2);
  EXPECT_EQ(
      report_of(
          Checks::SharedAndDevice,
          [&] { gpu::launch(planted::count_with_atomics_kernel, 2, 96, 0, nullptr, out.get()); }),
      "");
  EXPECT_EQ(out.host(), std::vector<float>({96.0f, 96.0f}));
}

TEST(EmulatorRaceCheck, DeviceMemoryModeFindsBlocksStoringToOneElement) {
  OMNI_REQUIRE_ACCESS_HOOKS();
  Device<float> out(1);
  auto run = [&] { gpu::launch(planted::every_block_stores_kernel, 2, 32, 0, nullptr, out.get()); };
  EXPECT_EQ(report_of(Checks::Shared, run), "");  // shared memory only
  const std::string r = report_of(Checks::SharedAndDevice, run);
  EXPECT_REPORT_HAS(r, "race: thread (0,0,0) writes 4 bytes at device allocation ");
  EXPECT_REPORT_HAS(r, "which thread (0,0,0) of block (0,0,0) wrote in the same launch");
  EXPECT_REPORT_HAS(r, "every_block_stores_kernel(float*), launched at ");
  EXPECT_REPORT_HAS(r, "block (1,0,0)");
}

TEST(EmulatorSharedMemoryCheck, FindsAReadOfSharedMemoryNobodyWrote) {
  OMNI_REQUIRE_ACCESS_HOOKS();
  Device<float> out(64);
  const std::string r = report_of(Checks::Shared, [&] {
    gpu::launch(planted::read_unstored_kernel, 1, 64, 0, nullptr, out.get(), 32);
  });
  EXPECT_REPORT_HAS(r, "uninitialized read: thread (");
  EXPECT_REPORT_HAS(r, "read_unstored_kernel(float*, int)::tile + ");
  EXPECT_REPORT_HAS(r, "which no thread of this block has written");
}

TEST(EmulatorBoundsCheck, FindsAReadOnePastADynamicSharedTile) {
  const std::vector<float> x(64, 1.0f);
  Device<float> dx(x), out(64);
  auto run = [&] {
    gpu::launch(planted::pairs_past_dynamic_tile_kernel, 1, 64, 64 * sizeof(float), nullptr,
                out.get(), dx.get());
  };
  if (kAddressSanitizer) {  // the guard bytes are poisoned
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    EXPECT_DEATH(run(), "use-after-poison");
    return;
  }
  const std::string r = report_of(Checks::Shared, run);
  EXPECT_REPORT_HAS(r,
                    "out of bounds: thread (63,0,0) reads 4 bytes at offset 256 of dynamic "
                    "shared memory (256 bytes)");
  EXPECT_REPORT_HAS(r, "pairs_past_dynamic_tile_kernel");
}

TEST(EmulatorBoundsCheck, FindsAReadOnePastAStaticSharedTile) {
  OMNI_REQUIRE_ACCESS_HOOKS();
  const std::vector<float> x(64, 1.0f);
  Device<float> dx(x), out(64);
  const std::string r = report_of(Checks::Shared, [&] {
    gpu::launch(planted::pairs_past_static_tile_kernel, 1, 64, 0, nullptr, out.get(), dx.get());
  });
  EXPECT_REPORT_HAS(r, "out of bounds: thread (63,0,0) reads 4 bytes of static shared memory");
  EXPECT_REPORT_HAS(r, "pairs_past_static_tile_kernel");
}

TEST(EmulatorBoundsCheck, GuardBytesCatchAWritePastADynamicSharedTile) {
  const std::vector<float> x(64, 1.0f);
  Device<float> dx(x), out(64);
  auto run = [&] {
    gpu::launch(planted::store_past_dynamic_tile_kernel, 1, 64, 64 * sizeof(float), nullptr,
                out.get(), dx.get());
  };
  if (kAddressSanitizer) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    EXPECT_DEATH(run(), "use-after-poison");
    return;
  }
  // Checked at the end of the block even with the per-access checks off.
  const std::string r = report_of(Checks::Off, run);
  EXPECT_REPORT_HAS(r,
                    "out of bounds: the guard byte at offset 256 of dynamic shared memory "
                    "(256 bytes) was overwritten");
  EXPECT_REPORT_HAS(r, "store_past_dynamic_tile_kernel");
  EXPECT_REPORT_HAS(report_of(Checks::Shared, run),
                    "out of bounds: thread (63,0,0) writes 4 bytes at offset 256");
}

TEST(EmulatorBoundsCheck, AddressSanitizerFindsAReadPastADeviceArray) {
  if (!kAddressSanitizer)
    GTEST_SKIP() << "device arrays are host allocations: the AddressSanitizer build checks them";
  const std::vector<float> x(64, 1.0f);
  Device<float> dx(x), out(64);
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      gpu::launch(planted::pairs_past_device_array_kernel, 1, 64, 0, nullptr, out.get(), dx.get()),
      "heap-buffer-overflow");
}

// Not a check of its own: the 64-lane build exists for bugs like this one, which the 32-lane
// emulator (and every NVIDIA GPU) cannot show.
TEST(EmulatorWarpWidth, AShuffleWrittenFor32LanesSumsHalfA64LaneWavefront) {
  std::vector<float> x(kWarpSize);
  std::iota(x.begin(), x.end(), 1.0f);
  Device<float> dx(x), out(1);
  gpu::launch(planted::sum_assuming_32_lanes_kernel, 1, kWarpSize, 0, nullptr, out.get(), dx.get());
  const float all = std::accumulate(x.begin(), x.end(), 0.0f);
  const float first_32 = std::accumulate(x.begin(), x.begin() + 32, 0.0f);
  EXPECT_EQ(out.host()[0], kWarpSize == 32 ? all : first_32) << kWarpSize << " lanes";
}

}  // namespace
}  // namespace omni::gpu_test
