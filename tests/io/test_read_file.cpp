// read_file_bytes (cabm/io/text_data.h): the whole file or an error naming it, never the prefix
// that fitted in memory (issue 16, F4: a 3 GiB --data file was evaluated as its first 1 GiB,
// and /dev/zero was read until memory ran out).
#include "cabm/core/error.h"
#include "cabm/io/text_data.h"
#include "util/test_util.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

namespace cabm {
namespace {

namespace fs = std::filesystem;
using test::error_of;

std::string path(const std::string& name) {
  return test::temp_dir() + "/" + name;
}

TEST(ReadFile, WholeFile) {
  std::string text;
  for (int i = 0; i < 100000; ++i) text += static_cast<char>(i % 251);
  std::ofstream(path("bytes.bin"), std::ios::binary) << text;
  EXPECT_EQ(read_file_bytes(path("bytes.bin")), text);
  std::ofstream(path("empty.bin")).flush();
  EXPECT_EQ(read_file_bytes(path("empty.bin")), "");
}

// Runs read_file_bytes(file) in a child process under a 1 GiB address-space limit and 20 s of
// CPU, so that a regression (reading /dev/zero until memory runs out, returning a prefix) fails
// the test quickly instead of exhausting the machine. Returns "" when the child got a one-line
// cabm::Error that starts with the file's path and contains `needle`, else what went wrong.
std::string error_in_limited_child(const std::string& file, const std::string& needle) {
  int pipe_fds[2];
  if (pipe(pipe_fds) != 0) return "pipe failed";
  const pid_t pid = fork();
  if (pid == 0) {
    close(pipe_fds[0]);
    const rlimit as{size_t{1} << 30, size_t{1} << 30}, cpu{20, 20};
    if (!test::kAddressSanitizer) setrlimit(RLIMIT_AS, &as);
    setrlimit(RLIMIT_CPU, &cpu);
    std::string report;
    try {
      const std::string text = read_file_bytes(file);
      report = "no error: read " + std::to_string(text.size()) + " bytes";
    } catch (const Error& e) {
      const std::string m = e.what();
      if (m.rfind(file, 0) != 0 || m.find(needle) == std::string::npos || m.find('\n') != std::string::npos)
        report = "wrong message: " + m;
    } catch (const std::exception& e) {
      report = std::string("not a cabm::Error: ") + e.what();
    }
    if (!report.empty() && write(pipe_fds[1], report.data(), report.size()) < 0) _exit(2);
    _exit(0);
  }
  close(pipe_fds[1]);
  std::string report;
  char buffer[256];
  for (ssize_t n; (n = read(pipe_fds[0], buffer, sizeof buffer)) > 0;) report.append(buffer, static_cast<size_t>(n));
  close(pipe_fds[0]);
  int raw = 0;
  waitpid(pid, &raw, 0);
  if (!WIFEXITED(raw)) return "killed by signal " + std::to_string(WTERMSIG(raw));
  return report;
}

TEST(ReadFile, MissingAndDirectory) {
  EXPECT_NE(error_of([] { read_file_bytes(path("absent")); }).find("absent: no such file"), std::string::npos);
  EXPECT_NE(error_of([] { read_file_bytes(test::temp_dir()); }).find("is a directory"), std::string::npos);
}

// /dev/zero never ends: refused at once, not read until memory runs out.
TEST(ReadFile, DevicesAreRefused) {
  EXPECT_EQ(error_in_limited_child("/dev/zero", "is a device, expected a regular file"), "");
  EXPECT_EQ(error_in_limited_child("/dev/urandom", "is a device"), "");
}

TEST(ReadFile, PipeIsReadToItsEnd) {
  const std::string fifo = path("fifo");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const std::string text(3 << 20, 'x');  // several chunks
  std::thread writer([&] { std::ofstream(fifo, std::ios::binary) << text; });
  const std::string got = read_file_bytes(fifo);
  writer.join();
  EXPECT_EQ(got, text);
}

// A sparse file larger than the memory the child may use: an error naming the file (before the
// fix: its first part, returned as if it were all of it).
TEST(ReadFile, LargerThanMemoryIsAnErrorNamingTheFile) {
  CABM_SKIP_WITHOUT_ADDRESS_LIMITS();
  const std::string big = path("sparse-3g.txt");
  {
    const int fd = open(big.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(ftruncate(fd, off_t{3} << 30), 0);  // holes: no disk, no memory
    close(fd);
  }
  EXPECT_EQ(error_in_limited_child(big, "memory"), "");
  fs::remove(big);
}

}  // namespace
}  // namespace cabm
