#include "cabm/core/memory.h"

#include "cabm/core/error.h"

#include <sys/resource.h>
#include <sys/sysinfo.h>

#include <algorithm>
#include <fstream>
#include <limits>

namespace cabm {

namespace {

// memory.max of the cgroup (v2) this process is in; "max" or unreadable: no limit.
int64_t cgroup_limit() {
  std::ifstream self("/proc/self/cgroup");
  std::string line;
  while (std::getline(self, line)) {
    if (line.rfind("0::", 0) != 0) continue;
    std::ifstream max("/sys/fs/cgroup" + line.substr(3) + "/memory.max");
    std::string value;
    if (!(max >> value) || value == "max") return std::numeric_limits<int64_t>::max();
    try {
      return std::stoll(value);
    } catch (const std::exception&) {
      return std::numeric_limits<int64_t>::max();
    }
  }
  return std::numeric_limits<int64_t>::max();
}

int64_t rlimit_bytes(int resource) {
  rlimit r{};
  if (getrlimit(resource, &r) != 0 || r.rlim_cur == RLIM_INFINITY) return std::numeric_limits<int64_t>::max();
  return static_cast<int64_t>(std::min<rlim_t>(r.rlim_cur, static_cast<rlim_t>(std::numeric_limits<int64_t>::max())));
}

}  // namespace

int64_t memory_limit_bytes() {
  int64_t limit = std::numeric_limits<int64_t>::max();
  struct sysinfo info {};
  if (sysinfo(&info) == 0) {
    const double total = (static_cast<double>(info.totalram) + static_cast<double>(info.totalswap)) * info.mem_unit;
    if (total > 0 && total < 9e18) limit = static_cast<int64_t>(total);
  }
  limit = std::min(limit, rlimit_bytes(RLIMIT_AS));
  limit = std::min(limit, rlimit_bytes(RLIMIT_DATA));
  return std::min(limit, cgroup_limit());
}

void check_fits_in_memory(double bytes, const std::string& what) {
  const int64_t limit = memory_limit_bytes();
  if (bytes > static_cast<double>(limit))
    throw Error(fmt::format("{} needs at least {} of memory; this process can use {}", what, human_bytes(bytes),
                            human_bytes(static_cast<double>(limit))));
}

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 8) {
    bytes /= 1024.0;
    ++u;
  }
  return u == 0 ? fmt::format("{:.0f} B", bytes) : fmt::format("{:.1f} {}", bytes, units[u]);
}

}  // namespace cabm
