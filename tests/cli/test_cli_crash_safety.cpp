// Issue 16, crash safety: `cabm train` is killed with SIGKILL at random moments and right after
// each file of a checkpoint save appears (the hidden .tmp-step-* directory, each file inside it
// and its temporary name, the renamed step-N, latest.tmp.*, the new `latest`, the .old-step-*
// of a re-save), then resumed, several generations in a row. After every kill, `latest` names a
// complete checkpoint that `cabm eval` loads and every step-* directory loads; when a chain of
// kills and resumes finishes, nothing of a killed save is left and model.safetensors and
// optimizer.safetensors are byte for byte those of an uninterrupted run (--threads 1, one seed).
//
// The kill timing varies with the machine's load; the assertions hold for every timing (a kill
// that comes after the run has finished only ends that chain). docs/reliability.md ("Crash
// safety, tested") reports what the kills hit.
#include "cabm/train/checkpoint.h"
#include "cabm/train/model_config.h"
#include "util/test_util.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <thread>

extern char** environ;

namespace cabm {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr int kSteps = 30;
constexpr auto kRunTimeout = 60s;  // one generation of a tiny run; beyond it the test fails

std::string path(const std::string& name) {
  return test::temp_dir() + "/" + name;
}

std::string data_file() {
  const std::string p = path("text.txt");
  if (!fs::exists(p)) {
    std::ofstream out(p);
    for (int i = 0; i < 80; ++i) out << "Line " << i << ": the quick brown fox jumps over the lazy dog.\n";
  }
  return p;
}

// A checkpoint every step, so that most moments of a run are inside or near a save.
std::vector<std::string> train_args(const std::string& out, bool resume) {
  if (resume) return {"train", "--resume", "--out", out, "--threads", "1"};
  return {"train",
          "--data",
          data_file(),
          "--out",
          out,
          "--layers",
          "2",
          "--heads",
          "2",
          "--d-model",
          "32",
          "--d-ff",
          "64",
          "--seq-len",
          "16",
          "--batch-size",
          "4",
          "--steps",
          std::to_string(kSteps),
          "--warmup",
          "3",
          "--lr",
          "3e-3",
          "--checkpoint-interval",
          "1",
          "--eval-interval",
          "5",
          "--eval-windows",
          "4",
          "--sample-tokens",
          "0",
          "--seed",
          "7",
          "--threads",
          "1"};
}

// One `cabm` process, spawned without a shell so that its pid is the one to kill. The
// destructor kills and reaps it if it is still running, so that no assertion leaves a child.
class Child {
 public:
  Child(const std::vector<std::string>& args, const std::string& log) {
    std::vector<std::string> argv_strings = {test::cabm_binary()};
    argv_strings.insert(argv_strings.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& a : argv_strings) argv.push_back(a.data());
    argv.push_back(nullptr);
    // One thread and oneDNN for every product: bit for bit the same arithmetic in every process.
    std::vector<std::string> env_strings = {"CABM_NUM_THREADS=1", "CABM_GEMM=onednn"};
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string entry(*e);
      if (entry.rfind("CABM_NUM_THREADS=", 0) != 0 && entry.rfind("CABM_GEMM=", 0) != 0) env_strings.push_back(entry);
    }
    std::vector<char*> envp;
    for (std::string& e : env_strings) envp.push_back(e.data());
    envp.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    const int rc = posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) throw std::runtime_error(std::string("posix_spawn: ") + std::strerror(rc));
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child() { kill_and_reap(); }

  pid_t pid() const { return pid_; }

  // Whether it is still running (reaps it when it has ended).
  bool running() {
    if (reaped_) return false;
    int raw = 0;
    const pid_t r = waitpid(pid_, &raw, WNOHANG);
    if (r == pid_) {
      reaped_ = true;
      raw_ = raw;
    }
    return !reaped_;
  }

  // Waits for it to end, for at most `timeout`; true if it exited with status 0. A child still
  // running at the timeout is killed.
  bool wait_for(std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    while (running() && Clock::now() < deadline) std::this_thread::sleep_for(2ms);
    if (running()) {
      ADD_FAILURE() << "cabm (pid " << pid_ << ") still running after " << timeout.count() << " ms";
      kill_and_reap();
    }
    return exited_ok();
  }

  // SIGKILL (if still running) and reap. Returns whether the kill found it running.
  bool kill_and_reap() {
    if (!running()) return false;
    ::kill(pid_, SIGKILL);
    while (waitpid(pid_, &raw_, 0) < 0 && errno == EINTR) {
    }
    reaped_ = true;
    return WIFSIGNALED(raw_) && WTERMSIG(raw_) == SIGKILL;
  }

  bool exited_ok() const { return reaped_ && WIFEXITED(raw_) && WEXITSTATUS(raw_) == 0; }

