// Megatron-DeepSpeed's launcher variables (TP=2 NLAYERS=32 LR=3e-4 ... bash train.sh) as
// omnitron flags, for scripts/launch.sh. They apply only when OMNITRON_ENV_OVERRIDES=1 (the
// launcher sets it), so an unrelated LR in a user's shell never changes a run. Precedence:
// command line > these variables > YAML.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace omni {

struct EnvOverride {
  std::string variable, value;
  std::vector<std::string> args;  // the flags it becomes
};

// The variables set in `env` and the flags each becomes, in a fixed order. Throws
// UsageError naming the variable when its value is not what it must be.
std::vector<EnvOverride> env_overrides(const std::map<std::string, std::string>& env);

}  // namespace omni
