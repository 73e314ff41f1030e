// The emulator's race and bounds checks (emulator_check.h): shadow state behind the access
// hooks of the instrumented kernels.
//
// Every byte of shared memory has a shadow: the epoch and thread of its last write and of its
// last two readers. An epoch is one stretch between two __syncthreads() of one block (numbers
// from one counter, so "this block" and "this stretch" are comparisons). An access conflicts
// with an earlier one of another thread when either writes and both fall in the same stretch,
// or, for device memory, in different blocks of the same launch. Reading shared memory that no
// thread of the block wrote is reported too (it holds another block's data, or nothing), as is
// any access outside the kernel's shared arrays: the guard bytes around dynamic shared memory,
// the bytes between static __shared__ arrays, or another kernel's array.
//
// Static __shared__ arrays are thread-local variables of the executable; their extents and
// names, and the kernels' names, come from its symbol table.
#include "backend/gpu/emulator_check.h"

#include <cxxabi.h>
#include <dlfcn.h>
#include <elf.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <vector>

namespace omni::gpu::emulator {
namespace {

Checks checks_from_environment() {
  const char* v = std::getenv("OMNI_EMULATOR_CHECKS");
  const std::string s = v ? v : "";
  if (s == "off" || s == "0") return Checks::Off;
  if (s == "device") return Checks::SharedAndDevice;
  return Checks::Shared;
}
std::atomic<Checks> g_checks{checks_from_environment()};

}  // namespace

void set_checks(Checks c) {
  g_checks = c;
}
Checks checks() {
  return g_checks;
}

namespace check {
namespace {

// ---- Names from the executable's symbol table ---------------------------------------------
struct Symbol {
  uintptr_t lo, hi;  // functions: run-time addresses; shared arrays: offsets in the TLS block
  std::string name;  // demangled
};
struct Symbols {
  std::vector<Symbol> functions, shared;
};

std::string demangle(const char* mangled) {
  int status = 0;
  char* d = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string s = status == 0 && d ? d : mangled;
  std::free(d);
  return s;
}

Symbols load_symbols() {
  Symbols out;
  // Read in blocks: byte by byte (istreambuf_iterator) took a second per test process in the
  // ASan build, whose binary is some 40 MB.
  std::ifstream f("/proc/self/exe", std::ios::binary);
  std::vector<char> elf;
  for (std::vector<char> block(size_t{1} << 20);
       f.read(block.data(), std::streamsize(block.size())) || f.gcount() > 0;)
    elf.insert(elf.end(), block.data(), block.data() + f.gcount());
  if (elf.size() < sizeof(Elf64_Ehdr)) return out;
  const auto* eh = reinterpret_cast<const Elf64_Ehdr*>(elf.data());
  if (std::memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0 || eh->e_ident[EI_CLASS] != ELFCLASS64 ||
      eh->e_shoff + size_t{eh->e_shnum} * sizeof(Elf64_Shdr) > elf.size())
    return out;
  Dl_info self{};
  dladdr(reinterpret_cast<void*>(&load_symbols), &self);
  const uintptr_t base = eh->e_type == ET_DYN ? reinterpret_cast<uintptr_t>(self.dli_fbase) : 0;
  const auto* sections = reinterpret_cast<const Elf64_Shdr*>(elf.data() + eh->e_shoff);
  for (int i = 0; i < eh->e_shnum; ++i) {
    const Elf64_Shdr& sh = sections[i];
    if (sh.sh_type != SHT_SYMTAB || sh.sh_link >= eh->e_shnum) continue;
    const Elf64_Shdr& strtab = sections[sh.sh_link];
    if (sh.sh_offset + sh.sh_size > elf.size() || strtab.sh_offset + strtab.sh_size > elf.size())
      continue;
    const auto* syms = reinterpret_cast<const Elf64_Sym*>(elf.data() + sh.sh_offset);
    for (size_t k = 0; k < sh.sh_size / sizeof(Elf64_Sym); ++k) {
      const Elf64_Sym& s = syms[k];
      if (s.st_size == 0 || s.st_name >= strtab.sh_size) continue;
      const char* name = elf.data() + strtab.sh_offset + s.st_name;
      const int type = ELF64_ST_TYPE(s.st_info);
      if (type == STT_FUNC)
        out.functions.push_back({base + s.st_value, base + s.st_value + s.st_size, name});
      // Function-local thread-locals of the GPU code: its __shared__ arrays.
      else if (type == STT_TLS && std::strncmp(name, "_ZZN4omni3gpu8emulated", 22) == 0)
        out.shared.push_back({s.st_value, s.st_value + s.st_size, demangle(name)});
    }
  }
  auto by_address = [](const Symbol& a, const Symbol& b) { return a.lo < b.lo; };
  std::sort(out.functions.begin(), out.functions.end(), by_address);
  std::sort(out.shared.begin(), out.shared.end(), by_address);
  return out;
}

const Symbols& symbols() {
  static const Symbols s = load_symbols();
  return s;
}

std::string function_at(const void* p) {
  const auto& fs = symbols().functions;
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto it = std::upper_bound(fs.begin(), fs.end(), a,
                             [](uintptr_t x, const Symbol& s) { return x < s.lo; });
  if (it != fs.begin() && a < (--it)->hi) return demangle(it->name.c_str());
  std::ostringstream s;
  s << "the function at " << p << " (no symbol table)";
  return s.str();
}

// A kernel's name as its static locals spell it: templates' names demangle with the return
// type, their locals' without.
std::string without_void(const std::string& function) {
  return function.starts_with("void ") ? function.substr(5) : function;
}
// "f(int)::red" -> "f(int)"; "g<float>(int)" -> "g" (the template, for siblings).
std::string owner_of(const std::string& var) {
  return without_void(var.substr(0, var.rfind("::")));
}
std::string template_of(std::string function) {
  const std::string anonymous = "(anonymous namespace)";
  for (size_t at; (at = function.find(anonymous)) != std::string::npos;)
    function.erase(at, anonymous.size());
  return function.substr(0, function.find_first_of("<("));
}

// ---- Device allocations --------------------------------------------------------------------
struct Shadow {
  uint32_t write_epoch = 0, read_epoch[2] = {0, 0};
  uint32_t writer = 0, reader[2] = {0, 0};  // block << 10 | thread
};
struct Allocation {
  size_t bytes;
  std::vector<Shadow> shadow;  // made at the first checked access
};
std::mutex g_alloc_mutex;
std::map<uintptr_t, Allocation> g_allocations;

std::atomic<uint32_t> g_epoch{1};
std::mutex g_kernels_mutex;
std::set<std::string> g_launched;  // kernels launched so far, by name

// ---- The checks of the block running on this thread ----------------------------------------
struct Checker {
  const LaunchChecks* lc = nullptr;
  uint32_t block_linear = 0, me = 0, epoch = 0, block_first = 0;
  uintptr_t dyn_lo = 0, dyn_hi = 0;  // guards included
  size_t dyn_bytes = 0;
  std::vector<Shadow> dyn_shadow;
  uintptr_t tls_base = 0, tls_lo = 0, tls_hi = 0;
  std::vector<Shadow> tls_shadow;
  std::string first;
  size_t found = 0;

