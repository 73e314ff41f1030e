// AMD Primus's experiment files (examples/megatron/configs/*.yaml), read as Primus reads
// them (its primus/core/launcher/parser.py at 2d42400):
//
//   work_group: ${TEAM:amd}          user_name, exp_name, workspace: the run's folder,
//   user_name: ${USER:root}          WORKSPACE/WORK_GROUP/USER_NAME/EXP_NAME, which holds
//   exp_name: llama3.1_8B-pretrain   its checkpoints/ (Primus always saves there) and
//   workspace: ./output              tensorboard/ (unless disable_tensorboard)
//   modules:
//     pre_trainer:
//       framework: megatron
//       config: pre_trainer.yaml     primus/configs/modules/megatron/pre_trainer.yaml
//       model: llama3.1_8B.yaml      primus/configs/models/megatron/llama3.1_8B.yaml
//       overrides: {...}             each key must be one of the two files' keys
//
// The module config and the model may not share a key (Primus refuses that too); the
// overrides replace their values. The Primus tree is found from $PRIMUS_PATH, or above the
// experiment file, or above the working directory (Primus's users run from its root:
// EXP=examples/megatron/configs/X.yaml).
#pragma once

#include <map>
#include <string>

#include "config/yaml_tree.h"

namespace omni {

// Whether the file at `path` is a Primus experiment (its top level has `modules:`).
bool is_primus_experiment(const std::string& path, const std::map<std::string, std::string>& env);

// The pre_trainer module's keys, flattened: module config, model and overrides merged, with
// the run folder's save and tensorboard_dir, and the data paths dropped under mock_data (as
// Primus's trainer does); a null num_query_groups under grouped-query attention becomes the
// head count, as Megatron reads Primus's None. Raises UsageError naming the file for
// anything Primus refuses.
yaml::Node load_primus_experiment(const std::string& path,
                                  const std::map<std::string, std::string>& env);

}  // namespace omni
