// `cabm train --task langid` end to end on a tiny classifier over the Debian word lists: the
// validation accuracy and confusion matrix it reports, `cabm eval` on its checkpoint, and
// `--stop-at` + `--resume` reproducing the losses of a straight run.
#include "util/test_util.h"

#include <filesystem>

namespace cabm {
namespace {

using test::CmdResult;

const std::string kTiny =
    " --task langid --layers 1 --heads 2 --d-model 16 --d-ff 32 --batch-size 8 --eval-windows 20"
    " --log-interval 1 --steps 4";

// The text of the first line starting with `prefix` up to " | lr" (the loss part of a log line).
std::string loss_line(const std::string& text, const std::string& prefix) {
  const size_t at = text.find(prefix);
  return at == std::string::npos ? std::string("(missing)") : text.substr(at, text.find(" | lr", at) - at);
}

TEST(CliLangid, TrainEvalResume) {
  const std::string dir = test::temp_dir();
  const CmdResult a = test::run_cabm("train" + kTiny + " --eval-interval 2 --out " + dir + "/straight");
  ASSERT_EQ(a.status, 0) << a.out << a.err;
  EXPECT_NE(a.out.find("cabm train --task langid: 1 layers, d_model 16"), std::string::npos) << a.out;
  EXPECT_NE(a.out.find("step 2: validation loss"), std::string::npos) << a.out;
  EXPECT_NE(a.out.find("accuracy"), std::string::npos) << a.out;
  for (const char* language : {"english", "german", "french", "spanish", "italian", "recall"})
    EXPECT_NE(a.out.find(language), std::string::npos) << language << "\n" << a.out;
  EXPECT_TRUE(std::filesystem::exists(dir + "/straight/step-00000004/model.safetensors"));

  const CmdResult eval = test::run_cabm("eval --checkpoint " + dir + "/straight");
  ASSERT_EQ(eval.status, 0) << eval.err;
  EXPECT_NE(eval.out.find("accuracy"), std::string::npos) << eval.out;
  EXPECT_NE(eval.out.find("recall"), std::string::npos) << eval.out;

  const CmdResult b1 = test::run_cabm("train" + kTiny + " --eval-interval 2 --stop-at 2 --out " + dir + "/split");
  ASSERT_EQ(b1.status, 0) << b1.err;
  const CmdResult b2 = test::run_cabm("train --resume --out " + dir + "/split");
  ASSERT_EQ(b2.status, 0) << b2.err;
  EXPECT_NE(b2.out.find("resuming from"), std::string::npos) << b2.out;
  for (const char* step : {"step 3/4 | loss", "step 4/4 | loss"})
    EXPECT_EQ(loss_line(a.out, step), loss_line(b2.out, step));
  // The classifier cannot be resumed or started as a language model.
  test::expect_one_line_error(test::run_cabm("train --task lm --resume --out " + dir + "/split"), "langid");
  test::expect_one_line_error(
      test::run_cabm("train --init " + dir + "/straight/step-00000004/model.safetensors --out " + dir + "/lm"),
      "Classifier");
}

}  // namespace
}  // namespace cabm
