// Model weights in a simple self-describing form: DIR/model.omw holds a text header
// (format version, the model's options as a command line, one line per tensor with
// its name, offset and shape) followed by the flat float32 values. Written under a
// temporary name and renamed, so an interrupted save never looks complete. Full
// checkpoints (optimizer, RNG, data position, resharding) are a later layer.
#pragma once

#include <string>
#include <vector>

#include "config/options.h"
#include "model/parameters.h"

namespace omni {

void save_weights(const std::string& dir, const Options& opts, const ParameterSet<float>& params);

// Reads DIR/model.omw: sets the model options in `opts` from the stored command line and
// returns the flat values. Throws UsageError naming the file on any mismatch.
std::vector<float> load_weights(const std::string& dir, Options& opts);
// Copies loaded values into `params`, checking that the layouts agree.
void assign_weights(ParameterSet<float>& params, const std::vector<float>& values,
                    const std::string& dir);

}  // namespace omni
