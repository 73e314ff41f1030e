#include <cblas.h>
#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "backend/device.h"
#include "backend/ops.h"

extern "C" char* openblas_get_config(void);
extern "C" char* openblas_get_corename(void);

namespace omni {

namespace {
constexpr const char* kIdleSpinCount = "5000";

// The machine's busy cores over a 50 ms look at /proc/stat (this process sleeps through it):
// under half a core busy is idle. Unknown (no /proc/stat) counts as busy.
bool machine_is_idle() {
  auto busy_and_total = [](double& busy, double& total) {
    std::ifstream in("/proc/stat");
    std::string cpu;
    double v[8] = {};
    if (!(in >> cpu) || cpu != "cpu") return false;
    for (double& x : v)
      if (!(in >> x)) return false;
    // user nice system idle iowait irq softirq steal
    busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
    total = busy + v[3] + v[4];
    return true;
  };
  double b0 = 0, t0 = 0, b1 = 0, t1 = 0;
  if (!busy_and_total(b0, t0)) return false;
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  if (!busy_and_total(b1, t1) || t1 <= t0) return false;
  const long cores = std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
  return (b1 - b0) / (t1 - t0) * double(cores) < 0.5;
}
}  // namespace

void ensure_runtime_environment(char** argv) {
  bool changed = false;
  // Some machines preset OPENBLAS_CORETYPE=Haswell for old OpenBLAS builds; on an AVX-512
  // CPU that costs 4x in sgemm (98 vs 430 GFLOP/s measured on a 2-core EPYC). A value
  // naming any other kernel set is the user's choice and is kept, as is any value when
  // OMNITRON_KEEP_OPENBLAS_CORETYPE is set.
  const char* preset = std::getenv("OPENBLAS_CORETYPE");
  if (!std::getenv("OMNITRON_KEEP_OPENBLAS_CORETYPE") &&
      (!preset || std::string(preset) == "Haswell")) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) {
      setenv("OPENBLAS_CORETYPE", "SkylakeX", 1);
      setenv("OMNITRON_KEEP_OPENBLAS_CORETYPE", "1", 1);  // never loop
      changed = true;
    }
  }
  // How idle OpenMP threads wait. libgomp's default lets a thread that finished its share
  // spin for ~300k rounds (7 ms here) before it sleeps; a step runs about a thousand parallel
  // regions, and on a machine with as many busy threads as cores (another job, the data
  // prefetch thread) the spinning worker holds the core its partner needs: a 2-layer, 64-wide
  // model took 1 s per step with 2 threads and 20 ms with 1 on a loaded 2-core machine. A
  // worker that sleeps at once, though, is woken for every region, which on an idle virtual
  // machine costs tens of microseconds each: the 6-layer benchmark ran 2-3 % slower waiting
  // passively than spinning 5000 rounds (125 us) first (three alternating runs each), and
  // that 2-layer model 9.8 against 2.9 ms per step. So: a short spin when the machine is
  // idle as omnitron starts, passive waiting when other work is running (one busy process
  // beside it: 7 ms passive, 16-37 ms spinning). The user's own OMP_WAIT_POLICY or
  // GOMP_SPINCOUNT is kept.
  if (!std::getenv("OMP_WAIT_POLICY") && !std::getenv("GOMP_SPINCOUNT")) {
    if (machine_is_idle()) {
      setenv("GOMP_SPINCOUNT", kIdleSpinCount, 1);
      setenv("OMNITRON_SPIN_CHOSEN", "1", 1);  // for openmp_wait_policy()'s words
    } else {
      setenv("OMP_WAIT_POLICY", "passive", 1);
    }
    changed = true;
  }
  // How many threads each rank runs. mpirun binds each rank to its own cores when they fit,
  // and OpenMP then starts a thread per core of the rank's mask; with more ranks than cores
  // (--oversubscribe), or a launcher that binds none, every rank would start a thread per core
  // of the node: 4 ranks x 2 threads on 2 cores. Unbound ranks then take an equal share of the
  // cores they see, at least one (torchrun sets 1 for its ranks). The user's OMP_NUM_THREADS
  // is kept. Slurm's count is left out: SLURM_NTASKS_PER_NODE is set in a batch script too,
  // where one process runs (and srun binds its tasks by default).
  std::string source;
  const int ranks = launcher_local_size(&source);
  if (!std::getenv("OMP_NUM_THREADS") && !source.starts_with("SLURM_")) {
    cpu_set_t mask;
    CPU_ZERO(&mask);
    const long online = std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
    const int usable = sched_getaffinity(0, sizeof mask, &mask) == 0 ? CPU_COUNT(&mask) : 0;
    if (ranks > 1 && usable > 0 && long(usable) * ranks > online) {
      const std::string share = std::to_string(std::max(1, usable / ranks));
      setenv("OMP_NUM_THREADS", share.c_str(), 1);
      setenv("OMNITRON_THREADS_CHOSEN", (std::to_string(usable) + " cores shared by " +
                                         std::to_string(ranks) + " ranks on this node")
                                            .c_str(),
             1);
      changed = true;
    }
  }
  // All are read when the libraries load, before main: only a fresh start applies them.
  if (changed) execv("/proc/self/exe", argv);  // returns only on failure: carry on as is
}

std::string openmp_wait_policy() {
  if (const char* spin = std::getenv("GOMP_SPINCOUNT"))
    return std::string("GOMP_SPINCOUNT=") + spin +
           (std::getenv("OMNITRON_SPIN_CHOSEN") && std::string(spin) == kIdleSpinCount
                ? ": a short spin, the machine was idle at start"
                : "");
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  return policy ? std::string(policy) : "libgomp's default (spin, then sleep)";
}

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

int cpu_threads() {
  return omp_get_max_threads();
}

std::string cpu_threads_reason() {
  const char* why = std::getenv("OMNITRON_THREADS_CHOSEN");
  return why ? why : "";
}

std::string blas_config() {
  return std::string(openblas_get_config()) + " (kernels: " + openblas_get_corename() + ")";
}

double measure_gemm_gflops(int n, int reps) {
  std::vector<float> a(size_t(n) * n, 0.5f), b(size_t(n) * n, 0.25f), c(size_t(n) * n);
  ops::gemm<float>(false, false, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n);
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    ops::gemm<float>(false, false, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n);
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return 2.0 * n * n * double(n) / best / 1e9;
}

}  // namespace omni
