// Issue 16, hostile files: a small valid checkpoint is edited as an attacker or a corrupt disk
// would (model metadata, state.json, leftovers of a killed save, a huge or endless --data), and
// every command must answer with exit status 1 and one line naming the file and the key:
// never a signal, a multi-gigabyte allocation or a silent success. The commands run under a
// 2 GiB address-space limit, so that a regression fails fast instead of filling the machine.
#include "cabm/io/safetensors.h"
#include "util/test_util.h"

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>

namespace cabm {
namespace {

namespace fs = std::filesystem;
using test::CmdResult;

const char* kStep = "step-00000002";

std::string path(const std::string& name) {
  return test::temp_dir() + "/" + name;
}

CmdResult cabm(const std::vector<std::string>& args, const test::RunLimits& limits = {}) {
  return test::run_cabm_limited(args, limits);
}

// Exit status 1 (a failure, not a usage error), one line on stderr holding every needle.
void expect_failure(const CmdResult& r, const std::vector<std::string>& needles) {
  EXPECT_EQ(r.signal, 0) << "killed by signal " << r.signal << "\n" << r.err;
  EXPECT_EQ(r.status, 1) << r.out << r.err;
  ASSERT_FALSE(r.err.empty());
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "more than one line:\n" << r.err;
  for (const std::string& needle : needles) EXPECT_NE(r.err.find(needle), std::string::npos) << needle << "\n" << r.err;
}

std::string data_file() {
  const std::string p = path("text.txt");
  if (!fs::exists(p)) {
    std::ofstream out(p);
    for (int i = 0; i < 60; ++i) out << "Line " << i << ": the quick brown fox jumps over the lazy dog.\n";
  }
  return p;
}

// A run directory with one tiny checkpoint (step 2), trained once per test process.
const std::string& base_run() {
  static const std::string run = [] {
    const std::string out = path("base-run");
    const CmdResult r =
        cabm({"train", "--data",    data_file(), "--out",           out,  "--layers",        "1",  "--heads",
              "2",     "--d-model", "16",        "--d-ff",          "32", "--seq-len",       "16", "--batch-size",
              "4",     "--steps",   "2",         "--eval-interval", "0",  "--sample-tokens", "0"});
    EXPECT_EQ(r.status, 0) << r.out << r.err;
    return out;
  }();
  return run;
}

// A fresh copy of the base run named `name`.
std::string copy_run(const std::string& name) {
  const std::string dir = path(name);
  fs::remove_all(dir);
  fs::copy(base_run(), dir, fs::copy_options::recursive);
  return dir;
}

void set_model_metadata(const std::string& run, const std::string& key, const std::string& value) {
  const std::string file = run + "/" + kStep + "/model.safetensors";
  SafetensorsFile f = read_safetensors(file);
  f.metadata[key] = value;
  write_safetensors(file, f.tensors, f.metadata);
}

void edit_state(const std::string& run, const std::function<void(nlohmann::json&)>& edit) {
  const std::string file = run + "/" + kStep + "/state.json";
  nlohmann::json j = nlohmann::json::parse(test::read_file(file));
  edit(j);
  std::ofstream(file, std::ios::trunc) << j.dump(2);
}

// The state.json value written as raw JSON text (4.3e39 is a float JSON number).
void set_state_raw(const std::string& run, const std::string& dotted, const std::string& raw) {
  edit_state(run, [&](nlohmann::json& j) {
    nlohmann::json* o = &j;
    std::string rest = dotted;
    for (size_t dot; (dot = rest.find('.')) != std::string::npos; rest = rest.substr(dot + 1))
      o = &(*o)[rest.substr(0, dot)];
    (*o)[rest] = nlohmann::json::parse(raw);
  });
}

TEST(HostileFiles, TheUneditedCheckpointWorksUnderTheLimit) {
  const CmdResult eval = cabm({"eval", "--checkpoint", base_run()});
  EXPECT_EQ(eval.status, 0) << eval.err;
  const CmdResult gen = cabm({"generate", "--checkpoint", base_run(), "--tokens", "5"});
  EXPECT_EQ(gen.status, 0) << gen.err;
}

// F1: sizes at or beyond 2^63 − 1 in the model metadata crashed eval and generate (exit 139).
TEST(HostileFiles, F1_HugeSizesInModelMetadata) {
  for (const char* key : {"vocab_size", "max_seq_len", "dim_feedforward", "d_model", "num_layers"})
    for (const char* value : {"9223372036854775807", "9223372036854775808", "18446744073709551616", "1.5", "-3"}) {
      const std::string run = copy_run("f1");
      set_model_metadata(run, key, value);
      for (const char* command : {"eval", "generate"})
        expect_failure(cabm({command, "--checkpoint", run}), {"model.safetensors", std::string("'") + key + "'"});
    }
}

// F3: metadata sizes in range but not in the file (2^31 layers, a 10^8-position context) were
// allocated before any check: gigabytes from a 28 KB file.
TEST(HostileFiles, F3_MetadataThatTheFileDoesNotHold) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"num_layers", "2147483648"}, {"num_layers", "1000"},      {"max_seq_len", "100000000"},
      {"vocab_size", "2000000000"}, {"dim_feedforward", "4096"}, {"d_model", "2048"}};
  for (const auto& [key, value] : cases) {
    const std::string run = copy_run("f3");
    set_model_metadata(run, key, value);
    const auto start = std::chrono::steady_clock::now();
    expect_failure(cabm({"eval", "--checkpoint", run}), {"model.safetensors", key});
    expect_failure(cabm({"generate", "--checkpoint", run}), {"model.safetensors", key});
    expect_failure(cabm({"train", "--resume", "--out", run, "--steps", "3"}), {"model.safetensors", key});
    // Refused before allocating, not after filling the limit.
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 20.0);
  }
  {
    const std::string run = copy_run("f3");
    set_model_metadata(run, "nhead", "3");  // does not divide d_model 16
    expect_failure(cabm({"eval", "--checkpoint", run}), {"model.safetensors", "nhead"});
  }
}

