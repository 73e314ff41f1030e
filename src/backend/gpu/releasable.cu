// The GPU's releasable memory (base/releasable_memory.h): a buffer is a reserved range of
// device addresses with one physical allocation mapped at each granule, so a granule can be
// unmapped (released) and mapped again (committed) while the buffer keeps its address. CUDA:
// the driver's virtual memory management (cuMemAddressReserve, cuMemCreate, cuMemMap,
// cuMemSetAccess; cuMemUnmap, cuMemRelease, found through the runtime) at
// cuMemGetAllocationGranularity's minimum; HIP:
// its hipMem* equivalents; the emulator: host pages, inaccessible (PROT_NONE) while released,
// so a touch of released memory faults there as it would on a GPU.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include "backend/gpu/gpu_ops.h"
#include "backend/gpu/gpu_runtime.h"
#include "base/releasable_memory.h"

#if defined(OMNITRON_GPU_EMULATE)
#include "backend/gpu/emulator_check.h"
#elif !defined(__HIPCC__) && !defined(OMNITRON_HIP)
#include <cuda.h>
#endif

OMNI_GPU_NAMESPACE_BEGIN
namespace {

// ---- The platform: reserve addresses, map and unmap one granule ------------------------
#if defined(OMNITRON_GPU_EMULATE)
using Handle = uintptr_t;  // nonzero: mapped

size_t min_granularity() {
  return size_t(sysconf(_SC_PAGESIZE));
}
void* reserve(size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  OMNI_CHECK(p != MAP_FAILED, "[releasable memory] cannot reserve ", bytes, " bytes");
  emulator::check::note_alloc(p, bytes);
  return p;
}
void unreserve(void* p, size_t bytes) {
  emulator::check::note_free(p);
  munmap(p, bytes);
}
Handle map(void* at, size_t bytes) {  // released pages read as zeros when accessible again
  OMNI_CHECK(mprotect(at, bytes, PROT_READ | PROT_WRITE) == 0, "[releasable memory] mprotect");
  return 1;
}
void unmap(void* at, size_t bytes, Handle) {
  OMNI_CHECK(madvise(at, bytes, MADV_DONTNEED) == 0 && mprotect(at, bytes, PROT_NONE) == 0,
             "[releasable memory] madvise/mprotect");
}
#elif defined(__HIPCC__) || defined(OMNITRON_HIP)
using Handle = hipMemGenericAllocationHandle_t;

hipMemAllocationProp properties() {
  int device = 0;
  OMNI_GPU_CHECK(hipGetDevice(&device));
  hipMemAllocationProp prop{};
  prop.type = hipMemAllocationTypePinned;
  prop.location.type = hipMemLocationTypeDevice;
  prop.location.id = device;
  return prop;
}
size_t min_granularity() {
  const hipMemAllocationProp prop = properties();
  size_t g = 0;
  OMNI_GPU_CHECK(hipMemGetAllocationGranularity(&g, &prop, hipMemAllocationGranularityMinimum));
  return g;
}
void* reserve(size_t bytes) {
  void* p = nullptr;
  OMNI_GPU_CHECK(hipMemAddressReserve(&p, bytes, 0, nullptr, 0));
  return p;
}
void unreserve(void* p, size_t bytes) {
  (void)hipMemAddressFree(p, bytes);
}
Handle map(void* at, size_t bytes) {
  const hipMemAllocationProp prop = properties();
  Handle h{};
  if (hipMemCreate(&h, bytes, &prop, 0) != hipSuccess) {
    (void)hipGetLastError();
    throw UsageError("out of GPU memory: cannot commit " + std::to_string(bytes >> 10) +
                     " KiB of a ZeRO buffer");
  }
  OMNI_GPU_CHECK(hipMemMap(at, bytes, 0, h, 0));
  hipMemAccessDesc access{};
  access.location = prop.location;
  access.flags = hipMemAccessFlagsProtReadWrite;
  OMNI_GPU_CHECK(hipMemSetAccess(at, bytes, &access, 1));
  return h;
}
void unmap(void* at, size_t bytes, Handle h) {
  OMNI_GPU_CHECK(hipMemUnmap(at, bytes));
  OMNI_GPU_CHECK(hipMemRelease(h));
}
#else
using Handle = CUmemGenericAllocationHandle;

// The driver's functions come through the runtime (cudaGetDriverEntryPoint), so the program
// does not link libcuda.so and starts on a machine without a GPU driver.
struct Driver {
  decltype(&cuGetErrorName) error_name;
  decltype(&cuMemGetAllocationGranularity) granularity;
  decltype(&cuMemAddressReserve) address_reserve;
  decltype(&cuMemAddressFree) address_free;
  decltype(&cuMemCreate) create;
  decltype(&cuMemMap) map;
  decltype(&cuMemSetAccess) set_access;
  decltype(&cuMemUnmap) unmap;
  decltype(&cuMemRelease) release;
};
template <typename F>
void load(F& fn, const char* name) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult found{};
#if CUDART_VERSION >= 12050
  OMNI_GPU_CHECK(cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &found));
