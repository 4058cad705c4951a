// The training progress display: on a terminal a single bar redrawn in place on stderr
// (carriage return + erase line; step/total, loss, lr, tokens/s, ETA) and no per-step log lines;
// elsewhere (a pipe, CI) plain log lines. The terminal is a pseudo-terminal from `script`
// (util-linux's bsdutils, an essential package on Debian).
#include "util/test_util.h"

#include <fstream>
#include <regex>

namespace cabm {
namespace {

std::string data_file() {
  const std::string path = test::temp_dir() + "/text.txt";
  std::ofstream out(path);
  for (int i = 0; i < 40; ++i) out << "Line " << i << ": sphinx of black quartz, judge my vow.\n";
  return path;
}

const std::string kTiny =
    " --layers 1 --heads 2 --d-model 16 --d-ff 32 --seq-len 16 --batch-size 4 --steps 5 --log-interval 1"
    " --sample-tokens 0 --eval-interval 0";

TEST(CliProgress, BarOnATerminal) {
  const std::string dir = test::temp_dir();
  const std::string command = "CABM_NUM_THREADS=2 " + test::cabm_binary() + " train --data " + data_file() + kTiny +
                              " --out " + dir + "/tty-run";
  // script -q: no banner; -e: return the command's status; -f: flush as written.
  const std::string shell = "script -qefc '" + command + "' /dev/null >" + dir + "/tty.txt 2>&1 </dev/null";
  ASSERT_EQ(std::system(shell.c_str()), 0) << test::read_file(dir + "/tty.txt");
  const std::string tty = test::read_file(dir + "/tty.txt");
  // The final bar: full, 5/5, then loss, lr, rate and ETA.
  const std::regex bar(R"(\r\x1b\[K\[#{24}\] 5/5 loss \d+\.\d{4} lr \d\.\d\de[-+]\d\d [\d,]+ tok/s ETA \S+)");
  EXPECT_TRUE(std::regex_search(tty, bar)) << tty;
  EXPECT_EQ(tty.find("step 1/5 | loss"), std::string::npos) << "log lines on a terminal:\n" << tty;
  EXPECT_NE(tty.find("trained 5 steps"), std::string::npos) << tty;

  // Not a terminal: one log line per step, no escape sequences.
  const test::CmdResult piped = test::run_cabm("train --data " + data_file() + kTiny + " --out " + dir + "/pipe-run");
  ASSERT_EQ(piped.status, 0) << piped.err;
  for (const char* line : {"step 1/5 | loss", "step 5/5 | loss"}) EXPECT_NE(piped.out.find(line), std::string::npos);
  EXPECT_EQ((piped.out + piped.err).find('\x1b'), std::string::npos);
}

}  // namespace
}  // namespace cabm
