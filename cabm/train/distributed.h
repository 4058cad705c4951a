// Data parallelism over MPI (Open MPI): the few collectives the training loop needs.
//
// A process started by `mpirun -np K` is rank r of K; any other process (or a build without
// MPI) is rank 0 of 1, and every call below is then a no-op or the identity, so the training
// loop has one code path. MPI is initialised on first use, and only when the environment shows
// an MPI launcher; it is finalised at exit.
//
// Gradient averaging is a sum over ranks (MPI_Allreduce) divided by K, in buckets of at most
// kGradientBucketBytes: one collective per bucket instead of one per tensor, and a bounded
// staging buffer, allocated once.
#pragma once

#include "cabm/nn/parameters.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace cabm {

inline constexpr size_t kGradientBucketBytes = size_t{8} << 20;

struct World {
  int rank = 0;
  int size = 1;
  bool distributed() const { return size > 1; }
};

// This process's place in the job (initialises MPI on the first call under a launcher).
// Throws cabm::Error when started by an MPI launcher with K > 1 but built without MPI: K
// copies training alone into one directory would be a silent wrong result.
const World& world();

// True once world() has started MPI in this process (a data-parallel run); never starts it.
bool mpi_started();

// True when this build of cabm can run data-parallel (it was built with MPI).
bool built_with_mpi();

// grads ← (Σ over ranks of grads) / K, identically on every rank. Returns the seconds spent.
double all_reduce_mean(const NamedTensors& grads);
// Sums of a few scalars over ranks (losses, token counts).
void all_reduce_sum(std::vector<double>& values);
// True on every rank when `flag` is true on any.
bool any_rank(bool flag);
// Copies rank 0's tensors (weights, optimizer moments) and bytes to every rank.
void broadcast_from_rank0(const NamedTensors& tensors);
void broadcast_from_rank0(void* data, size_t bytes);
// An order-sensitive checksum of the tensors' bytes, equal on all ranks or a cabm::Error
// naming the first rank that differs (the ranks' weights must step identically).
void check_same_on_all_ranks(const NamedTensors& tensors, const std::string& what);

// Ends every rank of the job with `status` (MPI_Abort): an error on one rank must not leave
// the others waiting in a collective. Without MPI it returns.
void abort_job(int status);

}  // namespace cabm