#else
  OMNI_GPU_CHECK(cudaGetDriverEntryPoint(name, &p, cudaEnableDefault, &found));
#endif
  OMNI_CHECK(p && found == cudaDriverEntryPointSuccess,
             "[releasable memory] the CUDA driver has no ", name);
  fn = reinterpret_cast<F>(p);
}
const Driver& driver() {
  static const Driver d = [] {
    Driver d{};
    load(d.error_name, "cuGetErrorName");
    load(d.granularity, "cuMemGetAllocationGranularity");
    load(d.address_reserve, "cuMemAddressReserve");
    load(d.address_free, "cuMemAddressFree");
    load(d.create, "cuMemCreate");
    load(d.map, "cuMemMap");
    load(d.set_access, "cuMemSetAccess");
    load(d.unmap, "cuMemUnmap");
    load(d.release, "cuMemRelease");
    return d;
  }();
  return d;
}

void check(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return;
  const char* name = nullptr;
  driver().error_name(r, &name);
  throw InternalError(std::string("[releasable memory] ") + what + ": " +
                      (name ? name : "unknown CUDA driver error"));
}
CUmemAllocationProp properties() {
  int device = 0;
  OMNI_GPU_CHECK(cudaGetDevice(&device));
  OMNI_GPU_CHECK(cudaFree(nullptr));  // the runtime's primary context, which the driver API uses
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}
size_t min_granularity() {
  const CUmemAllocationProp prop = properties();
  size_t g = 0;
  check(driver().granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
        "cuMemGetAllocationGranularity");
  return g;
}
void* reserve(size_t bytes) {
  CUdeviceptr p = 0;
  check(driver().address_reserve(&p, bytes, 0, 0, 0), "cuMemAddressReserve");
  return reinterpret_cast<void*>(p);
}
void unreserve(void* p, size_t bytes) {
  (void)driver().address_free(reinterpret_cast<CUdeviceptr>(p), bytes);
}
Handle map(void* at, size_t bytes) {
  const CUmemAllocationProp prop = properties();
  Handle h = 0;
  if (driver().create(&h, bytes, &prop, 0) != CUDA_SUCCESS)
    throw UsageError("out of GPU memory: cannot commit " + std::to_string(bytes >> 10) +
                     " KiB of a ZeRO buffer");
  const auto d = reinterpret_cast<CUdeviceptr>(at);
  check(driver().map(d, bytes, 0, h, 0), "cuMemMap");
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  check(driver().set_access(d, bytes, &access, 1), "cuMemSetAccess");
  return h;
}
void unmap(void* at, size_t bytes, Handle h) {
  check(driver().unmap(reinterpret_cast<CUdeviceptr>(at), bytes), "cuMemUnmap");
  check(driver().release(h), "cuMemRelease");
}
#endif

// ---- Buffers of granules -----------------------------------------------------------------
class Releasable final : public ReleasableMemory {
 public:
  explicit Releasable(const DeviceMemory& device) : device_(device) {}

