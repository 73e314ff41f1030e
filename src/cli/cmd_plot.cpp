#include "base/error.h"
#include "cli/commands.h"

namespace omni::cli {

int plot(const std::vector<std::string>&) {
  throw UsageError("omnitron plot is not built yet");
}

}  // namespace omni::cli