  std::string thread_name(uint32_t id) const {
    const dim3& b = lc->launch.block;
    const uint32_t t = id & 1023u, bl = id >> 10;
    std::ostringstream s;
    s << "thread (" << t % b.x << "," << t / b.x % b.y << "," << t / (b.x * b.y) << ")";
    if (bl != block_linear) {
      const dim3& g = lc->launch.grid;
      s << " of block (" << bl % g.x << "," << bl / g.x % g.y << "," << bl / (g.x * g.y) << ")";
    }
    return s.str();
  }
  void report(const std::string& what, const void* pc) {
    if (found++ > 0) return;
    std::ostringstream s;
    s << what << "; the access is in " << function_at(pc) << " (pc " << pc << ")";
    first = s.str();
  }
  void conflict(const char* mine, const char* theirs, uint32_t other, const std::string& where,
                const void* pc) {
    report("race: " + thread_name(me) + " " + mine + " " + where + ", which " + thread_name(other) +
               " " + theirs +
               (other >> 10 != block_linear ? " in the same launch"
                                            : " with no __syncthreads() between"),
           pc);
  }
  // Shadow bookkeeping of one access of n bytes; where names the first byte for reports.
  // where() names the first byte, for reports only (made only when one is made).
  template <typename Where>
  void shadow(Shadow* s, size_t n, bool write, bool is_device, const Where& where, const void* pc) {
    const uint32_t floor = is_device ? lc->first_epoch : block_first;
    auto conflicts = [&](uint32_t e, uint32_t id) {
      return e >= floor && id != me && (e == epoch || (id >> 10) != block_linear);
    };
    bool reported = false;
    for (size_t i = 0; i < n; ++i, ++s) {
      if (!reported) {
        if (conflicts(s->write_epoch, s->writer)) {
          conflict(write ? "writes" : "reads", "wrote", s->writer, where(), pc);
          reported = true;
        } else if (write) {
          for (int r = 0; r < 2 && !reported; ++r)
            if (conflicts(s->read_epoch[r], s->reader[r])) {
              conflict("writes", "read", s->reader[r], where(), pc);
              reported = true;
            }
        } else if (!is_device && s->write_epoch < floor) {
          report("uninitialized read: " + thread_name(me) + " reads " + where() +
                     ", which no thread of this block has written",
                 pc);
          reported = true;
        }
      }
      if (write) {
        s->write_epoch = epoch, s->writer = me;
      } else {
        int slot = s->reader[0] == me ? 0 : s->reader[1] == me ? 1 : -1;
        if (slot < 0) slot = s->read_epoch[0] <= s->read_epoch[1] ? 0 : 1;
        s->read_epoch[slot] = epoch, s->reader[slot] = me;
      }
    }
  }
  static std::string bytes_at(size_t n, const std::string& what, size_t offset) {
    return std::to_string(n) + " bytes at " + what + " + " + std::to_string(offset);
  }
  void access(uintptr_t a, size_t n, bool write, const void* pc) {
    if (a < dyn_hi && a + n > dyn_lo) {
      const uintptr_t data = dyn_lo + kGuardBytes;
      if (a < data || a + n > data + dyn_bytes) {
        const long off = static_cast<long>(a) - static_cast<long>(data);
        report("out of bounds: " + thread_name(me) + (write ? " writes " : " reads ") +
                   std::to_string(n) + " bytes at offset " + std::to_string(off) +
                   " of dynamic shared memory (" + std::to_string(dyn_bytes) + " bytes)",
               pc);
        return;
      }
      shadow(
          &dyn_shadow[a - data], n, write, false,
          [&] { return bytes_at(n, "dynamic shared memory", a - data); }, pc);
    } else if (a < tls_hi && a + n > tls_lo) {
      const auto& vars = symbols().shared;
      const uintptr_t off = a - tls_base;
      auto it = std::upper_bound(vars.begin(), vars.end(), off,
                                 [](uintptr_t x, const Symbol& s) { return x < s.lo; });
      const Symbol* var = it == vars.begin() ? nullptr : &*std::prev(it);
      if (!var || off + n > var->hi || !lc->allowed[var - vars.data()]) {
        std::string near = var ? (off < var->hi ? "inside " : "past the end of ") + var->name
                               : std::string("before the first __shared__ array");
        report("out of bounds: " + thread_name(me) + (write ? " writes " : " reads ") +
                   std::to_string(n) + " bytes of static shared memory " + near,
               pc);
        return;
      }
      shadow(
          &tls_shadow[a - tls_lo], n, write, false,
          [&] { return bytes_at(n, var->name, off - var->lo); }, pc);
    } else if (lc->device) {
      const std::lock_guard lock(g_alloc_mutex);
      auto it = g_allocations.upper_bound(a);
      if (it == g_allocations.begin()) return;
      --it;
      Allocation& al = it->second;
      if (a >= it->first + al.bytes) return;
      if (al.shadow.empty()) al.shadow.resize(al.bytes);
      const size_t off = a - it->first;
      auto where = [&] {
        std::ostringstream w;
        w << n << " bytes at device allocation " << reinterpret_cast<void*>(it->first) << " + "
          << off;
        return w.str();
      };
      shadow(&al.shadow[off], std::min(n, al.bytes - off), write, true, where, pc);
    }
  }
};

thread_local Checker t_checker;
thread_local Checker* t_active = nullptr;  // null outside checked blocks

uintptr_t this_thread_tls_base() {
  void* block = nullptr;
  if (void* self = dlopen(nullptr, RTLD_LAZY)) {
    dlinfo(self, RTLD_DI_TLS_DATA, &block);
    dlclose(self);
  }
  return reinterpret_cast<uintptr_t>(block);
}

inline void hook(const void* p, size_t n, bool write, const void* pc) {
  if (Checker* c = t_active) c->access(reinterpret_cast<uintptr_t>(p), n, write, pc);
}

}  // namespace

std::string describe(const Launch& l, dim3 b) {
  std::ostringstream s;
  s << "kernel " << function_at(l.kernel) << ", launched at " << l.where.file_name() << ":"
    << l.where.line() << ", block (" << b.x << "," << b.y << "," << b.z << ")";
  return s.str();
}

LaunchChecks begin_launch(const Launch& launch) {
  LaunchChecks lc;
  lc.launch = launch;
  lc.on = checks() != Checks::Off;
  lc.device = checks() == Checks::SharedAndDevice;
  lc.first_epoch = g_epoch.fetch_add(1) + 1;
  if (!lc.on) return lc;
  lc.kernel = function_at(launch.kernel);
  std::set<std::string> launched;
  {
    const std::lock_guard lock(g_kernels_mutex);
    g_launched.insert(without_void(lc.kernel));
    launched = g_launched;
  }
  // A kernel may touch its own __shared__ arrays and those of the device functions it calls,
  // not another kernel's (an access running off the end of an array lands there). Kernels are
  // told from device functions by their names (*_kernel, as every kernel here is named) and by
  // having been launched.
  const auto& vars = symbols().shared;
  const std::string kernel = without_void(lc.kernel), kernel_template = template_of(kernel);
  lc.allowed.assign(vars.size(), 0);
  for (size_t i = 0; i < vars.size(); ++i) {
    const std::string owner = owner_of(vars[i].name), owner_template = template_of(owner);
    const bool a_kernel = owner_template.ends_with("_kernel") || launched.count(owner) > 0;
    lc.allowed[i] = owner == kernel || (!a_kernel && owner_template != kernel_template);
  }
  return lc;
}

void begin_block(const LaunchChecks& lc, dim3 block_idx, unsigned char* dynamic, size_t bytes) {
  if (!lc.on) return;
  Checker& c = t_checker;
  const dim3& g = lc.launch.grid;
  c.lc = &lc;
  c.block_linear = block_idx.x + g.x * (block_idx.y + g.y * block_idx.z);
  c.epoch = c.block_first = g_epoch.fetch_add(1) + 1;
  c.dyn_lo = reinterpret_cast<uintptr_t>(dynamic) - kGuardBytes;
  c.dyn_hi = reinterpret_cast<uintptr_t>(dynamic) + bytes + kGuardBytes;
  c.dyn_bytes = bytes;
  if (c.dyn_shadow.size() < bytes) c.dyn_shadow.resize(bytes);
  const auto& vars = symbols().shared;
  if (c.tls_base == 0 && !vars.empty()) {
    c.tls_base = this_thread_tls_base();
    if (c.tls_base != 0) {
      c.tls_lo = c.tls_base + vars.front().lo;
      for (const Symbol& v : vars) c.tls_hi = std::max(c.tls_hi, c.tls_base + v.hi);
      c.tls_shadow.assign(c.tls_hi - c.tls_lo, Shadow{});
    }
  }
  c.first.clear();
  c.found = 0;
  t_active = &c;
}

void set_thread(int linear) {
  Checker& c = t_checker;
  if (!c.lc) return;
  c.me = c.block_linear << 10 | static_cast<uint32_t>(linear);
}

void block_barrier() {
  t_checker.epoch = g_epoch.fetch_add(1) + 1;
}

std::string end_block() {
  t_active = nullptr;
  Checker& c = t_checker;
  c.lc = nullptr;
  if (c.found == 0) return "";
  std::string r = c.first;
  if (c.found > 1) r += " (and " + std::to_string(c.found - 1) + " more)";
  c.found = 0;
  return r;
}

void note_alloc(void* p, size_t bytes) {
  const std::lock_guard lock(g_alloc_mutex);
  g_allocations[reinterpret_cast<uintptr_t>(p)] = Allocation{bytes, {}};
}
void note_free(void* p) {
  const std::lock_guard lock(g_alloc_mutex);
  g_allocations.erase(reinterpret_cast<uintptr_t>(p));
}

}  // namespace check
}  // namespace omni::gpu::emulator

