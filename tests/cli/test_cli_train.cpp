// End to end: a tiny `cabm train` on a temporary text file, then `cabm generate`, `cabm eval`,
// `--resume`, and the bad-input cases: every one a single clear line on stderr and a non-zero
// exit status.
#include "cabm/io/safetensors.h"
#include "util/test_util.h"

#include <filesystem>
#include <fstream>

namespace cabm {
namespace {

namespace fs = std::filesystem;

using test::CmdResult;
using test::expect_one_line_error;

CmdResult cabm(const std::string& args) { return test::run_cabm(args); }

std::string data_file() {
  const std::string path = test::temp_dir() + "/text.txt";
  if (!fs::exists(path)) {
    std::ofstream out(path);
    for (int i = 0; i < 60; ++i)
      out << "Line " << i << ": the quick brown fox jumps over the lazy dog; naïve café déjà vu.\n";
  }
  return path;
}

const std::string kTiny =
    " --layers 1 --heads 2 --d-model 16 --d-ff 32 --seq-len 16 --batch-size 4 --lr 3e-3 --warmup 2";

TEST(CliTrain, TrainGenerateEvalResume) {
  const std::string out = test::temp_dir() + "/run";
  const CmdResult train = cabm("train --data " + data_file() + " --out " + out + kTiny +
                               " --steps 6 --eval-interval 3 --log-interval 1 --sample-tokens 20");
  ASSERT_EQ(train.status, 0) << train.out << train.err;
  EXPECT_NE(train.out.find("step 3: validation loss"), std::string::npos) << train.out;
  EXPECT_NE(train.out.find("step 6/6 | loss"), std::string::npos) << train.out;  // log lines: not a terminal
  EXPECT_NE(train.out.find("--- sample"), std::string::npos) << train.out;
  for (const char* f : {"model.safetensors", "optimizer.safetensors", "state.json"})
    EXPECT_TRUE(fs::exists(out + "/step-00000006/" + f)) << f;
  EXPECT_TRUE(fs::exists(out + "/latest"));

  const CmdResult gen = cabm("generate --checkpoint " + out + " --prompt 'The ' --tokens 40 --seed 3");
  ASSERT_EQ(gen.status, 0) << gen.err;
  EXPECT_EQ(gen.out.rfind("The ", 0), 0u) << gen.out;
  EXPECT_GE(gen.out.size(), 4u + 20u);  // ill-formed bytes print as U+FFFD, so length varies
  EXPECT_EQ(cabm("generate --checkpoint " + out + " --prompt 'The ' --tokens 40 --seed 3").out, gen.out);
  const CmdResult greedy = cabm("generate --checkpoint " + out + "/step-00000006 --tokens 10 --temperature 0");
  EXPECT_EQ(greedy.status, 0) << greedy.err;

  const CmdResult eval = cabm("eval --checkpoint " + out);
  ASSERT_EQ(eval.status, 0) << eval.err;
  EXPECT_NE(eval.out.find("bits/char"), std::string::npos) << eval.out;
  EXPECT_NE(eval.out.find("held-out split"), std::string::npos) << eval.out;
  const CmdResult eval_file = cabm("eval --checkpoint " + out + " --data " + data_file());
  EXPECT_EQ(eval_file.status, 0) << eval_file.err;
  EXPECT_NE(eval_file.out.find("whole file"), std::string::npos) << eval_file.out;

  // --stop-at then --resume reproduces the straight run's logged losses.
  const std::string straight = test::temp_dir() + "/straight", split = test::temp_dir() + "/split";
  const std::string common =
      "train --data " + data_file() + kTiny + " --steps 6 --eval-interval 0 --log-interval 1 --sample-tokens 0";
  const CmdResult a = cabm(common + " --out " + straight);
  const CmdResult b1 = cabm(common + " --out " + split + " --stop-at 3");
  ASSERT_EQ(b1.status, 0) << b1.err;
  EXPECT_NE(b1.out.find("stopped at step 3 of 6"), std::string::npos) << b1.out;
  const CmdResult b2 = cabm("train --resume --out " + split);
  ASSERT_EQ(b2.status, 0) << b2.err;
  EXPECT_NE(b2.out.find("resuming from"), std::string::npos) << b2.out;
  const auto line_of = [](const std::string& text, const std::string& prefix) {
    const size_t at = text.find(prefix);
    return at == std::string::npos ? std::string("(missing)") : text.substr(at, text.find(" | lr", at) - at);
  };
  for (const char* step : {"step 4/6 | loss", "step 6/6 | loss"})
    EXPECT_EQ(line_of(a.out, step), line_of(b2.out, step));

  // Resuming cannot change the architecture.
  expect_one_line_error(cabm("train --resume --out " + split + " --d-model 32"), "d_model");
}

// A fresh run clears the old checkpoints of its --out directory; an entry there that cannot be
// examined (a symbolic link loop) is left alone instead of ending the run with a filesystem
// exception, and so is one named like a checkpoint by the keep policy of each save.
TEST(CliTrain, AFreshRunLeavesEntriesItCannotExamine) {
  const std::string out = test::temp_dir() + "/loops";
  fs::create_directories(out);
  fs::create_directory_symlink("loop", out + "/loop");
  fs::create_directory_symlink("step-00000009", out + "/step-00000009");
  const CmdResult r =
      cabm("train --data " + data_file() + " --out " + out + kTiny + " --steps 2 --eval-interval 0 --sample-tokens 0");
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_TRUE(fs::exists(out + "/step-00000002/model.safetensors"));
  EXPECT_TRUE(fs::is_symlink(out + "/loop"));
  EXPECT_TRUE(fs::is_symlink(out + "/step-00000009"));
}

// Grouped-query attention: --kv-heads reaches the model, the checkpoint (metadata and the packed
// [E + 2Ekv, E] projection), generation, resume and --init; a bad count is a usage error.
TEST(CliTrain, GroupedQueryAttention) {
  const std::string out = test::temp_dir() + "/gqa";
  const std::string flags = " --layers 1 --heads 4 --d-model 16 --d-ff 32 --seq-len 16 --batch-size 4 --warmup 2";
  const CmdResult train = cabm("train --data " + data_file() + " --out " + out + flags +
                               " --kv-heads 2 --steps 4 --eval-interval 0 --sample-tokens 0 --stop-at 2");
  ASSERT_EQ(train.status, 0) << train.out << train.err;
  EXPECT_NE(train.out.find("4 heads (2 key/value)"), std::string::npos) << train.out;
  const SafetensorsFile model = read_safetensors(out + "/step-00000002/model.safetensors");
  EXPECT_EQ(model.get_metadata("num_kv_heads"), "2");
  EXPECT_EQ(model.get("encoder.layers.0.self_attn.in_proj_weight").shape(), (Shape{16 + 2 * 8, 16}));
  EXPECT_EQ(cabm("generate --checkpoint " + out + " --tokens 10 --temperature 0").status, 0);
  const CmdResult resumed = cabm("train --resume --out " + out);
  ASSERT_EQ(resumed.status, 0) << resumed.err;
  EXPECT_NE(resumed.out.find("4 heads (2 key/value)"), std::string::npos) << resumed.out;
  // --init from the GQA checkpoint adopts its architecture.
  const CmdResult init = cabm("train --data " + data_file() + " --out " + out + "_init --init " + out +
                              "/step-00000004/model.safetensors --steps 1 --eval-interval 0 --sample-tokens 0");
  EXPECT_EQ(init.status, 0) << init.err;
  EXPECT_NE(init.out.find("(2 key/value)"), std::string::npos) << init.out;
  expect_one_line_error(cabm("train --kv-heads 3 --out " + out + "_bad"), "--kv-heads");
  expect_one_line_error(cabm("train --kv-heads -1 --out " + out + "_bad"), "--kv-heads");
}

// Rotary positions: no position table in the checkpoint, positional/rope_theta in its metadata,
// generation past the training context is still bounded by max_seq_len, resume keeps it.
TEST(CliTrain, RotaryPositions) {
  const std::string out = test::temp_dir() + "/rope";
  const CmdResult train = cabm("train --data " + data_file() + " --out " + out + kTiny +
                               " --positional rotary --kv-heads 1 --steps 4 --eval-interval 0 --sample-tokens 8"
                               " --stop-at 2");
  ASSERT_EQ(train.status, 0) << train.out << train.err;
  const SafetensorsFile model = read_safetensors(out + "/step-00000002/model.safetensors");
  EXPECT_EQ(model.get_metadata("positional"), "rotary");
  EXPECT_EQ(model.get_metadata("rope_theta"), "10000");
  EXPECT_EQ(model.find("pos_embed.weight"), nullptr);
  const CmdResult gen = cabm("generate --checkpoint " + out + " --tokens 12 --temperature 0");
  EXPECT_EQ(gen.status, 0) << gen.err;
  const CmdResult resumed = cabm("train --resume --out " + out);
  EXPECT_EQ(resumed.status, 0) << resumed.err;
  EXPECT_EQ(cabm("eval --checkpoint " + out).status, 0);
  expect_one_line_error(cabm("train --positional alibi --out " + out + "_bad"), "--positional");
}

TEST(CliTrain, BadInputsAreOneLine) {
  const std::string dir = test::temp_dir();
  expect_one_line_error(cabm("train --data /nonexistent/corpus.txt --out " + dir + "/x"),
                        "/nonexistent/corpus.txt: no such file");
  std::ofstream(dir + "/empty.txt").flush();
  expect_one_line_error(cabm("train --data " + dir + "/empty.txt --out " + dir + "/x"), "empty");
  std::ofstream(dir + "/latin1.txt") << "caf\xE9 au lait\n";
  expect_one_line_error(cabm("train --data " + dir + "/latin1.txt --out " + dir + "/x"),
                        "not valid UTF-8 (byte offset 3)");
  expect_one_line_error(cabm("train --no-such-flag"), "--no-such-flag");
  expect_one_line_error(cabm("train --steps many"), "--steps");
  expect_one_line_error(cabm("train --d-model 30 --heads 4 --out " + dir + "/x"), "divisible");
  expect_one_line_error(cabm("train --schedule linear --out " + dir + "/x"), "unknown schedule");
  expect_one_line_error(cabm("train --task translate"), "unknown task");
  expect_one_line_error(cabm("train --resume --out " + dir + "/nothing-here"), "no checkpoint to resume");
  expect_one_line_error(cabm("generate"), "--checkpoint");
  expect_one_line_error(cabm("generate --checkpoint /nonexistent/run"), "/nonexistent/run");
  expect_one_line_error(cabm("eval --checkpoint /nonexistent/run"), "/nonexistent/run");
  // An unreadable checkpoint: a directory whose model file is garbage.
  fs::create_directories(dir + "/garbage");
  std::ofstream(dir + "/garbage/model.safetensors") << "definitely not safetensors";
  expect_one_line_error(cabm("generate --checkpoint " + dir + "/garbage"), "garbage/model.safetensors");
  expect_one_line_error(cabm("eval --checkpoint " + dir + "/garbage"), "garbage/model.safetensors");
  expect_one_line_error(cabm("generate --checkpoint " + dir + "/garbage --temperature -1"), "--temperature");
}

TEST(CliTrain, HelpOnEverySubcommand) {
  for (const char* sub : {"train", "generate", "eval"}) {
    const CmdResult r = cabm(std::string(sub) + " --help");
    EXPECT_EQ(r.status, 0) << sub;
    EXPECT_NE(r.out.find("Usage"), std::string::npos) << sub;
  }
}

}  // namespace
}  // namespace cabm
