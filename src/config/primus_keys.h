// AMD Primus's own keys (beyond Megatron's arguments) in its Megatron module and model
// configs: each is a row of the option table (options_primus.cpp, flag spelled --key-with-
// dashes), implemented where it means something here and noted or refused otherwise.
#pragma once

#include <string>

namespace omni {

// Primus's default for its key `key` (the value in its module or model configs), as YAML
// writes it; null when `key` is not Primus's or Primus leaves it null. A YAML value equal
// to it asks for nothing, so notes are printed only for what a file changes.
const char* primus_key_default(const std::string& key);

}  // namespace omni
