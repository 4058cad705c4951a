// The `cabm` command's OpenMP environment (cli/main.cpp): where the user has set neither
// GOMP_SPINCOUNT nor OMP_WAIT_POLICY it sets GOMP_SPINCOUNT and executes itself again, except
// where the user asks OpenMP to bind threads (OMP_PROC_BIND, OMP_PLACES, GOMP_CPU_AFFINITY): libgomp
// binds the first thread when it is loaded, and a second image would inherit that one CPU. Seen
// through OMP_DISPLAY_ENV, which libgomp prints once per loaded image ("OPENMP DISPLAY ENVIRONMENT
// BEGIN", the OpenMP specification's words) with the places it will bind to.
#include "cabm/kernels/cpu_isa.h"
#include "cabm/kernels/openblas_core.h"
#include "util/test_util.h"

#include <sched.h>

#include <cstdlib>
#include <string>

namespace cabm {
namespace {

// stdout and stderr of `cabm --version` run with OMP_DISPLAY_ENV=true, the OpenMP variables this
// file is about cleared and then `assignments` (VAR=value ...) set. OPENBLAS_CORETYPE names the
// kernels this process's OpenBLAS runs, so that cabm never runs again for OpenBLAS's sake
// (kernels/openblas_core.h), unless `name_blas_kernels` is false (then it is cleared).
std::string version_with_env(const std::string& assignments, bool name_blas_kernels = true) {
  const std::string out = test::temp_dir() + "/openmp_env.txt";
  const std::string blas = name_blas_kernels ? "OPENBLAS_CORETYPE=" + openblas_core() : "";
  const std::string cmd =
      "env -u GOMP_SPINCOUNT -u OMP_WAIT_POLICY -u OMP_PROC_BIND -u OMP_PLACES -u GOMP_CPU_AFFINITY " +
      std::string(name_blas_kernels ? "" : "-u OPENBLAS_CORETYPE ") + "OMP_DISPLAY_ENV=true " + blas + " " +
      assignments + " " + test::cabm_binary() + " --version >" + out + " 2>&1 </dev/null";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  return test::read_file(out);
}

int count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// The value of the last OMP_PLACES line, "" if none.
std::string last_places(const std::string& text) {
  const std::string key = "OMP_PLACES = '";
  const size_t at = text.rfind(key);
  if (at == std::string::npos) return "";
  const size_t begin = at + key.size();
  return text.substr(begin, text.find('\'', begin) - begin);
}

constexpr const char* kBegin = "OPENMP DISPLAY ENVIRONMENT BEGIN";

TEST(CliOpenmpEnv, SetsTheSpinCountByRunningAgain) {
  const std::string text = version_with_env("");
  EXPECT_EQ(count(text, kBegin), 2) << text;  // the first image, then the one with GOMP_SPINCOUNT
  EXPECT_NE(text.find("cabm 0."), std::string::npos) << text;
}

TEST(CliOpenmpEnv, LeavesAChosenWaitPolicyAlone) {
  EXPECT_EQ(count(version_with_env("GOMP_SPINCOUNT=300000"), kBegin), 1);
  EXPECT_EQ(count(version_with_env("OMP_WAIT_POLICY=active"), kBegin), 1);
}

// The same once for OpenBLAS's kernels, where OpenBLAS took its generic ones on a CPU that runs
// better (kernels/openblas_core.h): one image more, never a loop.
TEST(CliOpenmpEnv, RunsAgainOnceForOpenBlasKernels) {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr)
    GTEST_SKIP() << "OPENBLAS_CORETYPE is set here: OpenBLAS's own choice is not known";
  const SimdIsa best = widest_simd_isa();
  const int images = openblas_core_to_request(openblas_core(), best) != nullptr ? 2 : 1;
  EXPECT_EQ(count(version_with_env("GOMP_SPINCOUNT=300000", false), kBegin), images);
  EXPECT_EQ(count(version_with_env("", false), kBegin), 2);  // both at once: one image more
}

TEST(CliOpenmpEnv, KeepsEveryCpuWhenThreadsAreBound) {
  for (const char* binding :
       {"OMP_PROC_BIND=true", "OMP_PROC_BIND=spread,close", "OMP_PLACES=threads", "GOMP_CPU_AFFINITY=0-1023"}) {
    SCOPED_TRACE(binding);
    const std::string text = version_with_env(binding);
    EXPECT_EQ(count(text, kBegin), 1) << text;
  }
  // OMP_PROC_BIND=false binds nothing: the spin count is set as without it.
  EXPECT_EQ(count(version_with_env("OMP_PROC_BIND=FALSE"), kBegin), 2);

  // What the second image cost: with one place per CPU, the places libgomp reports are every CPU
  // this process may run on, not the one the first image's thread was bound to.
  cpu_set_t allowed;
  ASSERT_EQ(sched_getaffinity(0, sizeof allowed, &allowed), 0);
  const int cpus = CPU_COUNT(&allowed);
  if (cpus < 2) GTEST_SKIP() << "one CPU allowed: binding cannot narrow it";
  const std::string places = last_places(version_with_env("OMP_PROC_BIND=true OMP_PLACES=threads"));
  EXPECT_EQ(count(places, "{"), cpus) << places;
}

}  // namespace
}  // namespace cabm
