#include "base/releasable_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <utility>
#include <vector>

#include "base/error.h"

namespace omni {

namespace {

uintptr_t page_size() {
  static const uintptr_t size = uintptr_t(sysconf(_SC_PAGESIZE));
  return size;
}

struct Registered {
  const DeviceMemory* device;
  const ReleasableMemory* memory;
  std::string why_not;
};

std::mutex registry_mutex;
std::vector<Registered>& registry() {
  static auto* r = new std::vector<Registered>;  // never destroyed: backends outlive main
  return *r;
}

}  // namespace

const ReleasableMemory* releasable_memory(const DeviceMemory* device, std::string* why_not) {
  const std::lock_guard lock(registry_mutex);
  for (const Registered& r : registry())
    if (r.device == device) {
      if (!r.memory && why_not) *why_not = r.why_not;
      return r.memory;
    }
  if (why_not) *why_not = "this device cannot release memory";
  return nullptr;
}

void register_releasable_memory(const DeviceMemory* device, const ReleasableMemory* memory,
                                const char* why_not) {
  const std::lock_guard lock(registry_mutex);
  for (Registered& r : registry())
    if (r.device == device) {
      r = {device, memory, why_not ? why_not : ""};
      return;
    }
  registry().push_back({device, memory, why_not ? why_not : ""});
}

void release_pages(void* p, size_t bytes) {
  const uintptr_t page = page_size(), a = reinterpret_cast<uintptr_t>(p);
  const uintptr_t begin = (a + page - 1) / page * page, end = (a + bytes) / page * page;
  if (end > begin)
    OMNI_CHECK(madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED) == 0,
               "[memory] madvise of ", end - begin, " bytes failed");
}

void discard_memory(void* p, size_t bytes) {
  const uintptr_t page = page_size(), a = reinterpret_cast<uintptr_t>(p);
  const uintptr_t begin = std::min((a + page - 1) / page * page, a + bytes);
  const uintptr_t end = std::max((a + bytes) / page * page, begin);
  std::memset(p, 0, begin - a);
  std::memset(reinterpret_cast<void*>(end), 0, a + bytes - end);
  release_pages(p, bytes);
}

int64_t resident_bytes(const void* p, size_t bytes) {
  if (bytes == 0) return 0;
  const uintptr_t page = page_size(), a = reinterpret_cast<uintptr_t>(p);
  const uintptr_t begin = a / page * page, end = (a + bytes + page - 1) / page * page;
  std::vector<unsigned char> in_core((end - begin) / page);
  OMNI_CHECK(mincore(reinterpret_cast<void*>(begin), end - begin, in_core.data()) == 0,
             "[memory] mincore failed");
  int64_t resident = 0;
  for (unsigned char c : in_core) resident += (c & 1) ? int64_t(page) : 0;
  return resident;
}

}  // namespace omni
