// The mixture-of-experts ops on the GPU (backend/gpu/moe_*.cu) through their op seam
// (backend/moe_ops.h's ops::X(exec, ...)) against the CPU's (backend/cpu/moe_*.cpp), float.
//
// Tolerances. The router's scores are double on both sides, in the same order, so the experts
// chosen are the CPU's exactly (ties included: logits on a coarse grid tie often) and probs
// and dlogits differ only by their last float rounding: 1e-6 relative + 1e-7. The losses'
// totals are summed in another association: 1e-12 relative. The permutations copy or add
// the same floats in the same order (equal within 1e-6); the combine's dot products and the
// grouped GEMM sum in another order: kSumAtol as test_gpu_linear.cpp (K <= 40, |x| <= 1).
#include <algorithm>
#include <cmath>

#include "backend/moe_ops.h"
#include "comm/local_communicator.h"
#include "gpu/gpu_test.h"
#include "parallel/expert_dispatch.h"

namespace omni::gpu_test {
namespace {

constexpr double kSumAtol = 1e-4;

ops::Exec gpu_exec() {
  return ops::Exec{&gpu::backend()};
}

// Logits on a grid of 1/4 in [-2, 2]: many exact ties between experts.
std::vector<float> tied_logits(size_t n, uint32_t seed) {
  std::vector<float> v = random_vector(n, seed, -2.0f, 2.0f);
  for (float& x : v) x = std::round(x * 4.0f) / 4.0f;
  return v;
}

std::vector<int32_t> download_ints(const int32_t* p, size_t n) {
  gpu::synchronize();
  std::vector<int32_t> h(n);
  gpu::copy_to_host(h.data(), p, n * sizeof(int32_t));
  return h;
}

struct RoutingCase {
  const char* name;
  ops::MoERoutingArgs a;
  bool bias;
};

std::vector<RoutingCase> routing_cases() {
  std::vector<RoutingCase> out;
  ops::MoERoutingArgs a;
  a.tokens = 37, a.experts = 8, a.topk = 2;
  out.push_back({"softmax top-2", a, false});
  a.pre_softmax = true, a.scaling_factor = 2.5;
  out.push_back({"pre-softmax, scaled", a, false});
  a = {};
  a.tokens = 37, a.experts = 16, a.topk = 4, a.score_function = MoEScoreFunction::Sigmoid;
  a.num_groups = 4, a.group_topk = 2, a.scaling_factor = 2.5;
  out.push_back({"sigmoid, bias, groups", a, true});
  a.topk = 1, a.num_groups = 0, a.group_topk = 0;
  out.push_back({"sigmoid top-1", a, false});
  a = {};
  a.tokens = 37, a.experts = 8, a.topk = 3, a.num_groups = 4, a.group_topk = 3;
  out.push_back({"softmax, groups", a, false});
  return out;
}

TEST(GpuMoE, TopKRoutingChoosesTheCpusExpertsTiesIncluded) {
  OMNI_REQUIRE_GPU();
  const ops::Exec e = gpu_exec();
  for (const RoutingCase& c : routing_cases()) {
    SCOPED_TRACE(c.name);
    const ops::MoERoutingArgs& a = c.a;
    const size_t TE = size_t(a.tokens) * a.experts, TK = size_t(a.tokens) * a.topk;
    const std::vector<float> logits = tied_logits(TE, 3);
    std::vector<float> bias = random_vector(a.experts, 4, -0.1f, 0.1f);
    bias[1] = bias[2];  // a tie through the bias too
    std::vector<float> probs(TK), dlogits(TE);
    std::vector<int32_t> idx(TK);
    ops::moe_topk_routing_forward(probs.data(), idx.data(), logits.data(),
                                  c.bias ? bias.data() : nullptr, a);
    const std::vector<float> dprobs = random_vector(TK, 5);
    ops::moe_topk_routing_backward(dlogits.data(), dprobs.data(), logits.data(), idx.data(), a);

    Device<float> d_logits(logits), d_bias(bias), d_probs(TK), d_dprobs(dprobs), d_dlogits(TE);
    gpu::DeviceArray<int32_t> d_idx(TK);
    ops::moe_topk_routing_forward(e, d_probs.get(), d_idx.data(), d_logits.get(),
                                  c.bias ? d_bias.get() : static_cast<float*>(nullptr), a);
    ops::moe_topk_routing_backward(e, d_dlogits.get(), d_dprobs.get(), d_logits.get(), d_idx.data(),
                                   a);
    EXPECT_EQ(download_ints(d_idx.data(), TK), idx);
    EXPECT_TRUE(close(d_probs.host(), probs, 1e-6, 1e-7));
    EXPECT_TRUE(close(d_dlogits.host(), dlogits, 1e-6, 1e-7));
  }
}

// Then context parallelism's form: the counts (moe_aux_loss_counts, into device memory) are
// the CPU's exactly, and the loss and its gradient from given counts of sequences split over
// two shards (this rank's counts plus another rank's) are the CPU's.
TEST(GpuMoE, AuxAndZLossesAndTheirGradientsAreTheCpus) {
  OMNI_REQUIRE_GPU();
  const ops::Exec e = gpu_exec();
  for (auto score : {MoEScoreFunction::Softmax, MoEScoreFunction::Sigmoid})
    for (auto type : {MoELoadBalancing::AuxLoss, MoELoadBalancing::SeqAuxLoss}) {
      SCOPED_TRACE(std::string(to_string(score)) + " " + to_string(type));
      ops::MoEAuxLossArgs a;
      a.tokens = 24, a.experts = 8, a.topk = 2, a.score_function = score, a.type = type;
      a.seq_length = 6, a.coeff = 0.01;
      const size_t TE = size_t(a.tokens) * a.experts;
      const std::vector<float> logits = tied_logits(TE, 7), start = random_vector(TE, 8);
      std::vector<float> d = start;
      const double want = ops::moe_aux_loss(d.data(), logits.data(), a, 3.0);
      const double want_z =
          ops::moe_z_loss(d.data(), logits.data(), a.tokens, a.experts, 1e-3, 3.0);
      Device<float> d_logits(logits), d_d(start);
      const double got = ops::moe_aux_loss(e, d_d.get(), d_logits.get(), a, 3.0);
      const double got_z =
          ops::moe_z_loss(e, d_d.get(), d_logits.get(), a.tokens, a.experts, 1e-3, 3.0);
      EXPECT_NEAR(got, want, 1e-12 * std::abs(want));
      EXPECT_NEAR(got_z, want_z, 1e-12 * std::abs(want_z));
      EXPECT_TRUE(close(d_d.host(), d, 1e-6, 1e-7));

      std::vector<double> counts = ops::moe_aux_loss_counts(logits.data(), a);
      ASSERT_EQ(counts.size(), size_t(type == MoELoadBalancing::SeqAuxLoss ? 4 : 1) * a.experts);
      gpu::DeviceArray<double> d_counts(counts.size());
      ops::moe_aux_loss_counts(e, d_counts.data(), d_logits.get(), a);
      std::vector<double> got_counts(counts.size());
      gpu::synchronize();
      gpu::copy_to_host(got_counts.data(), d_counts.data(), counts.size() * sizeof(double));
      EXPECT_EQ(got_counts, counts);
      // The other shard's counts: another rank's tokens of the same sequences.
      const std::vector<double> other = ops::moe_aux_loss_counts(tied_logits(TE, 13).data(), a);
      for (size_t i = 0; i < counts.size(); ++i) counts[i] += other[i];
      gpu::copy_to_device(d_counts.data(), counts.data(), counts.size() * sizeof(double));
      a.shards = 2;
      a.counts = counts.data();
      const double want_cp = ops::moe_aux_loss(d.data(), logits.data(), a, 3.0);
      a.counts = d_counts.data();
      const double got_cp = ops::moe_aux_loss(e, d_d.get(), d_logits.get(), a, 3.0);
      EXPECT_NEAR(got_cp, want_cp, 1e-12 * std::abs(want_cp));
      EXPECT_TRUE(close(d_d.host(), d, 1e-6, 1e-7));
    }
}

TEST(GpuMoE, ExpertBiasUpdateIsTheCpus) {
  OMNI_REQUIRE_GPU();
  const std::vector<float> bias = random_vector(6, 9);
  const std::vector<double> counts = {3, 9, 6, 6, 0, 12};  // mean 6: two experts at it
  std::vector<float> want = bias;
  ops::moe_expert_bias_update(want.data(), counts.data(), 6, 1e-3);
  Device<float> d(bias);
  ops::moe_expert_bias_update(gpu_exec(), d.get(), counts.data(), 6, 1e-3);
  EXPECT_EQ(d.host(), want);
}

// Dispatch under each capacity setting: the plan (built on the host from the device's routing)
// keeps the CPU's tokens, and permute, combine and their backwards match the CPU's.
TEST(GpuMoE, DispatchAndCombineAreTheCpusWithCapacityDrops) {
  OMNI_REQUIRE_GPU();
  const ops::Exec e = gpu_exec();
  const int T = 29, E = 4, K = 2, C = 12;
  ops::MoERoutingArgs a;
  a.tokens = T, a.experts = E, a.topk = K;
  const std::vector<float> logits = tied_logits(size_t(T) * E, 11);
  std::vector<float> probs(size_t(T) * K);
  std::vector<int32_t> idx(size_t(T) * K);
  ops::moe_topk_routing_forward(probs.data(), idx.data(), logits.data(),
                                static_cast<float*>(nullptr), a);
  Device<float> d_logits(logits), d_probs(probs.size());
  gpu::DeviceArray<int32_t> d_idx(idx.size());
  ops::moe_topk_routing_forward(e, d_probs.get(), d_idx.data(), d_logits.get(),
                                static_cast<float*>(nullptr), a);
  ops::MoECapacityArgs dropless, by_probs, by_position, padded;
  by_probs.capacity_factor = 0.75;  // capacity 11 of about 14.5 rows per expert
  by_position = by_probs, by_position.drop_policy = MoETokenDropPolicy::Position;
  padded = by_probs, padded.pad_to_capacity = true;
  const std::vector<float> x = random_vector(size_t(T) * C, 12);
  for (const auto& [name, cap] : {std::pair{"dropless", dropless}, std::pair{"probs", by_probs},
                                  std::pair{"position", by_position}, std::pair{"pad", padded}}) {
    SCOPED_TRACE(name);
    const ops::MoEDispatchPlan plan =
        ops::moe_dispatch_plan(idx.data(), probs.data(), T, E, K, cap);
    const ops::MoEPlan dplan = ops::moe_dispatch_plan(e, d_idx.data(), d_probs.get(), T, E, K, cap);
    EXPECT_EQ(dplan.host().row_token, plan.row_token);
    EXPECT_EQ(dplan.host().row_slot, plan.row_slot);
    EXPECT_EQ(dplan.host().expert_offsets, plan.expert_offsets);
    EXPECT_EQ(dplan.host().dropped, plan.dropped);
    if (cap.capacity_factor > 0) {
      EXPECT_GT(plan.dropped, 0);
    }
    const size_t R = plan.rows();
    std::vector<float> perm(R * C), rw(R), y(size_t(T) * C), dexp(R * C), drw(R), dx(x.size()),
        dprobs(probs.size());
    const std::vector<float> out = random_vector(R * C, 13), dy = random_vector(x.size(), 14);
    ops::moe_permute(perm.data(), x.data(), plan, C);
    ops::moe_row_weights(rw.data(), probs.data(), plan);
    ops::moe_unpermute(y.data(), out.data(), rw.data(), plan, C);
    ops::moe_unpermute_backward(dexp.data(), drw.data(), dy.data(), out.data(), rw.data(), plan, C);
    ops::moe_row_weights_backward(dprobs.data(), drw.data(), plan);
    ops::moe_permute_backward(dx.data(), out.data(), plan, C, false);

    Device<float> d_x(x), d_perm(R * C), d_rw(R), d_out(out), d_y(y.size()), d_dy(dy),
        d_dexp(R * C), d_drw(R), d_dx(x.size()), d_dprobs(probs.size());
    ops::moe_permute(e, d_perm.get(), d_x.get(), dplan, C);
    ops::moe_row_weights(e, d_rw.get(), d_probs.get(), dplan);
    ops::moe_unpermute(e, d_y.get(), d_out.get(), d_rw.get(), dplan, C);
    ops::moe_unpermute_backward(e, d_dexp.get(), d_drw.get(), d_dy.get(), d_out.get(), d_rw.get(),
                                dplan, C);
    ops::moe_row_weights_backward(e, d_dprobs.get(), d_drw.get(), dplan);
    ops::moe_permute_backward(e, d_dx.get(), d_out.get(), dplan, C, false);
    EXPECT_EQ(d_perm.host(), perm);
    EXPECT_TRUE(close(d_rw.host(), rw, 1e-6, 0));
    EXPECT_TRUE(close(d_y.host(), y, 1e-6, 1e-6));
    EXPECT_TRUE(close(d_dexp.host(), dexp, 1e-6, 0));
    EXPECT_TRUE(close(d_drw.host(), drw, 1e-6, kSumAtol));
    EXPECT_TRUE(close(d_dprobs.host(), dprobs, 1e-6, kSumAtol));
    EXPECT_TRUE(close(d_dx.host(), dx, 1e-6, 1e-6));
  }
}

// Experts with 0, 1 and many rows; with and without biases.
TEST(GpuMoE, GroupedLinearIsTheCpus) {
  OMNI_REQUIRE_GPU();
  const ops::Exec e = gpu_exec();
  const int E = 4, K = 20, N = 12;
  const std::vector<int32_t> offsets = {0, 7, 7, 8, 30};
  const int R = offsets.back();
  for (bool with_bias : {true, false}) {
    SCOPED_TRACE(with_bias ? "bias" : "no bias");
    const std::vector<float> x = random_vector(size_t(R) * K, 21),
                             w = random_vector(size_t(E) * N * K, 22),
                             b = random_vector(size_t(E) * N, 23),
                             dy = random_vector(size_t(R) * N, 24),
                             dw0 = random_vector(w.size(), 25), db0 = random_vector(b.size(), 26);
    std::vector<float> y(size_t(R) * N), dx(x.size()), dw = dw0, db = db0;
    ops::moe_grouped_linear_forward(y.data(), x.data(), w.data(), with_bias ? b.data() : nullptr,
                                    offsets.data(), E, K, N);
    ops::moe_grouped_linear_backward(dx.data(), dw.data(), with_bias ? db.data() : nullptr,
                                     dy.data(), x.data(), w.data(), offsets.data(), E, K, N);
    Device<float> d_x(x), d_w(w), d_b(b), d_dy(dy), d_dw(dw0), d_db(db0), d_y(y.size()),
        d_dx(x.size());
    ops::moe_grouped_linear_forward(e, d_y.get(), d_x.get(), d_w.get(),
                                    with_bias ? d_b.get() : static_cast<float*>(nullptr),
                                    offsets.data(), E, K, N);
    ops::moe_grouped_linear_backward(e, d_dx.get(), d_dw.get(),
                                     with_bias ? d_db.get() : static_cast<float*>(nullptr),
                                     d_dy.get(), d_x.get(), d_w.get(), offsets.data(), E, K, N);
    EXPECT_TRUE(close(d_y.host(), y, 1e-5, kSumAtol));
    EXPECT_TRUE(close(d_dx.host(), dx, 1e-5, kSumAtol));
    EXPECT_TRUE(close(d_dw.host(), dw, 1e-5, kSumAtol));
    EXPECT_TRUE(close(d_db.host(), db, 1e-5, kSumAtol));
  }
}

TEST(GpuMoE, SharedExpertGateIsTheCpus) {
  OMNI_REQUIRE_GPU();
  const ops::Exec e = gpu_exec();
  const int T = 9, C = 40;
  const std::vector<float> h = random_vector(size_t(T) * C, 31), x = random_vector(h.size(), 32),
                           w = random_vector(C, 33), dy = random_vector(h.size(), 34),
                           dx0 = random_vector(h.size(), 35), dw0 = random_vector(C, 36);
  std::vector<float> y(h.size()), gate(T), dh(h.size()), dx = dx0, dw = dw0;
  ops::moe_shared_gate_forward(y.data(), gate.data(), h.data(), x.data(), w.data(), T, C);
  ops::moe_shared_gate_backward(dh.data(), dx.data(), dw.data(), dy.data(), h.data(), gate.data(),
                                x.data(), w.data(), T, C);
  Device<float> d_h(h), d_x(x), d_w(w), d_dy(dy), d_dx(dx0), d_dw(dw0), d_y(h.size()), d_gate(T),
      d_dh(h.size());
  ops::moe_shared_gate_forward(e, d_y.get(), d_gate.get(), d_h.get(), d_x.get(), d_w.get(), T, C);
  ops::moe_shared_gate_backward(e, d_dh.get(), d_dx.get(), d_dw.get(), d_dy.get(), d_h.get(),
                                d_gate.get(), d_x.get(), d_w.get(), T, C);
  EXPECT_TRUE(close(d_gate.host(), gate, 1e-5, kSumAtol));
  EXPECT_TRUE(close(d_y.host(), y, 1e-5, kSumAtol));
  EXPECT_TRUE(close(d_dh.host(), dh, 1e-5, kSumAtol));
  EXPECT_TRUE(close(d_dx.host(), dx, 1e-5, kSumAtol));
  EXPECT_TRUE(close(d_dw.host(), dw, 1e-5, kSumAtol));
}

// The exchange of expert tensor parallelism wider than TP (parallel/expert_dispatch.h) with its
// rows in device memory, received and packed by device copies and summed by device adds: 3
// in-process ranks on their own emulated devices, 2 local experts (rank 0 none of expert 0,
// rank 1 none of expert 1), the gathered rows and the sums back the same exchange's on the CPU
// exactly (the same floats copied, the same adds in the same order).
TEST(GpuMoE, ExpertTensorExchangeInDeviceMemoryIsTheCpus) {
#if !defined(OMNITRON_GPU_EMULATE)
  GTEST_SKIP() << "in-process ranks share host memory, which only the emulated device is";
#endif
  const int n = 3, L = 2, width = 3;
  auto rows_of = [](int r, int l) { return r + l + (l == 1 && r == 1 ? -2 : 0); };
  run_ranks(n, [&](Communicator& w) {
    gpu::set_device(w.rank());
    std::vector<int32_t> offsets{0};
    for (int l = 0; l < L; ++l) offsets.push_back(offsets.back() + rows_of(w.rank(), l));
    ExpertTensorExchange x(w, offsets.data(), L);
    const size_t own = size_t(x.own_rows()) * width, all = size_t(x.rows()) * width,
                 staged = size_t(x.staging_rows()) * width;
    const std::vector<float> mine = random_vector(own, 10 + w.rank()),
                             partial = random_vector(all, 20 + w.rank());
    std::vector<float> cpu_all(all), cpu_back(own), cpu_staging(staged);
    x.gather(cpu_all.data(), mine.data(), width, ops::Exec{}, cpu_staging.data());
    x.reduce_scatter(cpu_back.data(), partial.data(), width, ops::Exec{}, cpu_staging.data());
    Device<float> d_mine(mine), d_partial(partial), d_all(all), d_back(own), d_staging(staged);
    x.gather(d_all.get(), d_mine.get(), width, gpu_exec(), d_staging.get());
    EXPECT_EQ(d_all.host(), cpu_all);
    x.reduce_scatter(d_back.get(), d_partial.get(), width, gpu_exec(), d_staging.get());
    EXPECT_EQ(d_back.host(), cpu_back);
  });
}

}  // namespace
}  // namespace omni::gpu_test
