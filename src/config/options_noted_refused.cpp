// Megatron's flags that omnitron accepts with a note (they tune Megatron's Python/CUDA
// machinery) or refuses naming the feature that is not built yet.
#include "config/option_rows.h"

namespace omni::option_rows {

void add_noted_and_refused_options(std::vector<OptionDef>& t) {
  t.push_back(not_built("--expert-model-parallel-size", "N", "1", "expert parallelism"));
  t.push_back(not_built("--num-experts", "N", "", "mixture of experts"));
  for (const char* flag :
       {"--no-masked-softmax-fusion", "--no-gradient-accumulation-fusion", "--no-bias-gelu-fusion",
        "--no-bias-swiglu-fusion", "--no-bias-dropout-fusion", "--no-rope-fusion",
        "--no-async-tensor-model-parallel-allreduce", "--use-mcore-models",
        "--attention-softmax-in-fp32", "--accumulate-allreduce-grads-in-fp32"})
    t.push_back(plumbing(flag, "", "omnitron has no Python fusion or kernel switch to turn"));
  t.push_back(plumbing("--use-flash-attn", "",
                       "attention already never stores more than it needs on "
                       "this backend; flash attention comes with the GPU backend"));
  t.push_back(plumbing("--transformer-impl", "NAME", "there is one transformer implementation"));
  t.push_back(plumbing("--distributed-backend", "nccl|gloo", "the communicator follows --device"));
  t.push_back(plumbing("--dataloader-type", "single|cyclic",
                       "samples are read in Megatron's single order"));
  t.push_back(plumbing("--num-workers", "N", "data is read by one background thread"));
}

}  // namespace omni::option_rows
