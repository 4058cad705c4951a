#include "cabm/core/error.h"

#include <cstring>

namespace cabm::detail {

void check_failed(const char* file, int line, const char* condition, const std::string& message) {
  // Keep the path short: the part after the last "cabm/" or the basename.
  const char* slash = std::strrchr(file, '/');
  const char* name = slash ? slash + 1 : file;
  throw Error(fmt::format("{}:{}: {} (check failed: {})", name, line, message, condition));
}

}  // namespace cabm::detail
