// machine_value: a measured number is taken from the wisdom file when this machine has a line for
// it, else measured once and written, so that every process on the machine computes alike.
#include "cabm/kernels/bf16.h"
#include "cabm/kernels/cpu_isa.h"
#include "cabm/kernels/gemm_route.h"
#include "cabm/kernels/machine_wisdom.h"
#include "util/test_util.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace cabm {
namespace {

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Measure {
  double value;
  int calls = 0;
  double operator()() {
    ++calls;
    return value;
  }
};

class MachineWisdom : public ::testing::Test {
 protected:
  void SetUp() override {
    file_ = test::temp_dir() + "/machine_wisdom_" + ::testing::UnitTest::GetInstance()->current_test_info()->name() +
            ".tsv";
    std::filesystem::remove(file_);
    wisdom::reset(file_);
  }
  void TearDown() override { wisdom::reset(std::nullopt); }
  double value(const std::string& name, Measure& m) {
    return machine_value(name, [&] { return m(); });
  }
  std::string file_;
};

TEST_F(MachineWisdom, MeasuredOnceThenReadByTheNextProcess) {
  Measure m{1.8525};
  EXPECT_EQ(value("probe", m), 1.8525);
  EXPECT_EQ(value("probe", m), 1.8525);
  EXPECT_EQ(m.calls, 1) << "kept for the process";
  EXPECT_EQ(read_all(file_), wisdom::machine() + "\tvalue probe\t1.8525\n");
  EXPECT_NE(machine_values_summary().find("probe 1.85 (measured here)"), std::string::npos) << machine_values_summary();
  EXPECT_NE(machine_values_summary().find(file_), std::string::npos);

  wisdom::reset(file_);  // a new process on the same machine, measuring something else
  Measure other{1.1};
  EXPECT_EQ(value("probe", other), 1.8525);
  EXPECT_EQ(other.calls, 0) << "read from the file";
  EXPECT_NE(machine_values_summary().find("probe 1.85 (from the file)"), std::string::npos) << machine_values_summary();
  EXPECT_EQ(value("another", other), 1.1) << "one line per name";
  EXPECT_EQ(other.calls, 1);
}

// The process takes the value as the file keeps it (6 significant digits), as the next one will.
TEST_F(MachineWisdom, TheValueAsWritten) {
  Measure m{1.0 / 3.0};
  const double v = value("third", m);
  EXPECT_EQ(v, 0.333333);
  wisdom::reset(file_);
  Measure n{0.5};
  EXPECT_EQ(value("third", n), v);
}

// For one name the first usable line of this machine wins: another machine's lines, lines of
// another form and values that are not finite numbers are passed over.
TEST_F(MachineWisdom, FirstUsableLineOfThisMachineWins) {
  const std::string& me = wisdom::machine();
  std::ofstream(file_) << "Some Other CPU (family 1 model 2) | oneDNN 9.9.9 | OpenBLAS x\tvalue rate\t7\n"
                       << me << "\tvalue rate\tabc\n"
                       << me << "\tvalue rate\tnan\n"
                       << me << "\tvalue rate\tinf\n"
                       << me << "\tvalue rate\t2.5x\n"
                       << me << "\tvalue rate\t\n"
                       << me << "\tvalue rate\t2\textra\n"
                       << me << "\tvalue rate\t1.25\n"
                       << me << "\tvalue rate\t0.5\n";
  Measure m{3};
  EXPECT_EQ(value("rate", m), 1.25);
  EXPECT_EQ(m.calls, 0);
}

// Two processes that measured at once both take the line that reached the file first.
TEST_F(MachineWisdom, ConcurrentMeasurementsAgreeOnTheFirstLine) {
  Measure m{2.0};
  const double v = machine_value("race", [&] {
    // While this process measures, another one writes its line.
    std::ofstream(file_, std::ios::app) << wisdom::machine() << "\tvalue race\t1.5\n";
    return m();
  });
  EXPECT_EQ(v, 1.5);
  EXPECT_NE(machine_values_summary().find("race 1.5 (from the file)"), std::string::npos) << machine_values_summary();
}

TEST_F(MachineWisdom, OffMeasuresInEveryProcess) {
  wisdom::reset("off");
  Measure m{1.75};
  EXPECT_EQ(value("probe", m), 1.75);
  wisdom::reset("off");
  EXPECT_EQ(value("probe", m), 1.75);
  EXPECT_EQ(m.calls, 2);
  EXPECT_FALSE(std::filesystem::exists("off"));
  EXPECT_FALSE(std::filesystem::exists(file_));
}

// A file that cannot be written (its folder cannot be made) costs the value nothing.
TEST_F(MachineWisdom, UnwritableFileKeepsTheValueInMemory) {
  const std::string blocker = file_ + ".notadir";
  std::ofstream(blocker) << "x";
  wisdom::reset(blocker + "/sub/wisdom.tsv");
  Measure m{1.5};
  EXPECT_EQ(value("probe", m), 1.5);
  EXPECT_EQ(value("probe", m), 1.5);
  EXPECT_EQ(m.calls, 1);
  std::filesystem::remove(blocker);
}

TEST_F(MachineWisdom, ThreadsAskingAtOnceMeasureOnce) {
  Measure m{1.25};
  std::vector<std::thread> threads;
  std::vector<double> got(4);
  for (int t = 0; t < 4; ++t) threads.emplace_back([&, t] { got[t] = value("shared", m); });
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(m.calls, 1);
  for (double g : got) EXPECT_EQ(g, 1.25);
}

// GEMM routes and machine values share the file; each reads only its own lines.
TEST_F(MachineWisdom, RoutesAndValuesShareTheFile) {
  Measure m{1.5};
  value("probe", m);
  reset_gemm_routes(file_);
  int trials = 0;
  const GemmTrial trial = [&](GemmLibrary library) {
    ++trials;
    return library == GemmLibrary::kOneDnn ? 1e-3 : 2e-3;
  };
  const GemmShape shape{true, false, 1024, 256, 4096, 1024, 256, 256, 2};
  EXPECT_EQ(gemm_route(shape, trial), GemmLibrary::kOneDnn);
  EXPECT_GT(trials, 0);
  reset_gemm_routes(file_);
  trials = 0;
  EXPECT_EQ(gemm_route(shape, trial), GemmLibrary::kOneDnn);
  EXPECT_EQ(trials, 0) << "the route's line read back";
  Measure n{9};
  EXPECT_EQ(value("probe", n), 1.5);
  EXPECT_EQ(n.calls, 0);
  reset_gemm_routes("off");
}

// The process's own measurements of the CPU go through the file: two 512-bit FMAs per cycle or
// one, and vdpbf16ps against FMAs (0 where the CPU lacks the instructions, and then not asked for).
TEST(MachineValues, CpuMeasurementsAreKept) {
  const double fmas = avx512_fmas_per_cycle();
  const double rate = vdpbf16ps_to_fma_rate();
  const std::string summary = machine_values_summary();
  if (cpu_supports(SimdIsa::kAvx512)) {
    EXPECT_GT(fmas, 0.5);
    EXPECT_LT(fmas, 4.0);
    EXPECT_NE(summary.find("avx512_fmas_per_cycle"), std::string::npos) << summary;
  } else {
    EXPECT_EQ(fmas, 0.0);
    std::printf("[ SKIPPED ] avx512_fmas_per_cycle: this CPU has no AVX-512\n");
  }
  if (cpu_has_avx512_bf16()) {
    EXPECT_GT(rate, 0.2);
    EXPECT_NE(summary.find("vdpbf16ps_to_fma_rate"), std::string::npos) << summary;
  } else {
    EXPECT_EQ(rate, 0.0);
    std::printf("[ SKIPPED ] vdpbf16ps_to_fma_rate: this CPU has no AVX512_BF16\n");
  }
}

}  // namespace
}  // namespace cabm
