#include "util/test_util.h"

#include "cabm/core/error.h"
#include "cabm/core/threads.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <sys/wait.h>
#include <unistd.h>

namespace cabm::test {

Tensor random_tensor(const Shape& shape, uint64_t seed, float lo, float hi) {
  Tensor t = Tensor::empty(shape);
  float* p = t.data<float>();
  Rng rng(seed);
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = lo + (hi - lo) * rng.next_uniform();
  return t;
}

Comparison compare(const Tensor& actual, const Tensor& expected, double rtol, double atol) {
  Comparison c;
  if (actual.shape() != expected.shape()) {
    c.ok = false;
    c.first_bad = "shape " + shape_str(actual.shape()) + " vs " + shape_str(expected.shape());
    return c;
  }
  const std::vector<float> a = actual.to_vector(), e = expected.to_vector();
  for (size_t i = 0; i < a.size(); ++i) {
    const bool both_nan = std::isnan(a[i]) && std::isnan(e[i]);
    const double diff = std::fabs(static_cast<double>(a[i]) - e[i]);
    const bool good = both_nan || (a[i] == e[i]) || diff <= atol + rtol * std::fabs(static_cast<double>(e[i]));
    if (!both_nan && std::isfinite(diff)) c.max_abs_diff = std::max(c.max_abs_diff, diff);
    if (!good && c.ok) {
      c.ok = false;
      c.first_bad = "index " + std::to_string(i) + ": " + std::to_string(a[i]) + " vs " + std::to_string(e[i]);
    }
  }
  return c;
}

ScopedThreads::ScopedThreads(int threads) : previous_(num_threads()) { set_num_threads(threads); }
ScopedThreads::~ScopedThreads() { set_num_threads(previous_); }

std::string fixtures_dir() { return CABM_FIXTURES_DIR; }
std::string cabm_binary() { return CABM_BINARY; }

std::string temp_dir() {
  static const std::string dir = [] {
    std::string pattern = (std::filesystem::temp_directory_path() / "cabm-test-XXXXXX").string();
    const char* made = mkdtemp(pattern.data());
    if (made == nullptr) throw std::runtime_error("cannot create a temporary directory");
    return std::string(made);
  }();
  return dir;
}

double rel_diff(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = a.to_vector(), y = b.to_vector();
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    num += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
    den += double(y[i]) * y[i];
  }
  return std::sqrt(num / den);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

CmdResult run_cabm(const std::string& args) {
  const std::string dir = temp_dir();
  const std::string cmd =
      "CABM_NUM_THREADS=2 " + cabm_binary() + " " + args + " >" + dir + "/stdout 2>" + dir + "/stderr </dev/null";
  const int raw = std::system(cmd.c_str());
  CmdResult r;
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  r.out = read_file(dir + "/stdout");
  r.err = read_file(dir + "/stderr");
  return r;
}

void expect_one_line_error(const CmdResult& r, const std::string& needle) {
  EXPECT_NE(r.status, 0) << r.out;
  ASSERT_FALSE(r.err.empty());
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "more than one line:\n" << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
}

}  // namespace cabm::test