  size_t granularity() const override {
    const std::lock_guard lock(mutex_);
    if (granularity_ == 0) granularity_ = std::max<size_t>(min_granularity(), 1);
    return granularity_;
  }
  void* allocate(size_t bytes) const override {
    if (bytes == 0) return nullptr;
    const size_t g = granularity(), n = (bytes + g - 1) / g;
    void* p = reserve(n * g);
    const std::lock_guard lock(mutex_);
    Buffer& b = buffers_[reinterpret_cast<uintptr_t>(p)];
    b.bytes = n * g;
    b.granules.assign(n, Handle{});
    b.mapped.assign(n, false);
    commit_locked(b, reinterpret_cast<uintptr_t>(p), 0, n);
    return p;
  }
  void deallocate(void* p) const override {
    if (!p) return;
    device_.synchronize();
    const std::lock_guard lock(mutex_);
    const auto it = buffers_.find(reinterpret_cast<uintptr_t>(p));
    if (it == buffers_.end()) return;
    release_locked(it->second, it->first, 0, it->second.granules.size());
    unreserve(p, it->second.bytes);
    buffers_.erase(it);
  }
  void zero(void* p, size_t bytes) const override { device_.zero(p, bytes); }
  void upload(void* dst, const void* src, size_t bytes) const override {
    device_.upload(dst, src, bytes);
  }
  void download(void* dst, const void* src, size_t bytes) const override {
    device_.download(dst, src, bytes);
  }
  void copy(void* dst, const void* src, size_t bytes) const override {
    device_.copy(dst, src, bytes);
  }
  void copy_rows(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                 size_t rows) const override {
    device_.copy_rows(dst, dst_pitch, src, src_pitch, width, rows);
  }
  void synchronize() const override { device_.synchronize(); }

  void release(void* p, size_t bytes) const override {
    const size_t g = granularity();
    device_.synchronize();  // no op in flight may touch what is unmapped
    const std::lock_guard lock(mutex_);
    auto [base, b] = find(p);
    const uintptr_t a = reinterpret_cast<uintptr_t>(p) - base;
    const size_t first = (a + g - 1) / g, last = std::min((a + bytes) / g, b->granules.size());
    if (first < last) release_locked(*b, base, first, last);
  }
  void commit(void* p, size_t bytes) const override {
    if (bytes == 0) return;
    const size_t g = granularity();
    const std::lock_guard lock(mutex_);
    auto [base, b] = find(p);
    const uintptr_t a = reinterpret_cast<uintptr_t>(p) - base;
    commit_locked(*b, base, a / g, std::min((a + bytes + g - 1) / g, b->granules.size()));
  }
  int64_t committed_bytes(const void* p, size_t bytes) const override {
    if (bytes == 0) return 0;
    const size_t g = granularity();
    const std::lock_guard lock(mutex_);
    auto [base, b] = find(p);
    const uintptr_t a = reinterpret_cast<uintptr_t>(p) - base;
    int64_t n = 0;
    for (size_t i = a / g; i < std::min((a + bytes + g - 1) / g, b->granules.size()); ++i)
      n += b->mapped[i] ? int64_t(g) : 0;
    return n;
  }

 private:
  struct Buffer {
    size_t bytes = 0;
    std::vector<Handle> granules;
    std::vector<bool> mapped;
  };

  std::pair<uintptr_t, Buffer*> find(const void* p) const {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    auto it = buffers_.upper_bound(a);
    OMNI_CHECK(it != buffers_.begin(), "[releasable memory] ", p, " is in no releasable buffer");
    --it;
    OMNI_CHECK(a < it->first + it->second.bytes || (a == it->first + it->second.bytes),
               "[releasable memory] ", p, " is in no releasable buffer");
    return {it->first, &it->second};
  }
  void commit_locked(Buffer& b, uintptr_t base, size_t first, size_t last) const {
    const size_t g = granularity_;
    for (size_t i = first; i < last; ++i) {
      if (b.mapped[i]) continue;
      void* at = reinterpret_cast<void*>(base + i * g);
      b.granules[i] = map(at, g);
      b.mapped[i] = true;
#if !defined(OMNITRON_GPU_EMULATE)
      device_.zero(at, g);  // a fresh physical allocation holds anything
#endif
    }
  }
  void release_locked(Buffer& b, uintptr_t base, size_t first, size_t last) const {
    const size_t g = granularity_;
    for (size_t i = first; i < last; ++i) {
      if (!b.mapped[i]) continue;
      unmap(reinterpret_cast<void*>(base + i * g), g, b.granules[i]);
      b.granules[i] = Handle{};
      b.mapped[i] = false;
    }
  }

  const DeviceMemory& device_;
  mutable std::mutex mutex_;
  mutable size_t granularity_ = 0;
  mutable std::map<uintptr_t, Buffer> buffers_;
};

}  // namespace

void register_releasable(const DeviceMemory& device) {
  static const Releasable memory(device);
  register_releasable_memory(&device, &memory, nullptr);
}

OMNI_GPU_NAMESPACE_END
