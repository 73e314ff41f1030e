// The optimizer zoo's element-wise steps (Lion, SophiaG, schedule-free AdamW and SGD, LAMB's
// two passes, Muon's momentum and update): per element the float arithmetic of
// optim/zoo_elementwise.cpp and zoo_muon.cpp, which cite each algorithm's paper and reference
// implementation; GaLore's and Shampoo's element-wise parts (zoo_galore.cpp, zoo_shampoo.cpp);
// and the float GEMM of Muon's Newton-Schulz iteration. One grid-stride kernel; the
// kind is uniform over the launch, so the switch does not diverge.
#include "backend/gpu/blas.h"
#include "backend/gpu/gpu_ops.h"
#include "backend/gpu/gpu_runtime.h"
#include "backend/gpu/vectorized.h"

OMNI_GPU_NAMESPACE_BEGIN
namespace {

OMNI_DEVICE float sign_of(float x) {
  return static_cast<float>((x > 0.0f) - (x < 0.0f));
}

__global__ void zoo_kernel(ops::ZooStep c, float* w, const float* g, float* s0, float* s1,
                           float* s2, size_t n) {
  const size_t stride = size_t{gridDim.x} * blockDim.x;
  for (size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float grad = g[i];
    switch (c.kind) {
      case ops::ZooUpdate::Lion: {  // s0: exp_avg
        const float m = s0[i];
        const float u = c.beta1 * m + (1.0f - c.beta1) * grad;
        w[i] = w[i] * c.decay - c.lr * sign_of(u);
        s0[i] = c.beta2 * m + (1.0f - c.beta2) * grad;
        break;
      }
      case ops::ZooUpdate::SophiaG: {  // s0: exp_avg, s1: hessian
        float x = w[i] * c.decay;
        const float m = s0[i] * c.beta1 + (1.0f - c.beta1) * grad;
        s0[i] = m;
        const float am = m < 0.0f ? -m : m;
        float ratio = am / (c.rho_bs * s1[i] + 1e-15f);
        if (1.0f < ratio) ratio = 1.0f;  // std::min(ratio, 1)
        x -= c.lr * sign_of(m) * ratio;
        w[i] = x;
        break;
      }
      case ops::ZooUpdate::SGDScheduleFree: {  // s0: z, s1: x; w is y
        const float y = w[i];
        const float z = s0[i] - c.lr * (grad + c.wd * y);
        const float x = s1[i] * (1.0f - c.ckp1) + z * c.ckp1;
        s0[i] = z, s1[i] = x;
        w[i] = x * c.beta1 + z * (1.0f - c.beta1);
        break;
      }
      case ops::ZooUpdate::AdamWScheduleFree: {  // s0: z, s1: x, s2: exp_avg_sq; w is y
        float z = s0[i];
        z -= c.lr * c.wd * w[i];
        const float v = s2[i] * c.beta2 + (1.0f - c.beta2) * grad * grad;
        z -= c.lr * (grad / (sqrtf(v / c.bc2) + c.eps));
        const float x = s1[i] * (1.0f - c.ckp1) + z * c.ckp1;
        s0[i] = z, s1[i] = x, s2[i] = v;
        w[i] = x * c.beta1 + z * (1.0f - c.beta1);
        break;
      }
      case ops::ZooUpdate::LambMoments: {  // s0: exp_avg, s1: exp_avg_sq, s2 := u
        const float m = c.beta1 * s0[i] + (1.0f - c.beta1) * grad;
        const float v = c.beta2 * s1[i] + (1.0f - c.beta2) * grad * grad;
        s0[i] = m, s1[i] = v;
        s2[i] = m / (sqrtf(v) + c.eps) + c.wd * w[i];
        break;
      }
      case ops::ZooUpdate::LambApply:  // s0: exp_avg, s1: exp_avg_sq
        w[i] -= c.scale * (s0[i] / (sqrtf(s1[i]) + c.eps) + c.wd * w[i]);
        break;
      case ops::ZooUpdate::MuonMomentum: {  // s0: exp_avg, s2 := the update to orthogonalise
        if (c.decay != 0.0f) w[i] += c.decay * w[i];
        const float m = s0[i] + c.beta2 * (grad - s0[i]);
        s0[i] = m;
        s2[i] = c.scale != 0.0f ? grad + c.beta1 * (m - grad) : m;
        break;
      }
      case ops::ZooUpdate::MuonApply:  // s0: the orthogonalised update
        w[i] -= c.lr * s0[i];
        break;
      case ops::ZooUpdate::GaLoreAdam: {  // s0: exp_avg, s1: exp_avg_sq, s2 := the direction
        const float m = s0[i] * c.beta1 + c.ckp1 * grad;
        const float v = s1[i] * c.beta2 + c.rho_bs * grad * grad;
        s0[i] = m, s1[i] = v;
        s2[i] = m / (sqrtf(v) + c.eps);
        break;
      }
      case ops::ZooUpdate::GaLoreApply:  // s0: the update projected back
        w[i] += c.scale * s0[i];
        if (c.wd > 0.0f) w[i] += c.decay * w[i];
        break;
      case ops::ZooUpdate::Ema:  // s0: a Shampoo factor, g: this step's G G^T or G^T G
        s0[i] = c.beta2 * s0[i] + c.scale * grad;
        break;
      case ops::ZooUpdate::ShampooMoments: {  // s0: exp_avg, s1: exp_avg_sq, s2 := M^, w := A
        const float m = c.beta1 * s0[i] + c.ckp1 * grad;
        const float v = c.beta2 * s1[i] + c.rho_bs * grad * grad;
        s0[i] = m, s1[i] = v;
        const float mhat = m * c.bc1;
        s2[i] = mhat;
        w[i] = mhat / (sqrtf(v * c.bc2) + c.eps);
        break;
      }
      case ops::ZooUpdate::ShampooApply:  // s0: the direction (times scale: grafting)
        w[i] -= c.lr * (s0[i] * c.scale + c.wd * w[i]);
        break;
    }
  }
}

}  // namespace

void zoo_update(const ops::ZooStep& step, float* w, const float* g, float* s0, float* s1, float* s2,
                size_t n, Stream stream) {
  if (n == 0) return;
  launch(zoo_kernel, grid_for(n), kThreads, 0, static_cast<gpuStream_t>(stream), step, w, g, s0, s1,
         s2, n);
}

void gemm_f32(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
              const float* B, int ldb, float beta, float* C, int ldc, Stream stream) {
  blas::GemmProblem p;
  p.M = M, p.N = N, p.K = K, p.trans_a = trans_a, p.trans_b = trans_b;
  p.A = A, p.lda = lda, p.B = B, p.ldb = ldb, p.D = C, p.ldd = ldc;
  p.alpha = alpha, p.beta = beta;
  blas::gemm(p, stream);
}

OMNI_GPU_NAMESPACE_END
