// Hyper-parameters of the optimizer zoo (optim/optimizer_zoo.h), with the defaults of the
// flags that set them (config/options_optimizer_zoo.cpp): Megatron's for Lion and Muon,
// the reference implementations' for the rest.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace omni {

struct ZooConfig {
  // Lion (Megatron's --lion-beta1/--lion-beta2).
  double lion_beta1 = 0.95, lion_beta2 = 0.98;
  // LAMB's trust ratio ||w|| / ||update|| is clamped to [min, max] (DeepSpeed's FusedLamb).
  double lamb_min_coeff = 0.01, lamb_max_coeff = 10.0;
  // Muon (Megatron's --muon-* flags). scale_mode: spectral | unit_rms_norm | shape_scaling.
  double muon_momentum = 0.9;
  bool muon_nesterov = false;
  int muon_num_ns_steps = 5;
  std::string muon_scale_mode = "spectral", muon_coefficient_type = "quintic";
  double muon_extra_scale_factor = 1.0;
  // Megatron orthogonalises the fused QKV weight's query, key and value rows apart: rows
  // per query group [query, key, value] (empty: one matrix).
  std::vector<int64_t> qkv_split_shapes;
  // Schedule-free (Defazio et al.): its own linear warmup, the polynomial weighting power r
  // and the power of the largest learning rate so far in each iterate's weight.
  int64_t schedulefree_warmup_steps = 0;
  double schedulefree_r = 0.0, schedulefree_weight_lr_power = 2.0;
  // SophiaG (Megatron-DeepSpeed's --sophiag-* flags and the batch size its step() assumes).
  double sophiag_beta1 = 0.9, sophiag_beta2 = 0.95, sophiag_rho = 0.01, sophiag_bs = 5120;
  // bitsandbytes' 8-bit states: block size of the block-wise absmax; smaller tensors keep
  // 32-bit states (bitsandbytes' min_8bit_size).
  int64_t adam8bit_block_size = 256, adam8bit_min_8bit_size = 4096;
  // GaLore (galore_torch's torchrun_main defaults, whose lines Megatron-DeepSpeed copied):
  // rank, steps between projections, the factor on the projected-back update, and which
  // side is projected (std: the shorter; reverse_std, left, right).
  int64_t galore_rank = 128, galore_update_proj_gap = 50;
  double galore_scale = 1.0;
  std::string galore_proj_type = "std";
  // Shampoo (Megatron-DeepSpeed's DistributedShampoo call): steps between inverse roots
  // (also the first step that preconditions), the damping epsilon, the largest
  // preconditioner side (longer tensors are split into blocks).
  int64_t shampoo_update_freq = 100, shampoo_max_preconditioner_dim = 8192;
  double shampoo_eps = 1e-12;
};

}  // namespace omni
