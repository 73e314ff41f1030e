// The optimizer zoo on the GPU (backend/gpu/zoo_optimizer.cu; Muon's Newton-Schulz through
// the GPU's GEMM) against the same Optimizer<float> on the CPU, the reference: three steps with
// new gradients each step on tensors with and without weight decay, every parameter and state
// within 1e-5 (relative) plus 1e-7. LAMB's norms and Muon's products are sums in another
// order there; the element-wise updates are the same float arithmetic.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "gpu/gpu_test.h"
#include "optim/optimizer.h"
#include "optim/optimizer_zoo.h"

namespace omni::gpu_test {
namespace {

// Muon orthogonalises the wide QKV (three parts), the tall fc1 and each of two experts' fc2;
// the rest take AdamW.
std::vector<ParamInfo> infos() {
  return {{"decoder.layers.0.self_attention.linear_qkv.weight", {16, 20}},
          {"decoder.layers.0.mlp.linear_fc1.weight", {24, 10}},
          {"decoder.layers.1.mlp.experts.linear_fc2.weight", {2, 6, 8}},
          {"decoder.layers.0.mlp.linear_fc1.bias", {24}, ParamInit::Zeros, false},
          {"decoder.final_layernorm.weight", {37}, ParamInit::Ones, false}};
}

std::vector<float> device_to_host(const ops::Exec& x, const float* p, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  ops::download(x, out.data(), p, out.size());
  return out;
}

TEST(GpuOptimizerZoo, ElementwiseStepsMatchCpu) {
  OMNI_REQUIRE_GPU();
  const ops::Exec gpu{&gpu::backend()};
  for (OptimizerKind kind :
       {OptimizerKind::Lamb, OptimizerKind::Lion, OptimizerKind::SophiaG,
        OptimizerKind::AdamWScheduleFree, OptimizerKind::SGDScheduleFree, OptimizerKind::Muon}) {
    OptimizerConfig c;
    c.kind = kind;
    c.weight_decay = 0.1;
    c.zoo.schedulefree_warmup_steps = 2;
    c.zoo.qkv_split_shapes = {4, 2, 2};  // Muon: the QKV matrix's query, key and value rows
    ParameterSet<float> cpu(infos()),
        dev(infos(), ::omni::Device{DeviceKind::CUDA, 0}, gpu.memory());
    const std::vector<float> start = random_vector(size_t(cpu.size()), 7, -0.5f, 0.5f);
    std::copy(start.begin(), start.end(), cpu.values());
    ops::upload(gpu, dev.values(), start.data(), start.size());
    Optimizer<float> on_cpu(c, cpu), on_gpu(c, dev, gpu);
    for (int step = 0; step < 3; ++step) {
      const std::vector<float> g = random_vector(size_t(cpu.size()), 100 + step, -0.1f, 0.1f);
      std::copy(g.begin(), g.end(), cpu.grads());
      ops::upload(gpu, dev.grads(), g.data(), g.size());
      on_cpu.step(cpu, 1e-2);
      on_gpu.step(dev, 1e-2);
    }
    const std::string name = zoo_optimizer_name(kind);
    const std::vector<float> want(cpu.values(), cpu.values() + cpu.size());
    EXPECT_TRUE(close(device_to_host(gpu, dev.values(), dev.size()), want, 1e-5, 1e-7)) << name;
    for (const std::string& s : on_cpu.state_names()) {
      const float* w = on_cpu.state_buffer(s);
      EXPECT_TRUE(close(device_to_host(gpu, on_gpu.state_buffer(s), dev.size()),
                        std::vector<float>(w, w + cpu.size()), 1e-5, 1e-7))
          << name << " " << s;
    }
    for (const std::string& s : on_cpu.scalar_names())
      EXPECT_EQ(on_gpu.scalar(s), on_cpu.scalar(s)) << name << " " << s;
  }
}

// adam8bit's kernel (backend/gpu/zoo_adam8bit.cu) runs the CPU's arithmetic
// (backend/zoo_adam8bit_math.h): blocks of 16 that end inside tensors and a partial last
// block, fp32 moments for the small tensors, a non-finite gradient, and a checkpoint's views
// written back between steps (as a resume does). The emulator compiles that arithmetic as the
// CPU does, so there everything is bit-identical; a real GPU may contract a multiply-add, so
// there a code index may differ by one and the weights by a float rounding.
TEST(GpuOptimizerZoo, Adam8bitMatchesCpu) {
  OMNI_REQUIRE_GPU();
  const ops::Exec gpu{&gpu::backend()};
  OptimizerConfig c;
  c.kind = OptimizerKind::Adam8bit;
  c.weight_decay = 0.1;
  c.zoo.adam8bit_block_size = 16;
  c.zoo.adam8bit_min_8bit_size = 200;  // the two matrices 8-bit, the rest fp32
  ParameterSet<float> cpu(infos()), dev(infos(), ::omni::Device{DeviceKind::CUDA, 0}, gpu.memory());
  const std::vector<float> start = random_vector(size_t(cpu.size()), 7, -0.5f, 0.5f);
  std::copy(start.begin(), start.end(), cpu.values());
  ops::upload(gpu, dev.values(), start.data(), start.size());
  Optimizer<float> on_cpu(c, cpu), on_gpu(c, dev, gpu);
  const size_t n = size_t(cpu.size());
  for (int step = 0; step < 4; ++step) {
    std::vector<float> g = random_vector(n, 100 + step, -0.1f, 0.1f);
    if (step == 1) g[5] = std::numeric_limits<float>::infinity();
    std::copy(g.begin(), g.end(), cpu.grads());
    ops::upload(gpu, dev.grads(), g.data(), g.size());
    on_cpu.step(cpu, 1e-2);
    on_gpu.step(dev, 1e-2);
    if (step != 1) continue;
    for (const std::string& s : on_gpu.state_names()) {  // a checkpoint's round trip
      std::vector<float> saved = device_to_host(gpu, on_gpu.state_buffer(s), dev.size());
      ops::upload(gpu, on_gpu.state_buffer(s), saved.data(), saved.size());
    }
  }
#if defined(OMNITRON_GPU_EMULATE)
  const bool emulated = true;
#else
  const bool emulated = false;
#endif
  const std::vector<float> want(cpu.values(), cpu.values() + n);
  const std::vector<float> got = device_to_host(gpu, dev.values(), dev.size());
  if (emulated)
    EXPECT_EQ(got, want);
  else
    EXPECT_TRUE(close(got, want, 1e-5, 1e-7));
  for (const std::string& s : on_cpu.state_names()) {
    const float* w = on_cpu.state_buffer(s);
    const std::vector<float> cpu_state(w, w + n);
    const std::vector<float> gpu_state = device_to_host(gpu, on_gpu.state_buffer(s), dev.size());
    if (emulated) {
      EXPECT_EQ(gpu_state, cpu_state) << s;
      continue;
    }
    for (size_t i = 0; i < n; ++i)  // codes within one, maxima and fp32 moments close
      EXPECT_LE(std::fabs(gpu_state[i] - cpu_state[i]), 1.0f + 1e-5f * std::fabs(cpu_state[i]))
          << s << " " << i;
  }
}

// GaLore and Shampoo on the GPU (products through the GPU's GEMM, element-wise steps in the
// zoo's kernels, the SVD and the inverse roots on the host) against the CPU. GaLore: rank 4,
// new projections at steps 1 and 3, both matrices projected (one from each side), the 8-bit
// variant's low-rank moments quantised in blocks of 16. Shampoo: blocks of at most 12 (the
// matrices and vectors cut), roots and preconditioning from step 2, an epsilon that keeps
// the roots of the rank-deficient factors well conditioned. The GEMMs sum in another order,
// which may move an 8-bit code by one.
TEST(GpuOptimizerZoo, GaLoreAndShampooMatchCpu) {
  OMNI_REQUIRE_GPU();
  const ops::Exec gpu{&gpu::backend()};
  for (OptimizerKind kind :
       {OptimizerKind::GaLoreAdamW, OptimizerKind::GaLoreAdamW8bit, OptimizerKind::Shampoo}) {
    OptimizerConfig c;
    c.kind = kind;
    c.weight_decay = 0.1;
    c.zoo.galore_rank = 4, c.zoo.galore_update_proj_gap = 2, c.zoo.galore_scale = 0.5;
    c.zoo.adam8bit_block_size = 16, c.zoo.adam8bit_min_8bit_size = 32;
    c.zoo.shampoo_update_freq = 2, c.zoo.shampoo_max_preconditioner_dim = 12;
    c.zoo.shampoo_eps = 1e-3;
    ParameterSet<float> cpu(infos()),
        dev(infos(), ::omni::Device{DeviceKind::CUDA, 0}, gpu.memory());
    const std::vector<float> start = random_vector(size_t(cpu.size()), 7, -0.5f, 0.5f);
    std::copy(start.begin(), start.end(), cpu.values());
    ops::upload(gpu, dev.values(), start.data(), start.size());
    Optimizer<float> on_cpu(c, cpu), on_gpu(c, dev, gpu);
    for (int step = 0; step < 4; ++step) {
      const std::vector<float> g = random_vector(size_t(cpu.size()), 100 + step, -0.1f, 0.1f);
      std::copy(g.begin(), g.end(), cpu.grads());
      ops::upload(gpu, dev.grads(), g.data(), g.size());
      on_cpu.step(cpu, 1e-2);
      on_gpu.step(dev, 1e-2);
    }
    const std::string name = zoo_optimizer_name(kind);
    const double tol = kind == OptimizerKind::GaLoreAdamW8bit ? 1e-4 : 1e-5;
    const std::vector<float> want(cpu.values(), cpu.values() + cpu.size());
    EXPECT_TRUE(close(device_to_host(gpu, dev.values(), dev.size()), want, tol, 1e-6)) << name;
    for (const std::string& s : on_cpu.state_names()) {
      if (s.rfind("state", 0) == 0) continue;  // 8-bit codes: the weights say they agree
      const float* w = on_cpu.state_buffer(s);
      EXPECT_TRUE(close(device_to_host(gpu, on_gpu.state_buffer(s), dev.size()),
                        std::vector<float>(w, w + cpu.size()), tol, 1e-6))
          << name << " " << s;
    }
  }
}

}  // namespace
}  // namespace omni::gpu_test
