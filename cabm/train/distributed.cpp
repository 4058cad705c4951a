#include "cabm/train/distributed.h"

#include "cabm/core/error.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>

#if defined(CABM_HAVE_MPI)
#include <mpi.h>
#endif

namespace cabm {

namespace {

// The size the launcher announces (Open MPI, PMIx, MPICH/Hydra), or 0 outside a launcher.
int launcher_size() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "PMI_SIZE"})
    if (const char* v = std::getenv(name); v != nullptr && *v != '\0') return std::atoi(v);
  return std::getenv("PMIX_RANK") != nullptr ? 1 : 0;
}

#if defined(CABM_HAVE_MPI)

void check_mpi(int status, const char* what) {
  if (status == MPI_SUCCESS) return;
  char message[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(status, message, &length);
  throw Error(fmt::format("MPI: {} failed: {}", what, std::string(message, static_cast<size_t>(length))));
}

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

World start_world() {
  World w;
  if (launcher_size() == 0) return w;  // not started by mpirun: one process, no MPI at all
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    // Only the thread that calls cabm's functions talks to MPI; OpenMP workers never do.
    int provided = 0;
    check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
    std::atexit(finalize_at_exit);
  }
  // Errors come back as codes (check_mpi turns them into cabm::Error) instead of aborting.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &w.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &w.size);
  return w;
}

#else

World start_world() {
  if (launcher_size() > 1)
    throw Error(fmt::format(
        "started as one of {} MPI processes, but this cabm was built without MPI (install libopenmpi-dev and "
        "rebuild; scripts/setup.sh does): each process would train alone into the same directory",
        launcher_size()));
  return {};
}

#endif

#if defined(CABM_HAVE_MPI)
// Gradients are staged through one buffer (kGradientBucketBytes), reused by every step.
std::vector<float>& bucket() {
  static std::vector<float> buffer;
  return buffer;
}
#endif

}  // namespace

const World& world() {
  static const World w = start_world();
  return w;
}

bool mpi_started() {
#if defined(CABM_HAVE_MPI)
  int initialized = 0;
  MPI_Initialized(&initialized);
  return initialized != 0;
#else
  return false;
#endif
}

bool built_with_mpi() {
#if defined(CABM_HAVE_MPI)
  return true;
#else
  return false;
#endif
}

double all_reduce_mean(const NamedTensors& grads) {
  const World& w = world();
  if (!w.distributed()) return 0.0;
#if defined(CABM_HAVE_MPI)
  const auto start = std::chrono::steady_clock::now();
  const size_t capacity = kGradientBucketBytes / sizeof(float);
  std::vector<float>& staging = bucket();
  if (staging.size() < capacity) staging.resize(capacity);
  const float inv = 1.0f / static_cast<float>(w.size);
  // Walk the tensors in order, packing whole tensors (or pieces of a big one) into the bucket;
  // reduce when it is full, then scatter the means back.
  struct Piece {
    float* data;
    size_t count;
  };
  std::vector<Piece> pieces;
  size_t used = 0;
  const auto flush = [&] {
    if (used == 0) return;
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, staging.data(), static_cast<int>(used), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD),
              "MPI_Allreduce of the gradients");
    size_t offset = 0;
    for (const Piece& p : pieces) {
      for (size_t i = 0; i < p.count; ++i) p.data[i] = staging[offset + i] * inv;
      offset += p.count;
    }
    pieces.clear();
    used = 0;
  };
  for (const NamedTensor& g : grads) {
    CABM_CHECK(g.tensor.dtype() == DType::F32 && g.tensor.is_contiguous(), "gradient {} must be contiguous F32",
               g.name);
    float* data = g.tensor.data<float>();
    size_t remaining = static_cast<size_t>(g.tensor.numel());
    while (remaining > 0) {
      const size_t n = std::min(remaining, capacity - used);
      std::memcpy(staging.data() + used, data, n * sizeof(float));
      pieces.push_back({data, n});
      used += n;
      data += n;
      remaining -= n;
      if (used == capacity) flush();
    }
  }
  flush();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
#else
  (void)grads;
  return 0.0;
#endif
}

void all_reduce_sum(std::vector<double>& values) {
  if (!world().distributed() || values.empty()) return;
#if defined(CABM_HAVE_MPI)
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, values.data(), static_cast<int>(values.size()), MPI_DOUBLE, MPI_SUM,
                          MPI_COMM_WORLD),
            "MPI_Allreduce");
#endif
}

bool any_rank(bool flag) {
  if (!world().distributed()) return flag;
#if defined(CABM_HAVE_MPI)
  int value = flag ? 1 : 0;
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD), "MPI_Allreduce");
  return value != 0;
#else
  return flag;
#endif
}

void broadcast_from_rank0(void* data, size_t bytes) {
  if (!world().distributed() || bytes == 0) return;
#if defined(CABM_HAVE_MPI)
  auto* p = static_cast<char*>(data);
  constexpr size_t kChunk = size_t{1} << 30;  // counts are int
  for (size_t offset = 0; offset < bytes; offset += kChunk)
    check_mpi(MPI_Bcast(p + offset, static_cast<int>(std::min(kChunk, bytes - offset)), MPI_BYTE, 0, MPI_COMM_WORLD),
              "MPI_Bcast");
#else
  (void)data;
#endif
}

void broadcast_from_rank0(const NamedTensors& tensors) {
  for (const NamedTensor& t : tensors) {
    CABM_CHECK(t.tensor.is_contiguous(), "tensor {} must be contiguous", t.name);
    broadcast_from_rank0(t.tensor.raw_data(), t.tensor.nbytes());
  }
}

void check_same_on_all_ranks(const NamedTensors& tensors, const std::string& what) {
  const World& w = world();
  if (!w.distributed()) return;
  // FNV-1a over the bytes, in the list's order.
  uint64_t hash = 1469598103934665603ull;
  for (const NamedTensor& t : tensors) {
    const auto* p = static_cast<const unsigned char*>(t.tensor.raw_data());
    for (size_t i = 0; i < t.tensor.nbytes(); ++i) hash = (hash ^ p[i]) * 1099511628211ull;
  }
#if defined(CABM_HAVE_MPI)
  std::vector<uint64_t> all(static_cast<size_t>(w.size));
  check_mpi(MPI_Allgather(&hash, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD), "MPI_Allgather");
  for (int r = 1; r < w.size; ++r)
    if (all[static_cast<size_t>(r)] != all[0])
      throw Error(fmt::format("data parallelism: the {} of rank {} differ from rank 0's", what, r));
#else
  (void)what;
#endif
}

void abort_job(int status) {
#if defined(CABM_HAVE_MPI)
  if (world().distributed()) MPI_Abort(MPI_COMM_WORLD, status);
#else
  (void)status;
#endif
}

}  // namespace cabm