// ---- The hooks of GCC's -fsanitize=thread instrumentation ------------------------------------
// Not in the sanitizer build, whose kernels call none (and where GCC declares them otherwise).
#if !defined(__SANITIZE_ADDRESS__)
using omni::gpu::emulator::check::hook;
#define OMNI_PC __builtin_return_address(0)
extern "C" {
void __tsan_init() {}
void __tsan_func_entry(void*) {}
void __tsan_func_exit() {}
void __tsan_vptr_update(void**, void*) {}
void __tsan_vptr_read(void**) {}
void __tsan_read_range(void* p, unsigned long n) {
  hook(p, n, false, OMNI_PC);
}
void __tsan_write_range(void* p, unsigned long n) {
  hook(p, n, true, OMNI_PC);
}
#define OMNI_TSAN_ACCESS(N)                 \
  void __tsan_read##N(void* p) {            \
    hook(p, N, false, OMNI_PC);             \
  }                                         \
  void __tsan_write##N(void* p) {           \
    hook(p, N, true, OMNI_PC);              \
  }                                         \
  void __tsan_unaligned_read##N(void* p) {  \
    hook(p, N, false, OMNI_PC);             \
  }                                         \
  void __tsan_unaligned_write##N(void* p) { \
    hook(p, N, true, OMNI_PC);              \
  }                                         \
  void __tsan_volatile_read##N(void* p) {   \
    hook(p, N, false, OMNI_PC);             \
  }                                         \
  void __tsan_volatile_write##N(void* p) {  \
    hook(p, N, true, OMNI_PC);              \
  }