 private:
  pid_t pid_ = -1;
  int raw_ = 0;
  bool reaped_ = false;
};

bool is_step_dir_name(const std::string& name) {
  return name.size() == 13 && name.rfind("step-", 0) == 0 &&
         std::all_of(name.begin() + 5, name.end(), [](char c) { return c >= '0' && c <= '9'; });
}

std::string trimmed(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

// A step directory must hold the three files of a checkpoint and load for resuming (the model
// built from it), with state.json's step matching its name.
void expect_loads(const std::string& dir) {
  std::set<std::string> files;
  for (const auto& entry : fs::directory_iterator(dir)) files.insert(entry.path().filename().string());
  EXPECT_EQ(files, (std::set<std::string>{kModelFile, kOptimizerFile, kStateFile})) << dir;
  const std::string error = test::error_of([&] {
    const LoadedCheckpoint c = load_checkpoint(dir, true);
    load_causal_lm(c.model);
    EXPECT_EQ(checkpoint_step(c), std::stoll(fs::path(dir).filename().string().substr(5))) << dir;
  });
  EXPECT_EQ(error, "") << dir;
}

// What every kill must leave: `latest`, if present, names a complete checkpoint that `cabm
// eval` loads; every step-* directory loads.
void expect_consistent(const std::string& run) {
  if (!fs::exists(run)) return;  // killed before its first save
  for (const auto& entry : fs::directory_iterator(run))
    if (entry.is_directory() && is_step_dir_name(entry.path().filename().string())) expect_loads(entry.path());
  const std::string latest = run + "/" + kLatestFile;
  if (!fs::exists(latest)) return;
  const std::string name = trimmed(test::read_file(latest));
  ASSERT_TRUE(is_step_dir_name(name)) << "latest: '" << name << "'";
  ASSERT_TRUE(fs::is_directory(run + "/" + name)) << "latest names " << name << ", which is missing";
  const test::CmdResult eval =
      test::run_cabm_limited({"eval", "--checkpoint", run, "--threads", "1", "--max-windows", "2"});
  EXPECT_EQ(eval.status, 0) << eval.out << eval.err;
}

// Nothing of a killed save is left once a save has completed, and the result is the
// uninterrupted run's, byte for byte.
void expect_finished_like(const std::string& run, const std::string& reference) {
  for (const auto& entry : fs::directory_iterator(run))
    EXPECT_FALSE(is_save_leftover(entry.path().filename().string())) << entry.path();
  ASSERT_EQ(trimmed(test::read_file(run + "/" + kLatestFile)), fmt::format("step-{:08d}", kSteps));
  const std::string last = fmt::format("/step-{:08d}/", kSteps);
  for (const char* file : {kModelFile, kOptimizerFile}) {
    const std::string got = test::read_file(run + last + file), want = test::read_file(reference + last + file);
    EXPECT_FALSE(want.empty()) << file;
    EXPECT_TRUE(got == want) << file << " differs from the uninterrupted run's (" << got.size() << " vs " << want.size()
                             << " bytes)";
  }
}

// The uninterrupted run, once per test process; its wall time bounds the random kill delays.
struct Reference {
  std::string dir;
  std::chrono::milliseconds duration{0};
};
const Reference& reference() {
  static const Reference ref = [] {
    Reference r;
    r.dir = path("reference");
    const auto start = Clock::now();
    Child child(train_args(r.dir, false), path("reference.log"));
    EXPECT_TRUE(child.wait_for(kRunTimeout)) << test::read_file(path("reference.log"));
    r.duration = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
    return r;
  }();
  return ref;
}

// Where a save can be interrupted, in the order a save passes them.
enum class Point {
  kTempDir,        // .tmp-step-N-PID-K created
  kModelTemp,      // .tmp-step-*/model.safetensors.tmp.*
  kModel,          // .tmp-step-*/model.safetensors
  kOptimizerTemp,  // .tmp-step-*/optimizer.safetensors.tmp.*
  kOptimizer,      // .tmp-step-*/optimizer.safetensors
  kStateTemp,      // .tmp-step-*/state.json.tmp.*
  kState,          // .tmp-step-*/state.json
  kOldStep,        // .old-step-N-PID: a re-saved step moved aside (after a kill at kStepDir)
  kStepDir,        // a new step-N (renamed from the temporary directory)
  kLatestTemp,     // latest.tmp.PID
  kLatest,         // `latest` replaced (housekeeping follows)
  kDeleting,       // .old-step-N-PID after `latest` was replaced: a checkpoint beyond --keep being deleted
  kCount
};
constexpr std::array<const char*, static_cast<size_t>(Point::kCount)> kPointNames = {".tmp-step-*/",
                                                                                     "model.safetensors.tmp.*",
                                                                                     "model.safetensors",
                                                                                     "optimizer.safetensors.tmp.*",
                                                                                     "optimizer.safetensors",
                                                                                     "state.json.tmp.*",
                                                                                     "state.json",
                                                                                     ".old-step-*",
                                                                                     "step-N",
                                                                                     "latest.tmp.*",
                                                                                     "latest",
                                                                                     ".old-step-* (deleting)"};

using Inodes = std::map<std::string, ino_t>;

Inodes top_level(const std::string& run) {
  Inodes out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(run, ec)) {
    struct stat st {};
    if (::lstat(entry.path().c_str(), &st) == 0) out[entry.path().filename().string()] = st.st_ino;
  }
  return out;
}

