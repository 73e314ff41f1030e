// The GPU's releasable memory (base/releasable_memory.h): a buffer is a reserved range of
// device addresses with one physical allocation mapped at each granule, so a granule can be
// unmapped (released) and mapped again (committed) while the buffer keeps its address. CUDA:
// the driver's virtual memory management (cuMemAddressReserve, cuMemCreate, cuMemMap,
// cuMemSetAccess; cuMemUnmap, cuMemRelease, found through the runtime) at
// cuMemGetAllocationGranularity's minimum; HIP:
// its hipMem* equivalents; the emulator: host pages, inaccessible (PROT_NONE) while released,
// so a touch of released memory faults there as it would on a GPU. A run of granules committed
// together gets one access call; a commit that fails gives back what it had mapped.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
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
// Released pages read as zeros when accessible again.
void map_run(void* at, size_t granule, Handle* handles, size_t count) {
  OMNI_CHECK(mprotect(at, granule * count, PROT_READ | PROT_WRITE) == 0,
             "[releasable memory] mprotect");
  std::fill_n(handles, count, Handle{1});
}
void unmap_run(void* at, size_t granule, const Handle*, size_t count) {
  OMNI_CHECK(madvise(at, granule * count, MADV_DONTNEED) == 0 &&
                 mprotect(at, granule * count, PROT_NONE) == 0,
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
// Granules [0, mapped) of a run at `at` handed back, errors ignored (a failed commit's undo).
void undo_run(char* at, size_t granule, const Handle* handles, size_t mapped) {
  for (size_t i = 0; i < mapped; ++i) {
    (void)hipMemUnmap(at + i * granule, granule);
    (void)hipMemRelease(handles[i]);
  }
  (void)hipGetLastError();
}
void map_run(void* at, size_t granule, Handle* handles, size_t count) {
  const hipMemAllocationProp prop = properties();
  char* const base = static_cast<char*>(at);
  for (size_t i = 0; i < count; ++i) {
    if (hipMemCreate(&handles[i], granule, &prop, 0) != hipSuccess) {
      undo_run(base, granule, handles, i);
      throw UsageError("out of GPU memory: cannot commit " + std::to_string(granule >> 10) +
                       " KiB of a ZeRO buffer");
    }
    if (const hipError_t e = hipMemMap(base + i * granule, granule, 0, handles[i], 0);
        e != hipSuccess) {
      (void)hipMemRelease(handles[i]);
      undo_run(base, granule, handles, i);
      OMNI_GPU_CHECK(e);
    }
  }
  hipMemAccessDesc access{};
  access.location = prop.location;
  access.flags = hipMemAccessFlagsProtReadWrite;
  if (const hipError_t e = hipMemSetAccess(at, granule * count, &access, 1); e != hipSuccess) {
    undo_run(base, granule, handles, count);
    OMNI_GPU_CHECK(e);
  }
}
void unmap_run(void* at, size_t granule, const Handle* handles, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    OMNI_GPU_CHECK(hipMemUnmap(static_cast<char*>(at) + i * granule, granule));
    OMNI_GPU_CHECK(hipMemRelease(handles[i]));
  }
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
// Granules [0, mapped) of a run at `at` handed back, errors ignored (a failed commit's undo).
void undo_run(CUdeviceptr at, size_t granule, const Handle* handles, size_t mapped) {
  for (size_t i = 0; i < mapped; ++i) {
    (void)driver().unmap(at + i * granule, granule);
    (void)driver().release(handles[i]);
  }
}
void map_run(void* at, size_t granule, Handle* handles, size_t count) {
  const CUmemAllocationProp prop = properties();
  const auto base = reinterpret_cast<CUdeviceptr>(at);
  for (size_t i = 0; i < count; ++i) {
    if (driver().create(&handles[i], granule, &prop, 0) != CUDA_SUCCESS) {
      undo_run(base, granule, handles, i);
      throw UsageError("out of GPU memory: cannot commit " + std::to_string(granule >> 10) +
                       " KiB of a ZeRO buffer");
    }
    if (const CUresult r = driver().map(base + i * granule, granule, 0, handles[i], 0);
        r != CUDA_SUCCESS) {
      (void)driver().release(handles[i]);
      undo_run(base, granule, handles, i);
      check(r, "cuMemMap");
    }
  }
  // One access call for the run: it may span several mappings.
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (const CUresult r = driver().set_access(base, granule * count, &access, 1);
      r != CUDA_SUCCESS) {
    undo_run(base, granule, handles, count);
    check(r, "cuMemSetAccess");
  }
}
void unmap_run(void* at, size_t granule, const Handle* handles, size_t count) {
  const auto base = reinterpret_cast<CUdeviceptr>(at);
  for (size_t i = 0; i < count; ++i) {
    check(driver().unmap(base + i * granule, granule), "cuMemUnmap");
    check(driver().release(handles[i]), "cuMemRelease");
  }
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
    try {
      commit_locked(b, reinterpret_cast<uintptr_t>(p), 0, n);
    } catch (...) {  // the granules committed before the failure, and the addresses, back
      release_locked(b, reinterpret_cast<uintptr_t>(p), 0, n);
      buffers_.erase(reinterpret_cast<uintptr_t>(p));
      unreserve(p, n * g);
      throw;
    }
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
  // Calls f(first, last) for each run of granules in [first, last) whose mapped flag is `mapped`.
  template <typename F>
  static void for_each_run(const Buffer& b, size_t first, size_t last, bool mapped, F&& f) {
    for (size_t i = first; i < last;) {
      if (b.mapped[i] != mapped) {
        ++i;
        continue;
      }
      size_t j = i + 1;
      while (j < last && b.mapped[j] == mapped) ++j;
      f(i, j);
      i = j;
    }
  }
  // Each run of unmapped granules is mapped with one access call (and zeroed with one call).
  void commit_locked(Buffer& b, uintptr_t base, size_t first, size_t last) const {
    const size_t g = granularity_;
    for_each_run(b, first, last, false, [&](size_t i, size_t j) {
      void* at = reinterpret_cast<void*>(base + i * g);
      map_run(at, g, b.granules.data() + i, j - i);
      std::fill(b.mapped.begin() + i, b.mapped.begin() + j, true);
#if !defined(OMNITRON_GPU_EMULATE)
      device_.zero(at, (j - i) * g);  // a fresh physical allocation holds anything
#endif
    });
  }
  void release_locked(Buffer& b, uintptr_t base, size_t first, size_t last) const {
    const size_t g = granularity_;
    for_each_run(b, first, last, true, [&](size_t i, size_t j) {
      unmap_run(reinterpret_cast<void*>(base + i * g), g, b.granules.data() + i, j - i);
      std::fill(b.granules.begin() + i, b.granules.begin() + j, Handle{});
      std::fill(b.mapped.begin() + i, b.mapped.begin() + j, false);
    });
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
