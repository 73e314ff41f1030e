// The optimizer zoo: the optimizers of Megatron-DeepSpeed's OPT list beyond Adam and SGD,
// and the Lion and Muon that Megatron offers, on the flat parameter buffers of a rank's
// ParameterSet, on the CPU or the GPU. Optimizer<T> (optim/optimizer.h)
// and DistributedOptimizer<T> hold one of these for the zoo's kinds and forward step() and
// its state to it.
//
//   lamb                LAMB (You et al. 2019, arXiv:1904.00962), as DeepSpeed's FusedLamb:
//                       Adam's update scaled per tensor by the clamped trust ratio
//   lion                Lion (Chen et al. 2023, arXiv:2302.06675): the sign of interpolated
//                       momentum, decoupled weight decay
//   muon                Muon (Jordan et al. 2024; Megatron's TensorParallelMuon): momentum
//                       orthogonalised by Newton-Schulz for 2-D weights, AdamW for the rest
//   adamwschedulefree   Schedule-free AdamW and SGD (Defazio et al. 2024, arXiv:2405.15682),
//   sgdschedulefree     as facebookresearch/schedule_free's reference implementations
//   sophiag             SophiaG (Liu et al. 2023, arXiv:2305.14342), as Megatron-DeepSpeed's
//                       copy of the reference sophia.py
//   adam8bit            8-bit Adam with block-wise dynamic quantisation of both moments
//                       (Dettmers et al. 2022, arXiv:2110.02861), as bitsandbytes' Adam8bit
//   galoreadamw         GaLore (Zhao et al. 2024, arXiv:2403.03507), as galore_torch's
//   galoreadamw8bit     GaLoreAdamW and GaLoreAdamW8bit: Adam on the gradient of each hidden
//   galoreadamw8bitperlayer  matrix projected on its top singular vectors (the per-layer
//                       variant steps each tensor from a gradient hook there: same math here)
//   shampoo             Shampoo (Gupta, Koren, Singer 2018, arXiv:1802.09568), as Meta's
//                       DistributedShampoo with Adam grafting behind Megatron-DeepSpeed's
//                       OPT=shampoo
//
// Each family's file cites its reference and says how the state is laid out. States are
// exposed as buffers laid out like the elements the optimizer updates (ZooLayout: the whole
// flat parameter buffer, or the distributed optimizer's shard), which checkpoints save.
//
// Every zoo optimizer computes what it would on one rank holding the whole model:
//  - element-wise states update per element, whatever the layout;
//  - per-tensor quantities (LAMB's norms, adam8bit's block maxima) are reduced over the
//    data-parallel ranks that hold other pieces of a tensor and over the tensor-parallel
//    ranks that hold other slices of it (an expert's, over the expert tensor-parallel ranks);
//    each expert of a stacked expert tensor ([experts, ...], is_stacked_experts) is a
//    tensor of its own there, as DeepSpeed-MoE and Megatron-Core's SequentialMLP hold one
//    tensor per expert: LAMB's trust ratio is per expert and adam8bit's blocks restart at
//    each expert's first element (zoo_tensors);
//  - Muon gathers each whole matrix (its pieces over the data-parallel group, its slices over
//    the tensor-parallel group), orthogonalises it, and keeps the elements it owns.
//  - GaLore and Shampoo (under the distributed optimizer) step every tensor they hold a piece
//    of whole, from the gathered gradient, with that tensor's whole state: sharded by whole
//    tensors; a tensor-parallel slice's (an expert's, over the expert tensor-parallel ranks)
//    whole matrix is assembled as Muon's is, and stepped whole on every rank holding a slice.
#pragma once

#include <array>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "optim/optimizer.h"

