// The machines `omnitron plan` knows: accelerators by their vendors' published figures, and
// this machine's CPU as measured.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "backend/cpu/gemm.h"
#include "backend/device.h"
#include "backend/ops.h"
#include "base/error.h"
#include "train/plan.h"

namespace omni {

namespace {

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// One rank per GPU (per GCD on MI250X, which its runtime shows as two devices). Link figures
// are per direction: NVLink's and Infinity Fabric's "total bandwidth" is both directions
// summed, so half of it; the network is the node's NICs shared by its ranks.
// compute_efficiency 0.55 (the AMD rows' matrix products, and --compute-efficiency's default
// meaning before this table had a curve): Narayanan et al. 2021 (arXiv 2104.04473) Table 1
// reaches 44-52 % of A100 peak overall; link_efficiency 0.8: the bus bandwidth nccl-tests and
// rccl-tests typically report against the link rate.
std::vector<PlanDevice> gpu_table() {
  auto gpu = [](std::string name, std::string description, double bf16, double fp32,
                double memory_gib, double hbm, double intra, double inter, int per_node,
                std::string source) {
    PlanDevice d;
    d.name = std::move(name), d.description = std::move(description);
    d.bf16_tflops = bf16, d.fp32_tflops = fp32, d.memory_gib = memory_gib, d.hbm_gbps = hbm;
    d.intra_gbps = intra, d.inter_gbps = inter, d.ranks_per_node = per_node;
    d.source = std::move(source);
    return d;
  };
  constexpr double kGB = 1e9 / 1073741824.0;  // vendors' GB in GiB
  // Matrix products by size (GFLOP per product, fraction of the dense peak). Below 16 GFLOP,
  // Calculon's A100/H100 steps (Isaev et al., SC'23; calculon-ai/calculon systems/
  // a100_80g.json): 0.6 from 1 GFLOP, 0.1 below. Above, 0.7: the rate that, with the memory
  // traffic and communication counted separately, fits both the smallest and the largest row
  // of Narayanan et al. 2021, Table 1 (1.7 B and 1 T on A100s; docs/plan.md) -- the one
  // figure here fitted to published throughput, not taken from a data sheet. H100, H200 and
  // B200 take the A100's curve unchanged (an extrapolation: no published row checks it), also
  // for flash attention's products. The AMD rows keep one fraction (compute_efficiency) for
  // every size.
  const std::vector<std::pair<double, double>> nvidia = {{16, 0.7}, {1, 0.6}, {0, 0.1}};
  auto curved = [&](PlanDevice d) {
    d.gemm_efficiency = nvidia;
    return d;
  };
  auto amd = [](PlanDevice d) {
    d.gemm_efficiency = {{0, d.compute_efficiency}};
    return d;
  };
  return {
      // NVIDIA H100 Tensor Core GPU datasheet (SXM5): BF16 1,979 TFLOPS with sparsity, FP32
      // 67 TFLOPS, 80 GB HBM3 at 3.35 TB/s, NVLink 900 GB/s; DGX H100: 8x ConnectX-7 400 Gb/s.
      curved(gpu("H100", "NVIDIA H100 SXM5 80GB", 989.5, 67, 80 * kGB, 3350, 450, 50, 8,
                 "NVIDIA H100 datasheet (SXM5); DGX H100 400 Gb/s per GPU")),
      // NVIDIA H200 Tensor Core GPU datasheet (SXM): the H100's compute, 141 GB HBM3e at
      // 4.8 TB/s, NVLink 900 GB/s; 400 Gb/s per GPU in HGX H200 systems.
      curved(gpu("H200", "NVIDIA H200 SXM 141GB", 989.5, 67, 141 * kGB, 4800, 450, 50, 8,
                 "NVIDIA H200 datasheet (SXM); 400 Gb/s per GPU")),
      // NVIDIA HGX B200 / DGX B200 datasheets: FP16/BF16 4.5 PFLOPS per GPU with sparsity,
      // 1,440 GB of HBM3e and 62 TB/s across 8 GPUs, NVLink 5 1.8 TB/s per GPU, 400 Gb/s
      // ConnectX-7 per GPU; FP32 75 TFLOPS (Blackwell technical brief, HGX power level).
      curved(gpu("B200", "NVIDIA B200 (HGX) 180GB", 2250, 75, 180 * kGB, 7700, 900, 50, 8,
                 "NVIDIA HGX/DGX B200 datasheets")),
      // NVIDIA A100 Tensor Core GPU datasheet (SXM4 80GB): BF16 312 TFLOPS dense, FP32 19.5,
      // 80 GB HBM2e at 2,039 GB/s, NVLink 600 GB/s; DGX A100: 8x HDR 200 Gb/s.
      curved(gpu("A100", "NVIDIA A100 SXM4 80GB", 312, 19.5, 80 * kGB, 2039, 300, 25, 8,
                 "NVIDIA A100 datasheet (SXM4 80GB); DGX A100 200 Gb/s per GPU")),
      // AMD Instinct MI250X data sheet: 383 TFLOPS BF16, 95.7 TFLOPS FP32 matrix, 128 GB HBM2e
      // at 3.2 TB/s per module of two GCDs (one rank each, so half of each); GCDs joined by
      // 50 GB/s Infinity Fabric links; Frontier's node: 4x Slingshot 200 Gb/s for 8 GCDs.
      amd(gpu("MI250X", "AMD Instinct MI250X, one GCD (64GB)", 191.5, 47.85, 64 * kGB, 1600, 50,
              12.5, 8,
              "AMD Instinct MI250X data sheet (per GCD: half a module); Frontier node network")),
      // AMD Instinct MI300X data sheet: 1,307.4 TFLOPS BF16 dense, 163.4 TFLOPS FP32, 192 GB
      // HBM3 at 5.3 TB/s, 7 Infinity Fabric links of 128 GB/s (both directions); 400 Gb/s NIC
      // per GPU in 8-GPU platforms.
      amd(gpu("MI300X", "AMD Instinct MI300X 192GB", 1307.4, 163.4, 192 * kGB, 5300, 448, 50, 8,
              "AMD Instinct MI300X data sheet; 400 Gb/s per GPU")),
      // AMD Instinct MI325X data sheet: the MI300X's compute and links, 256 GB HBM3E at 6 TB/s.
      amd(gpu("MI325X", "AMD Instinct MI325X 256GB", 1307.4, 163.4, 256 * kGB, 6000, 448, 50, 8,
              "AMD Instinct MI325X data sheet; 400 Gb/s per GPU")),
  };
}

// GB/s of one large memcpy (the best of a few): what a shared-memory MPI transfer moves, twice.
double measure_copy_gbps() {
  const size_t n = size_t(64) << 20;
  std::vector<char> a(n, 1), b(n, 0);
  double best = 1e30;
  for (int r = 0; r < 4; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(b.data(), a.data(), n);
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return 2.0 * double(n) / best / 1e9;  // read and write
}

// Billions of dropout mask elements per second: the hidden dropout op on a 4M-element buffer
// (the best of a few), which draws its Philox words as the CPU attention kernel draws those
// of the attention probabilities.
double measure_dropout_gelems() {
  const int rows = 1024, width = 4096;
  std::vector<float> x(size_t(rows) * width, 1.f);
  const ops::DropoutKey k = ops::dropout_key(0.1, 1234, 0, 0, ops::DropoutSite::MlpOutput);
  ops::dropout<float>(x.data(), rows, width, rows, k);
  double best = 1e30;
  for (int r = 0; r < 3; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    ops::dropout<float>(x.data(), rows, width, rows, k);
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return double(rows) * width / best / 1e9;
}

double host_memory_gib() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  long long kb = 0;
  while (in >> key >> kb) {
    if (key == "MemTotal:") return double(kb) / (1024.0 * 1024.0);
    in.ignore(1 << 10, '\n');
  }
  return 0;
}

PlanDevice measured_cpu(int ranks_on_host) {
  PlanDevice d;
  const int ranks = std::max(1, ranks_on_host), threads = cpu_threads();
  // Each rank gets threads / ranks of the cores (one each when there are more ranks than
  // cores, then shared): the sgemm and mask rates are measured with that many threads, since
  // one thread does more than half of what two do (a step at one thread took 1.8x the time
  // at two here).
  const int per_rank = std::max(1, threads / ranks);
  const double share = ranks > threads ? double(threads) / ranks : 1.0;
  omp_set_num_threads(per_rank);
  const double gflops = measure_gemm_gflops() * share;
  double bf16_gflops = 0;
  {
    ops::CpuBf16Gemms bf16_gemms;  // --bf16's GEMMs (backend/cpu/gemm.h)
    bf16_gflops = measure_gemm_gflops() * share;
  }
  const double masks = measure_dropout_gelems() * share;
  omp_set_num_threads(threads);
  const double copy = measure_copy_gbps();
  d.name = "cpu";
  d.description = cpu_model_name() + ", " + std::to_string(threads) + " threads";
  // The CPU backend stores 16-bit values as fp32; --bf16 multiplies in bf16 (oneDNN where the
  // CPU has bf16 instructions), --fp16 in fp32 (plan.cpp takes fp32_tflops for it here).
  d.fp32_tflops = gflops / 1000.0;
  d.bf16_tflops = bf16_gflops / 1000.0;
  d.memory_gib = host_memory_gib() / ranks;
  d.hbm_gbps = copy / ranks;
  d.dropout_gelems = masks;
  d.intra_gbps = copy / 4;  // MPI's shared memory copies into a segment and out of it
  d.inter_gbps = 12.5;      // an assumed 100 Gb/s Ethernet to another host
  d.ranks_per_node = ranks;
  // `omnitron train` reports 85-100 % MFU against this same sgemm rate for a 6-layer model
  // of hidden size 512 (docs/plan.md has the runs): the layers' matrix products dominate.
  // Under --bf16 its elementwise work (fp32 storage, bf16 copies of the operands) weighs more
  // against GEMMs twice as fast: bench_train_step --bf16's 6-layer rows run at 0.62-0.72 of
  // the bf16 GEMM's rate.
  d.compute_efficiency = 0.85;
  d.bf16_compute_efficiency = 0.7;
  d.link_efficiency = 1.0;  // measured, not a nominal rate
  d.host_memory = true;
  char text[320];
  std::snprintf(text, sizeof text,
                "measured now, per rank at %d thread%s: sgemm %.0f GFLOP/s, bf16 GEMM %.0f "
                "GFLOP/s, dropout masks %.2f G elements/s; copy %.1f GB/s and %.1f GiB of memory "
                "shared by %d rank%s; network assumed 100 Gb/s",
                per_rank, per_rank == 1 ? "" : "s", gflops, bf16_gflops, masks, copy,
                host_memory_gib(), ranks, ranks == 1 ? "" : "s");
  d.source = text;
  return d;
}

}  // namespace

std::vector<std::string> plan_device_names() {
  std::vector<std::string> names;
  for (const PlanDevice& d : gpu_table()) names.push_back(d.name);
  names.push_back("cpu");
  return names;
}

PlanDevice plan_device(const std::string& name, int ranks_on_host) {
  const std::string want = lower(name);
  if (want == "cpu") return measured_cpu(ranks_on_host);
  for (const PlanDevice& d : gpu_table())
    if (lower(d.name) == want) return d;
  std::string known;
  for (const std::string& n : plan_device_names()) known += (known.empty() ? "" : ", ") + n;
  throw UsageError("--machine '" + name + "': not a device plan knows (" + known + ")");
}

}  // namespace omni