// The points of a save by process `pid` visible now in `run` that were not there in `before`.
std::vector<Point> visible_points(const std::string& run, pid_t pid, const Inodes& before) {
  std::vector<Point> seen;
  bool latest_replaced = false, old_step = false;
  const std::string pid_part = fmt::format("-{}", pid);
  std::error_code ec;
  for (const auto& [name, inode] : top_level(run)) {
    const auto old = before.find(name);
    const bool is_new = old == before.end() || old->second != inode;
    if (name.rfind(".tmp-step-", 0) == 0 && name.find(pid_part + "-") != std::string::npos) {
      seen.push_back(Point::kTempDir);
      for (const auto& entry : fs::directory_iterator(run + "/" + name, ec)) {
        const std::string f = entry.path().filename().string();
        for (const auto& [file, done, temp] : {std::tuple{kModelFile, Point::kModel, Point::kModelTemp},
                                               std::tuple{kOptimizerFile, Point::kOptimizer, Point::kOptimizerTemp},
                                               std::tuple{kStateFile, Point::kState, Point::kStateTemp}}) {
          if (f == file) seen.push_back(done);
          if (f.rfind(std::string(file) + ".tmp.", 0) == 0) seen.push_back(temp);
        }
      }
    } else if (name.rfind(".old-step-", 0) == 0 && name.find(pid_part) != std::string::npos) {
      old_step = true;
    } else if (is_new && is_step_dir_name(name)) {
      seen.push_back(Point::kStepDir);
    } else if (name == std::string(kLatestFile) + kAtomicTempInfix + std::to_string(pid)) {
      seen.push_back(Point::kLatestTemp);
    } else if (is_new && name == kLatestFile) {
      seen.push_back(Point::kLatest);
      latest_replaced = true;
    }
  }
  if (old_step) seen.push_back(latest_replaced ? Point::kDeleting : Point::kOldStep);
  return seen;
}

// Tallies for the report: kills per point, kills that found the run finished, completed chains.
struct Tally {
  std::array<int, static_cast<size_t>(Point::kCount)> at{};
  int random = 0, after_exit = 0, chains_finished = 0, generations = 0;
  void print(const char* what) const {
    std::string line = fmt::format(
        "{}: {} generations, {} chains finished like the reference run, {} kills "
        "found the run finished",
        what, generations, chains_finished, after_exit);
    if (random > 0) line += fmt::format(", {} random kills", random);
    for (size_t i = 0; i < at.size(); ++i)
      if (at[i] > 0) line += fmt::format("; {} × at {}", at[i], kPointNames[i]);
    std::printf("%s\n", line.c_str());
  }
};

// Drives one run directory through kills and resumes: start() spawns the next generation
// (a resume when `latest` exists, else a fresh run), after_kill() checks the directory, and a
// generation that exits by itself must have finished like the reference run.
class Chain {
 public:
  Chain(const std::string& run, Tally& tally) : run_(run), tally_(tally) {}

  std::unique_ptr<Child> start() {
    ++tally_.generations;
    before_ = top_level(run_);
    const bool resume = fs::exists(run_ + "/" + kLatestFile);
    return std::make_unique<Child>(train_args(run_, resume), run_ + ".log");
  }
  const Inodes& before() const { return before_; }

  // After a SIGKILL (`killed`: the kill found it running) or a natural end of `child`.
  void after(Child& child, bool killed) {
    if (!killed) {  // it had already finished (or failed): the chain ends here
      ++tally_.after_exit;
      ASSERT_TRUE(child.exited_ok()) << test::read_file(run_ + ".log");
      expect_finished_like(run_, reference().dir);
      ++tally_.chains_finished;
      // The next generation starts afresh (replacing this run).
      fs::remove_all(run_);
      return;
    }
    expect_consistent(run_);
  }

  // Resumes to the end without kills and compares with the reference.
  void finish() {
    std::unique_ptr<Child> child = start();
    ASSERT_TRUE(child->wait_for(kRunTimeout)) << test::read_file(run_ + ".log");
    expect_finished_like(run_, reference().dir);
    ++tally_.chains_finished;
  }

 private:
  std::string run_;
  Tally& tally_;
  Inodes before_;
};

