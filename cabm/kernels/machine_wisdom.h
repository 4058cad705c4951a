// What cabm measured about the machine it runs on, kept on disk like FFTW's wisdom, so that every
// process on one machine makes the same choices. Some choices change the bits of a result, not
// only its speed: which library runs a product (gemm_route.h), the attention kernels' tile sizes
// (from the FMA pipes counted by avx512_fmas_per_cycle(), cpu_isa.h) and whether bf16 products
// take vdpbf16ps (vdpbf16ps_to_fma_rate(), bf16.h). Measured anew in each process, a loaded
// machine could tip one of them the other way, and two runs of one command on one input would
// disagree in the last bits (seen: `cabm embed` run twice under ASan in the test suite, 731
// values of 6,144 off by up to 5.1e-7, because one process measured fewer than 1.5 FMAs per
// cycle and took the other attention tiles).
//
// The file: CABM_GEMM_WISDOM=PATH, else $XDG_CACHE_HOME/cabm/gemm_routes.tsv, else
// ~/.cache/cabm/gemm_routes.tsv; "off" keeps everything in memory (each process measures).
// One tab-separated line per fact: the machine (CPU model name, family and model, oneDNN and
// OpenBLAS builds), a key, then the fact's fields. Lines of another machine are ignored; for
// one key the first line wins, so two processes that measured at once agree on the one that
// reached the file first. Lines are appended with one write each (O_APPEND): concurrent writers
// do not interleave. A file that cannot be written leaves the facts in memory only.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace cabm {

namespace wisdom {

// The file now in use ("off": none): the test override, else the environment's choice above.
std::string path();
// This machine's name in the file.
const std::string& machine();
// The fields after machine and key of the first line of this machine for `key` with
// `field_count` fields there that `usable` accepts (when given); nullopt when there is none (or the
// file is off or unreadable).
std::optional<std::vector<std::string>> first(const std::string& key, size_t field_count,
                                              const std::function<bool(const std::vector<std::string>&)>& usable = {});
// Appends machine, key and `fields` as one line.
void append(const std::string& key, const std::vector<std::string>& fields);
// Tests: the file for this process (nullopt: the environment's again), and every measured value
// forgotten, as in a new process.
void reset(const std::optional<std::string>& path);

}  // namespace wisdom

// A measured number that decides how cabm computes on this machine: the first value the wisdom
// file holds for `name` on this machine, else measure() (kept in the file for the next process).
// Kept in memory for the process. Thread-safe; measurements are serialised.
double machine_value(const std::string& name, const std::function<double()>& measure);

// "machine values (FILE): avx512_fmas_per_cycle 1.85 (measured here), ..." for `cabm bench`; the
// values this process has asked for, in order of name.
std::string machine_values_summary();

}  // namespace cabm
