// Megatron-DeepSpeed's launcher variables (TP=2 NLAYERS=32 LR=3e-4 ... bash train.sh) as
// omnitron flags, for scripts/launch.sh, with the meanings argonne-lcf/Megatron-DeepSpeed's
// ALCF/helpers.sh gives them (docs/launching.md has the table). They apply only when
// OMNITRON_ENV_OVERRIDES=1 (the launcher sets it), so an unrelated LR in a user's shell never
// changes a run. Precedence: command line > these variables > YAML. A variable that is unset
// or empty adds nothing: omnitron's (Megatron's) default or the YAML's value stays, where
// helpers.sh would put its own default.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace omni {

struct EnvOverride {
  std::string variable, value;    // the (first) variable read, and its value
  std::string source;             // "VAR=value", or several: "TRAIN_SPLIT=98 VAL_SPLIT=2"
  std::vector<std::string> args;  // the flags it becomes (none for a noted variable)
  std::string note;               // a line to print ("note: ..."), or empty
};

// The variables set in `env` and the flags each becomes, in a fixed order. `world_size` is
// the number of ranks, from which GRAD_ACC_STEPS's global batch counts the data-parallel
// ranks (world / (TP x PP x SP), as helpers.sh). Throws UsageError naming the variable when
// its value is not what it must be, NotBuiltError for a value naming a feature not built.
std::vector<EnvOverride> env_overrides(const std::map<std::string, std::string>& env,
                                       int world_size = 1);

}  // namespace omni