namespace omni {

// The zoo's kind for an --optimizer or OPT name (aliases included), or none.
std::optional<OptimizerKind> parse_zoo_optimizer(const std::string& name);
// The zoo's names, for messages: "lamb, lion, ...".
std::string zoo_optimizer_names();
// The canonical name of a zoo kind (what checkpoints record).
const char* zoo_optimizer_name(OptimizerKind kind);
bool is_zoo_optimizer(OptimizerKind kind);
// Whether the zoo's kind steps every matrix whole on a rank: GaLore and Shampoo (under the
// distributed optimizer they shard by whole tensors; tensor-parallel slices are assembled).
bool zoo_whole_only(OptimizerKind kind);

// A run of one parameter's elements that this rank updates, and where its states start.
struct ZooPiece {
  size_t param = 0;            // index into params.infos()
  int64_t begin = 0, end = 0;  // in the flat buffer
  int64_t state = 0;           // in the state buffers
};

// The tensors of the zoo's per-tensor quantities: each parameter is one, except a stacked
// expert tensor (is_stacked_experts), whose every expert is one. The whole (unsplit)
// tensor's experts (1: not stacked), and the elements of one of its tensors (an expert's, or
// the whole parameter's): the experts lie one after another, zoo_tensor_numel(p) each.
int64_t zoo_tensor_count(const ParamInfo& p);
int64_t zoo_tensor_numel(const ParamInfo& p);

// A run of one of the zoo's tensors' elements that this rank updates (a ZooPiece cut where an
// expert ends), and that tensor's index among this rank's.
struct ZooTensorPiece {
  ZooPiece piece;
  size_t tensor = 0;
};
struct ZooTensors {
  // Per parameter, the index of its first tensor on this rank (a stacked expert tensor's
  // shape[0] follow it, each numel / shape[0] elements); back(): the number of tensors.
  std::vector<size_t> first;
  std::vector<ZooTensorPiece> pieces;  // in the pieces' order
};
// `pieces` (of `infos`' parameters) cut at the experts' boundaries.
ZooTensors zoo_tensors(const std::vector<ParamInfo>& infos, const std::vector<ZooPiece>& pieces);

// Which elements of the flat parameter buffer this rank updates, and who holds the rest.
template <typename T>
struct ZooLayout {
  std::vector<ZooPiece> pieces;  // in flat-buffer order
  int64_t state_size = 0;        // elements of each state buffer
  // The distributed optimizer's data-parallel group (null: this rank updates every element)
  // and its all-gather, which fills a parameter-sized buffer's other ranks' pieces.
  Communicator* data_parallel = nullptr;
  std::function<void(T*)> gather_pieces;
  // The ranks holding the other slices of tensors that tensor parallelism splits (null or one
  // rank: none).
  Communicator* tensor_parallel = nullptr;
  // Under expert tensor parallelism of another size than tp: the ranks holding the other
  // slices of the experts' tensors (`expert[i]`: parameter i is one), which then take this
  // group in tensor_parallel's place (null: the experts' tensors are split as the others).
  Communicator* expert_tensor_parallel = nullptr;
  std::vector<bool> expert;
  // The device the parameters live on, where the states go too.
  ops::Exec exec;

