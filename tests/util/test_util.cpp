#include "util/test_util.h"

#include "cabm/core/error.h"
#include "cabm/core/threads.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

namespace cabm::test {

Tensor random_tensor(const Shape& shape, uint64_t seed, float lo, float hi) {
  Tensor t = Tensor::empty(shape);
  float* p = t.data<float>();
  Rng rng(seed);
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = lo + (hi - lo) * rng.next_uniform();
  return t;
}

TextSplit placeholder_text() {
  TextSplit t;
  t.source = "placeholder";
  t.train = std::string(256, 'a');
  t.validation = std::string(256, 'b');
  return t;
}

std::vector<Tensor> micro_batches(const Tensor& batch, int64_t parts) {
  const int64_t rows = batch.size(0) / parts;
  CABM_CHECK(rows * parts == batch.size(0), "{} rows do not split into {} equal micro-batches", batch.size(0), parts);
  std::vector<Tensor> out;
  for (int64_t m = 0; m < parts; ++m) out.push_back(batch.narrow(0, m * rows, rows).clone());
  return out;
}

int env_int(const char* name, int fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? std::atoi(value) : fallback;
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

ScopedThreads::ScopedThreads(int threads) : previous_(num_threads()) {
  set_num_threads(threads);
}
ScopedThreads::~ScopedThreads() {
  set_num_threads(previous_);
}

ScopedEnv::ScopedEnv(const char* name, const char* value) : name_(name) {
  const char* old = std::getenv(name);
  was_set_ = old != nullptr;
  if (was_set_) previous_ = old;
  if (value)
    ::setenv(name, value, 1);
  else
    ::unsetenv(name);
}

ScopedEnv::~ScopedEnv() {
  if (was_set_)
    ::setenv(name_.c_str(), previous_.c_str(), 1);
  else
    ::unsetenv(name_.c_str());
}

std::string fixtures_dir() {
  return CABM_FIXTURES_DIR;
}
std::string cabm_binary() {
  return CABM_BINARY;
}

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

CmdResult run_cabm_limited(const std::vector<std::string>& args, const RunLimits& limits) {
  static int counter = 0;
  const std::string stem = temp_dir() + "/limited-" + std::to_string(counter++);
  const std::string out = stem + ".out", err = stem + ".err";
  std::vector<std::string> argv_strings = {cabm_binary()};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_strings) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_strings = {"CABM_NUM_THREADS=2"};
  std::string asan_options = "allocator_may_return_null=1";
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    if (kAddressSanitizer && entry.rfind("ASAN_OPTIONS=", 0) == 0)
      asan_options = entry.substr(13) + ":" + asan_options;
    else if (entry.rfind("CABM_NUM_THREADS=", 0) != 0)
      env_strings.push_back(entry);
  }
  if (kAddressSanitizer) env_strings.push_back("ASAN_OPTIONS=" + asan_options);
  std::vector<char*> envp;
  for (std::string& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {  // the child: only async-signal-safe calls until exec
    const int in_fd = open("/dev/null", O_RDONLY);
    const int out_fd = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int err_fd = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (in_fd < 0 || out_fd < 0 || err_fd < 0) _exit(126);
    dup2(in_fd, 0);
    dup2(out_fd, 1);
    dup2(err_fd, 2);
    if (limits.address_space > 0 && !kAddressSanitizer) {
      const rlimit r{limits.address_space, limits.address_space};
      if (setrlimit(RLIMIT_AS, &r) != 0) _exit(126);
    }
    if (limits.cpu_seconds > 0) {
      const rlimit r{static_cast<rlim_t>(limits.cpu_seconds), static_cast<rlim_t>(limits.cpu_seconds)};
      if (setrlimit(RLIMIT_CPU, &r) != 0) _exit(126);
    }
    if (limits.umask >= 0) umask(static_cast<mode_t>(limits.umask));
    execve(argv[0], argv.data(), envp.data());
    _exit(127);
  }
  int raw = 0;
  while (waitpid(pid, &raw, 0) < 0 && errno == EINTR) {
  }
  CmdResult r;
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  r.signal = WIFSIGNALED(raw) ? WTERMSIG(raw) : 0;
  r.out = read_file(out);
  r.err = read_file(err);
  return r;
}

void expect_one_line_error(const CmdResult& r, const std::string& needle) {
  EXPECT_NE(r.status, 0) << r.out;
  ASSERT_FALSE(r.err.empty());
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "more than one line:\n" << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
}

bool address_limits_take_effect() {
  static const bool takes = [] {
    const pid_t pid = fork();
    if (pid == 0) {
      constexpr rlim_t kLimit = rlim_t{1} << 30;
      const rlimit set{kLimit, kLimit};
      rlimit got{};
      _exit(setrlimit(RLIMIT_AS, &set) == 0 && getrlimit(RLIMIT_AS, &got) == 0 && got.rlim_cur == kLimit ? 0 : 1);
    }
    int raw = 0;
    return pid > 0 && waitpid(pid, &raw, 0) == pid && WIFEXITED(raw) && WEXITSTATUS(raw) == 0;
  }();
  return takes;
}

}  // namespace cabm::test
