#include "base/error.h"
#include "cli/commands.h"

namespace omni::cli {

int convert(const std::vector<std::string>&) {
  throw UsageError("omnitron convert is not built yet");
}

}  // namespace omni::cli