OMNI_TSAN_ACCESS(1)
OMNI_TSAN_ACCESS(2)
OMNI_TSAN_ACCESS(4)
OMNI_TSAN_ACCESS(8)
OMNI_TSAN_ACCESS(16)
#undef OMNI_TSAN_ACCESS

// Atomics: the operation itself, unchecked (exempt from the race check).
#define OMNI_TSAN_ATOMIC(N, T)                                                              \
  T __tsan_atomic##N##_load(const volatile T* a, int) {                                     \
    return __atomic_load_n(a, __ATOMIC_SEQ_CST);                                            \
  }                                                                                         \
  void __tsan_atomic##N##_store(volatile T* a, T v, int) {                                  \
    __atomic_store_n(a, v, __ATOMIC_SEQ_CST);                                               \
  }                                                                                         \
  T __tsan_atomic##N##_exchange(volatile T* a, T v, int) {                                  \
    return __atomic_exchange_n(a, v, __ATOMIC_SEQ_CST);                                     \
  }                                                                                         \
  T __tsan_atomic##N##_fetch_add(volatile T* a, T v, int) {                                 \
    return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST);                                      \
  }                                                                                         \
  T __tsan_atomic##N##_fetch_sub(volatile T* a, T v, int) {                                 \
    return __atomic_fetch_sub(a, v, __ATOMIC_SEQ_CST);                                      \
  }                                                                                         \
  T __tsan_atomic##N##_fetch_and(volatile T* a, T v, int) {                                 \
    return __atomic_fetch_and(a, v, __ATOMIC_SEQ_CST);                                      \
  }                                                                                         \
  T __tsan_atomic##N##_fetch_or(volatile T* a, T v, int) {                                  \
    return __atomic_fetch_or(a, v, __ATOMIC_SEQ_CST);                                       \
  }                                                                                         \
  T __tsan_atomic##N##_fetch_xor(volatile T* a, T v, int) {                                 \
    return __atomic_fetch_xor(a, v, __ATOMIC_SEQ_CST);                                      \
  }                                                                                         \
  int __tsan_atomic##N##_compare_exchange_strong(volatile T* a, T* c, T v, int, int) {      \
    return __atomic_compare_exchange_n(a, c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST); \
  }                                                                                         \
  int __tsan_atomic##N##_compare_exchange_weak(volatile T* a, T* c, T v, int, int) {        \
    return __atomic_compare_exchange_n(a, c, v, true, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);  \
  }                                                                                         \
  T __tsan_atomic##N##_compare_exchange_val(volatile T* a, T c, T v, int, int) {            \
    __atomic_compare_exchange_n(a, &c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);       \
    return c;                                                                               \
  }
OMNI_TSAN_ATOMIC(8, char)
OMNI_TSAN_ATOMIC(16, short)
OMNI_TSAN_ATOMIC(32, int)
OMNI_TSAN_ATOMIC(64, long)
#undef OMNI_TSAN_ATOMIC
void __tsan_atomic_thread_fence(int) {
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
}
void __tsan_atomic_signal_fence(int) {}
}
#endif
