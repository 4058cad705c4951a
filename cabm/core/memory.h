// How much memory this process may use, so that work whose size comes from a file or a flag
// can be refused before it allocates, with a message that says why, instead of filling the
// machine until the kernel's OOM killer ends the process (Linux overcommits: a large malloc
// succeeds and fails only when its pages are touched).
#pragma once

#include <cstdint>
#include <string>

namespace cabm {

// The smallest of: physical memory plus swap, the address-space and data-segment limits
// (ulimit -v, ulimit -d) and the memory.max of this process's cgroup (cgroup v2, containers).
// Read once per call; cheap (a few small files).
int64_t memory_limit_bytes();

// Throws cabm::Error when `bytes` (an estimate of what `what` will allocate: a lower bound, so
// that nothing that would fit is refused) exceeds memory_limit_bytes():
//   "{what} needs at least 12.0 GiB of memory; this process can use 2.0 GiB"
void check_fits_in_memory(double bytes, const std::string& what);

std::string human_bytes(double bytes);  // "1.5 GiB", "512 B"

}  // namespace cabm