  // Every element of `params`, its states laid out like the parameters.
  static ZooLayout whole(const std::vector<ParamInfo>& infos, Communicator* tensor_parallel);
  bool split(const ParamInfo& p) const {
    return p.shard_dim >= 0 && tensor_parallel && tensor_parallel->size() > 1;
  }
  // Whether other ranks than this one hold parts of some tensor.
  bool parts_elsewhere() const;
  // The group holding parameter i's other slices (null: none).
  Communicator* slices_group(size_t i) const {
    return expert_tensor_parallel && i < expert.size() && expert[i] ? expert_tensor_parallel
                                                                    : tensor_parallel;
  }
  // Sums `per_tensor` (`values_per_tensor` values per tensor of `tensors`, this rank's part)
  // over the ranks that hold other parts of each tensor: the data-parallel group, and for
  // split parameters' tensors the group holding their slices (slices_group).
  void sum_over_parts(std::vector<double>& per_tensor, const std::vector<ParamInfo>& infos,
                      const ZooTensors& tensors, size_t values_per_tensor = 1) const;
  // The element-wise maximum of `values` over every rank holding parts of the tensors
  // (values laid out by whole tensors, identical where ranks hold the same part).
  void max_over_parts(std::vector<float>& values) const;
};

// The number of elements of p's whole (unsplit) tensor.
int64_t global_numel(const ParamInfo& p);

template <typename T>
class ZooOptimizer {
 public:
  virtual ~ZooOptimizer() = default;
  // One update at step `step` (1-based) with learning rate `lr`.
  virtual void step(ParameterSet<T>& params, double lr, int64_t step) = 0;
  virtual std::vector<std::string> state_names() const = 0;
  // A buffer of layout.state_size elements laid out like the parameters. What is written into
  // it is the state from the next step on.
  virtual T* state_buffer(const std::string& name) = 0;
  virtual std::vector<std::string> scalar_names() const { return {}; }
  // SophiaG's Hessian estimate: an EMA of the squares of the current gradients, which for
  // the Gauss-Newton-Bartlett estimator are those of a loss on labels sampled from the
  // model. Only SophiaG has one.
  virtual void update_hessian(const ParameterSet<T>& params);
  virtual double& scalar(const std::string& name);
  // The bytes of state this rank holds. Optional: GaLore counts its own; the default throws.
  virtual int64_t state_bytes() const;
};

// The zoo optimizer of `config.kind` for the elements of `params` that `layout` gives this
// rank (host memory).
template <typename T>
std::shared_ptr<ZooOptimizer<T>> make_zoo_optimizer(const OptimizerConfig& config,
                                                    const ParameterSet<T>& params,
                                                    const ZooLayout<T>& layout);

// Families (one file each).
template <typename T>
std::shared_ptr<ZooOptimizer<T>> make_elementwise_zoo_optimizer(const OptimizerConfig& config,
                                                                const ParameterSet<T>& params,
                                                                const ZooLayout<T>& layout);
template <typename T>
std::shared_ptr<ZooOptimizer<T>> make_muon(const OptimizerConfig& config,
                                           const ParameterSet<T>& params,
                                           const ZooLayout<T>& layout);
template <typename T>
std::shared_ptr<ZooOptimizer<T>> make_adam8bit(const OptimizerConfig& config,
                                               const ParameterSet<T>& params,
                                               const ZooLayout<T>& layout);
// GaLore and Shampoo step whole tensors: a whole layout or the distributed optimizer's, the
// tensors tensor parallelism splits assembled (WholeTensorStates).
template <typename T>
std::shared_ptr<ZooOptimizer<T>> make_galore(const OptimizerConfig& config,
                                             const ParameterSet<T>& params,
                                             const ZooLayout<T>& layout);
template <typename T>
std::shared_ptr<ZooOptimizer<T>> make_shampoo(const OptimizerConfig& config,
                                              const ParameterSet<T>& params,
                                              const ZooLayout<T>& layout);

// The 2-D weights of the hidden layers (not the word embeddings or the output layer): the
// matrices Muon orthogonalises and GaLore projects. An MoE layer's experts' biases are 2-D
// here ([experts, width]) but are each expert's own vector, as Megatron-Core holds them: not
// matrices.
bool is_hidden_matrix(const ParamInfo& p);
// An MoE layer's stacked expert weights, [experts, rows, cols]: one matrix per expert, as
// Megatron-Core's TEGroupedMLP and SequentialMLP (and DeepSpeed-MoE) hold each expert's
// weight as its own 2-D tensor. Muon orthogonalises each expert's matrix on its own and
// Shampoo preconditions each apart.
bool is_expert_matrices(const ParamInfo& p);
// An MoE layer's stacked expert tensors, [experts, ...]: those weights and the experts' linear
// biases ([experts, width]). Each expert's slice is a tensor of its own to the zoo's
// per-tensor quantities (zoo_tensors: LAMB's trust ratio, adam8bit's blocks).
bool is_stacked_experts(const ParamInfo& p);

// bitsandbytes' 256-value dynamic quantisation map, sorted (signed: the first moment's).
std::array<float, 256> dynamic_quantization_map(bool is_signed);

// Where GaLore and Shampoo, which step whole tensors, keep their states. On a whole layout
// every tensor's state sits at the tensor's own offset. Under the distributed optimizer (a
// layout of pieces over data-parallel ranks) a rank steps every tensor it holds a piece of,
// whole, from the whole reduced gradient (gathered from the ranks' pieces) and with that
// tensor's whole state: the one-rank arithmetic on the same inputs, so the ranks holding
// pieces of one tensor compute the same values and the parameter all-gather keeps each
// rank's pieces. Those tensors' states ("compact" ones) then lie one after another, so they
// take memory for the held tensors only (the ones a shard boundary cuts on both ranks), and
// checkpoints see this rank's pieces of the one-rank layout through views.
//
// A tensor that tensor parallelism splits (over its slices_group; an MoE layer's experts split
// by width over the expert tensor-parallel ranks) and that `whole` asks for is assembled, as
// Muon assembles its matrices: every rank of the group sums the group's zero-padded slices
// of its gradient into the whole tensor's (an expert tensor's: this rank's experts, each
// whole), steps the whole tensor redundantly and identically with the whole tensor's state,
// and keeps its own slice of the result. The optimizer then sees infos(): the tensors as it
// steps them (an assembled one with its whole shape, unsplit), one after another in a flat
// buffer of whole_size() elements (16-element aligned as ParameterSet lays them out, so with
// nothing assembled it is the parameters' own layout, and at TP 1 the one-rank offsets);
// its states are compact, and a checkpoint sees this rank's slice of each whole state, the
// one-rank state's slice as the checkpoint stores any state laid out like the parameters, so
// checkpoints resume across tensor-parallel layouts.
template <typename T>
class WholeTensorStates {
 public:
  WholeTensorStates(const ParameterSet<T>& params, const ZooLayout<T>& layout,
                    const std::function<bool(const ParamInfo&)>& whole = nullptr);
  bool sharded() const { return layout_.data_parallel != nullptr; }
  // Whether some tensor is assembled from its slices.
  bool assembling() const { return assembling_; }
  // Whether checkpoints see the states through views (sharded or assembling).
  bool viewed() const { return sharded() || assembling_; }
  bool held(size_t param) const { return held_[param]; }
  // Whether this rank holds the tensor's first element (one owner per tensor).
  bool owned(size_t param) const { return owned_[param]; }
  // Where the tensor's compact state starts; the elements of each compact state.
  int64_t at(size_t param) const { return at_[param]; }
  int64_t size() const { return size_; }
  // The tensors as the optimizer steps them, and their flat buffer's elements.
  const std::vector<ParamInfo>& infos() const { return infos_; }
  int64_t whole_size() const { return whole_size_; }
  // The distributed optimizer's view of a state: this rank's pieces of its whole layout,
  // read from `from`, a compact state (`compact`) or one laid out like infos().
  T* view(const std::string& name, const T* from, bool compact);
  // The whole reduced gradient of every tensor, laid out like infos() (this rank's pieces
  // gathered from all ranks, the assembled tensors assembled: collective over their groups).
  // First, the views a checkpoint's load wrote are gathered likewise and handed back: into
  // compact(name) where that is a compact state, else to whole(name) laid out like infos().
  const T* gather_gradients(const ParameterSet<T>& params,
                            const std::function<T*(const std::string&)>& compact,
                            const std::function<void(const std::string&, const T*)>& whole);
  // The parameters laid out like infos() (this rank's elements of the assembled tensors; the
  // rest is scratch), and this rank's elements of them back into `params` after the step.
  T* values(ParameterSet<T>& params);
  void keep_values(ParameterSet<T>& params);