// F3: state.json's configuration is what a resumed run builds: it must be in range and agree
// with the model file before the trainer allocates anything.
TEST(HostileFiles, F3_ResumeStateThatDisagreesWithTheModel) {
  const std::vector<std::pair<std::string, std::string>> cases = {{"config.layers", "1e12"},
                                                                  {"config.layers", "1000000000000"},
                                                                  {"config.accum", "1099511627776"},
                                                                  {"config.batch_size", "4611686018427387904"},
                                                                  {"config.layers", "3"},
                                                                  {"config.d_model", "32"},
                                                                  {"config.seq_len", "4096"}};
  for (const auto& [key, raw] : cases) {
    const std::string run = copy_run("f3-state");
    set_state_raw(run, key, raw);
    expect_failure(cabm({"train", "--resume", "--out", run, "--steps", "3"}), {"state.json", "'" + key + "'"});
  }
}

// A NaN or ±inf weight in a checkpoint's model loaded: eval printed loss nan, generate sampled
// from NaN logits, and a run resumed from it or started from it (--init) trained on NaN, all
// with exit 0. Every loader now refuses it before any computation, naming the file and tensor.
TEST(HostileFiles, NonFiniteModelWeights) {
  const std::string key = "encoder.layers.0.linear2.weight";
  for (const float value : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    SCOPED_TRACE(value);
    const std::string run = copy_run("nonfinite");
    const std::string file = run + "/" + kStep + "/model.safetensors";
    SafetensorsFile f = read_safetensors(file);
    f.tensors.at(key).data<float>()[3] = value;
    write_safetensors(file, f.tensors, f.metadata);
    const std::string needle = fmt::format("model.safetensors: tensor '{}' holds {} at element 3", key, value);
    expect_failure(cabm({"eval", "--checkpoint", run}), {needle, "must be finite"});
    expect_failure(cabm({"generate", "--checkpoint", run, "--tokens", "3"}), {needle});
    expect_failure(cabm({"train", "--resume", "--out", run, "--steps", "3"}), {needle});
    expect_failure(cabm({"train", "--data", data_file(), "--init", file, "--out", path("nonfinite-init"), "--steps",
                         "1", "--eval-interval", "0", "--sample-tokens", "0"}),
                   {needle});
  }
}

