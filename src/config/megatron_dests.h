// Megatron's internal argument names (argparse `dest`s), which Primus's YAML files use as
// keys, and the command-line flag that sets each: `add_bias_linear: false` is
// `--disable-bias-linear`, `masked_softmax_fusion: false` is `--no-masked-softmax-fusion`.
// The rows are facts read from Megatron's parser (scripts/megatron_dests.py writes
// megatron_dests.cpp); a key without a row follows the plain rule: `k` is the flag `--k`.
#pragma once

#include <string>
#include <vector>

namespace omni {

enum class DestAction {
  Value,       // --flag VALUE(S)
  StoreTrue,   // the flag sets the dest to true (its default is false or None)
  StoreFalse,  // the flag sets the dest to false (its default is true): --no-x, --disable-x
  Both,        // --flag sets true, --no-flag false (argparse's BooleanOptionalAction)
};

// Which Megatron the row comes from: current Megatron-LM (the flags omnitron accepts), or
// only the older one that Primus pins (a name since renamed or removed).
enum class MegatronVersion { Current, Primus };

struct MegatronDest {
  const char* dest;  // "add_bias_linear"
  const char* flag;  // "--disable-bias-linear"
  DestAction action;
  const char* megatron_default;  // as YAML writes it ("true", "1e-05", "p2p", "0 1"); null: None
  MegatronVersion version;
};

const std::vector<MegatronDest>& megatron_dest_rows();  // megatron_dests.cpp (generated)

// The row for `dest`, or null when the plain rule applies (or `dest` is not Megatron's).
const MegatronDest* find_megatron_dest(const std::string& dest);

}  // namespace omni