 private:
  T* buffer(Tensor& t, int64_t n);
  // f(local, whole, n) for the runs of parameter i's local elements [lo, hi) and where they
  // lie in its assembled tensor.
  template <typename F>
  void runs(size_t i, int64_t lo, int64_t hi, F&& f) const;
  // `whole` := tensor i assembled from `local` (its elements on this rank): collective.
  void assemble(size_t i, const T* local, T* whole);

  ZooLayout<T> layout_;
  std::vector<ParamInfo> local_, infos_;  // the parameters; as the optimizer steps them
  std::vector<bool> held_, owned_, assembled_;
  std::vector<int64_t> first_;  // an assembled tensor's first element in the full tensor
  bool assembling_ = false;
  std::vector<int64_t> at_;     // per tensor: its state's start
  int64_t size_ = 0, whole_size_ = 0;
  Device device_;
  std::map<std::string, Tensor> views_;  // while a checkpoint asks for them
  Tensor full_, gathered_, assembled_grads_, assembled_values_, scratch_;
};

// The zoo's states: named buffers of `size` zeros on `device` (`memory`: its allocator).
template <typename T>
class ZooStates {
 public:
  ZooStates(std::vector<std::string> names, int64_t size, Device device = {},
            const DeviceMemory* memory = nullptr);
  const std::vector<std::string>& names() const { return names_; }
  T* get(const std::string& name);

 private:
  std::vector<std::string> names_;
  std::vector<Tensor> buffers_;
};

}  // namespace omni