// An AdamW state whose first moment exceeds what Adam's moments can reach (|m| <= 7.27·sqrt(v),
// cabm/train/checkpoint.cpp), here exp_avg 1e38 with exp_avg_sq 0, was resumed: the first update
// (~1e46) made the weights inf and the run stopped blaming the learning rate.
TEST(HostileFiles, UnboundedAdamMoments) {
  const std::string run = copy_run("moments");
  const std::string file = run + "/" + kStep + "/optimizer.safetensors";
  SafetensorsFile f = read_safetensors(file);
  f.tensors.at("exp_avg.encoder.norm.bias").data<float>()[1] = 1e38f;
  f.tensors.at("exp_avg_sq.encoder.norm.bias").data<float>()[1] = 0.0f;
  write_safetensors(file, f.tensors, f.metadata);
  expect_failure(
      cabm({"train", "--resume", "--out", run, "--steps", "3"}),
      {"optimizer.safetensors: tensor 'exp_avg.encoder.norm.bias' holds 1e+38 at element 1", "would be unbounded"});
}

// F4: a --data file larger than the memory the process may use was evaluated as its prefix
// with exit 0; /dev/zero was read until memory ran out.
TEST(HostileFiles, F4_DataLargerThanMemory) {
  CABM_SKIP_WITHOUT_ADDRESS_LIMITS();  // the 3 GiB must exceed what the child may map
  const std::string big = path("sparse-3g.txt");
  {
    const int fd = open(big.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(ftruncate(fd, off_t{3} << 30), 0);  // holes: neither disk nor memory
    close(fd);
  }
  test::RunLimits limits;
  limits.cpu_seconds = 20;  // before the fix: evaluating or training on the 1 GiB that fitted
  expect_failure(cabm({"eval", "--checkpoint", base_run(), "--data", big}, limits), {big, "memory"});
  expect_failure(cabm({"train", "--data", big, "--out", path("f4-run"), "--steps", "1"}, limits), {big, "memory"});
  fs::remove(big);
}

TEST(HostileFiles, F4_EndlessData) {
  expect_failure(cabm({"eval", "--checkpoint", base_run(), "--data", "/dev/zero"}), {"/dev/zero", "device"});
  expect_failure(cabm({"train", "--data", "/dev/zero", "--out", path("f4-run"), "--steps", "1"}), {"/dev/zero"});
}

// F5: JSON numbers outside an integer's range (or not integers) were undefined float → int
// conversions: eval printed "step -9223372036854775808", 1.5 was truncated, seed -1 accepted.
TEST(HostileFiles, F5_StateJsonNumbers) {
  for (const char* raw : {"4.3e39", "-1", "1.5", "\"2\"", "9223372036854775808"}) {
    const std::string run = copy_run("f5");
    set_state_raw(run, "step", raw);
    expect_failure(cabm({"eval", "--checkpoint", run}), {"state.json", "'step'"});
    expect_failure(cabm({"generate", "--checkpoint", run, "--tokens", "3"}), {"state.json", "'step'"});
  }
  const std::vector<std::pair<std::string, std::string>> resume_cases = {
      {"config.steps", "4.3e39"},   {"config.seed", "-1"},         {"seed", "-1"},
      {"data_rng.position", "1.5"}, {"data_rng.seed", "-1"},       {"data_rng.position", "1e20"},
      {"config.lr", "\"fast\""},    {"config.min_lr_ratio", "-5"}, {"config.clip", "1e300"}};
  for (const auto& [key, raw] : resume_cases) {
    const std::string run = copy_run("f5-resume");
    set_state_raw(run, key, raw);
    expect_failure(cabm({"train", "--resume", "--out", run, "--steps", "3"}), {"state.json", "'" + key + "'"});
  }
  {  // eval reads config.eval_windows of a classifier and config.data of an LM: typed reads
    const std::string run = copy_run("f5-data");
    set_state_raw(run, "config.data", "42");
    expect_failure(cabm({"eval", "--checkpoint", run}), {"state.json", "'config.data'"});
  }
}

// F7: a kill during the `latest` update left latest.tmp.<pid> forever; the next save (and a
// fresh run in the same directory) removes it, and the hidden directories of killed saves.
TEST(HostileFiles, F7_LeftoversOfAKilledSaveAreRemoved) {
  const std::vector<std::string> leftovers = {"latest.tmp.4242", ".tmp-step-00000003-4242-0",
                                              ".old-step-00000002-4242"};
  const auto plant = [&](const std::string& run) {
    std::ofstream(run + "/latest.tmp.4242") << "step-00000003\n";
    fs::create_directories(run + "/.tmp-step-00000003-4242-0");
    std::ofstream(run + "/.tmp-step-00000003-4242-0/model.safetensors") << "trunc";
    fs::create_directories(run + "/.old-step-00000002-4242");
  };
  const std::string run = copy_run("f7");
  plant(run);
  const CmdResult resumed = cabm({"train", "--resume", "--out", run, "--steps", "3"});
  ASSERT_EQ(resumed.status, 0) << resumed.err;
  for (const std::string& name : leftovers) EXPECT_FALSE(fs::exists(run + "/" + name)) << name;
  EXPECT_EQ(test::read_file(run + "/latest"), "step-00000003\n");

  plant(run);  // a fresh run into the same directory replaces the old run, leftovers included
  const CmdResult fresh =
      cabm({"train", "--data",    data_file(), "--out",           run,  "--layers",        "1",  "--heads",
            "2",     "--d-model", "16",        "--d-ff",          "32", "--seq-len",       "16", "--batch-size",
            "4",     "--steps",   "1",         "--eval-interval", "0",  "--sample-tokens", "0"});
  ASSERT_EQ(fresh.status, 0) << fresh.err;
  for (const std::string& name : leftovers) EXPECT_FALSE(fs::exists(run + "/" + name)) << name;
}

// F8: checkpoint directories were always 0700 (mkdtemp), whatever the umask, so another user of
// a shared run directory read "latest: names step-…, which has no model.safetensors".
TEST(HostileFiles, F8_CheckpointPermissionsFollowTheUmask) {
  for (const int mask : {022, 027, 077}) {
    const std::string run = path("f8-umask-" + std::to_string(mask));
    test::RunLimits limits;
    limits.umask = mask;
    const CmdResult r =
        cabm({"train", "--data",    data_file(), "--out",           run,  "--layers",        "1",  "--heads",
              "2",     "--d-model", "16",        "--d-ff",          "32", "--seq-len",       "16", "--batch-size",
              "4",     "--steps",   "1",         "--eval-interval", "0",  "--sample-tokens", "0"},
             limits);
    ASSERT_EQ(r.status, 0) << r.err;
    struct stat st {};
    ASSERT_EQ(stat((run + "/step-00000001").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0777u & ~static_cast<unsigned>(mask)) << "umask " << mask;
  }
}

// F8: a checkpoint this user may not read says so, instead of "which has no model.safetensors".
TEST(HostileFiles, F8_UnreadableCheckpointSaysPermissionDenied) {
  if (geteuid() == 0) GTEST_SKIP() << "root may read every file";
  const std::string run = copy_run("f8-permissions");
  fs::permissions(run + "/" + kStep, fs::perms::none);
  const CmdResult r = cabm({"eval", "--checkpoint", run});
  fs::permissions(run + "/" + kStep, fs::perms::owner_all);
  expect_failure(r, {kStep, "Permission denied"});
}

// F8: a malformed state.json gave the JSON library's raw message ("[json.exception.parse_error
// .101] ..."): now one line naming the file, without the library's prefix.
TEST(HostileFiles, F8_MalformedStateJson) {
  const std::string run = copy_run("f8-json");
  const std::string state = run + "/" + kStep + "/state.json";
  for (const char* text : {"{\"step\": 2,\n \"config\": {oops}", "", "[1, 2]", "{\"step\": 2", "\x01\x02\n\n"}) {
    std::ofstream(state, std::ios::trunc) << text;
    for (const char* command : {"eval", "generate"}) {
      const CmdResult r = cabm({command, "--checkpoint", run});
      expect_failure(r, {"state.json"});
      EXPECT_EQ(r.err.find("[json.exception"), std::string::npos) << r.err;
    }
    expect_failure(cabm({"train", "--resume", "--out", run}), {"state.json"});
  }
}

// F8: out of memory names what was being allocated (a training run that cannot fit is refused
// naming its flags, before it allocates) and is never a crash.
TEST(HostileFiles, F8_TooLargeForMemoryNamesTheFlags) {
  const auto start = std::chrono::steady_clock::now();
  expect_failure(cabm({"train", "--data", data_file(), "--out", path("f8-big"), "--layers", "64", "--d-model", "4096",
                       "--heads", "8", "--d-ff", "16384", "--steps", "1"}),
                 {"--layers 64", "--d-model 4096", "memory"});
  expect_failure(cabm({"memory", "--layers", "64", "--d-model", "4096", "--heads", "8", "--d-ff", "16384"}),
                 {"--layers 64", "memory"});
  expect_failure(cabm({"bench", "attention", "--batch", "4096", "--heads", "64", "--n", "4096", "--d", "256"}),
                 {"--batch 4096", "memory"});
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 20.0);
}

}  // namespace
}  // namespace cabm