TEST(CrashSafety, ReferenceRunIsReproducible) {
  // Two uninterrupted runs agree byte for byte: the premise of every comparison below.
  const Reference& ref = reference();
  ASSERT_GT(ref.duration.count(), 0);
  const std::string again = path("reference-again");
  Child child(train_args(again, false), again + ".log");
  ASSERT_TRUE(child.wait_for(kRunTimeout)) << test::read_file(again + ".log");
  expect_finished_like(again, ref.dir);
  std::printf("uninterrupted run: %lld ms\n", static_cast<long long>(ref.duration.count()));
}

TEST(CrashSafety, ResumingAFinishedRunRemovesLeftovers) {
  // A kill after the last save's `latest` update but before its housekeeping leaves a finished
  // run with what earlier kills left; the resume that finds nothing to train removes it.
  const std::string run = path("finished");
  fs::copy(reference().dir, run, fs::copy_options::recursive);
  std::ofstream(run + "/latest.tmp.4242") << "step-00000029\n";
  fs::create_directories(run + "/.tmp-step-00000030-4242-0");
  fs::copy(reference().dir + fmt::format("/step-{:08d}", kSteps), run + "/.old-step-00000030-4242");
  Child child(train_args(run, true), run + ".log");
  ASSERT_TRUE(child.wait_for(kRunTimeout)) << test::read_file(run + ".log");
  expect_finished_like(run, reference().dir);
}

TEST(CrashSafety, RandomKillsThenResume) {
  const Reference& ref = reference();
  std::mt19937 rng(20240516);
  std::uniform_real_distribution<double> fraction(0.0, 1.0);
  Tally tally;
  const std::string run = path("random");
  Chain chain(run, tally);
  // Ten kills that find the run running (a delay past the end only ends that chain: the run is
  // compared with the reference and the next one starts afresh); at most 30 generations.
  for (int generation = 0; tally.random < 10 && generation < 30; ++generation) {
    // A delay within what is left of the run: the uninterrupted run's time scaled by the steps
    // that remain after `latest`, plus the start-up.
    int64_t done = 0;
    if (fs::exists(run + "/" + kLatestFile))
      done = std::stoll(trimmed(test::read_file(run + "/" + kLatestFile)).substr(5));
    const double left_ms = 100.0 + static_cast<double>(ref.duration.count()) * (kSteps - done) / kSteps;
    std::unique_ptr<Child> child = chain.start();
    std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int64_t>(1000.0 * left_ms * fraction(rng))));
    const bool killed = child->kill_and_reap();
    tally.random += killed;
    chain.after(*child, killed);
    if (HasFatalFailure()) return;
  }
  chain.finish();
  tally.print("random kills");
}

TEST(CrashSafety, KillsAtEveryCheckpointFile) {
  reference();
  Tally tally;
  Chain chain(path("points"), tally);
  // Two rounds over the points; .old-step-* exists only when re-saving a step, so it is aimed at
  // right after a kill at step-N (which leaves step-N whole and `latest` naming the one before).
  std::vector<Point> targets;
  for (int round = 0; round < 2; ++round)
    for (Point p : {Point::kTempDir, Point::kModelTemp, Point::kModel, Point::kOptimizerTemp, Point::kOptimizer,
                    Point::kStateTemp, Point::kState, Point::kStepDir, Point::kOldStep, Point::kLatestTemp,
                    Point::kLatest, Point::kDeleting})
      targets.push_back(p);
  for (const Point target : targets) {
    std::unique_ptr<Child> child = chain.start();
    // Poll every ~1 ms; kill at the target, or at `latest`'s replacement if the target was not
    // seen in this save (too brief for the poll, or, for .old-step-*, not a re-save). A deletion
    // (microseconds) is waited for over the generation's saves.
    const auto deadline = Clock::now() + kRunTimeout;
    bool killed = false;
    while (child->running() && Clock::now() < deadline) {
      const std::vector<Point> seen = visible_points(path("points"), child->pid(), chain.before());
      const bool hit = std::find(seen.begin(), seen.end(), target) != seen.end();
      const bool latest = std::find(seen.begin(), seen.end(), Point::kLatest) != seen.end();
      if (hit || (latest && target != Point::kDeleting)) {
        killed = child->kill_and_reap();
        if (killed) ++tally.at[static_cast<size_t>(hit ? target : Point::kLatest)];
        break;
      }
      std::this_thread::sleep_for(1ms);
    }
    ASSERT_LT(Clock::now(), deadline) << "no save within " << kRunTimeout.count() << " s";
    if (!killed) child->kill_and_reap();  // ended by itself: reaped here
    chain.after(*child, killed);
    if (HasFatalFailure()) return;
  }
  chain.finish();
  tally.print("kills at checkpoint files");
}

}  // namespace
}  // namespace cabm
