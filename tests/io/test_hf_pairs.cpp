// Sentence pairs through the Hugging Face tokenizers (HfTokenizer::encode_pair) and
// `cabm tokenize --pair-input`, against what transformers' fast tokenizers and the tokenizers
// library returned (tests/fixtures/hf_make_tokenizers.py): every tokenizer family's pair template
// over random and edge-case pairs of the hard strings at many max_lengths (longest_first
// truncation), the truncation rule measured length by length, other post-processors, and the
// command's errors.
#include "cabm/core/error.h"
#include "cabm/io/hf_tokenizer.h"
#include "cabm/io/safetensors.h"

#include "util/hf_tokenizer_fixtures.h"
#include "util/test_util.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

namespace cabm {
namespace {

using nlohmann::json;

std::string model_dir(const std::string& name) {
  return test::hf_tokenizers_expected()["tokenizers"][name]["dir"].get<std::string>();
}

std::string first_file() {
  return test::hf_tokenizers_dir() + "/pairs_first.txt";
}
std::string second_file() {
  return test::hf_tokenizers_dir() + "/pairs_second.txt";
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

std::vector<int64_t> row(const Tensor& t, int64_t i) {
  const int64_t T = t.shape()[1];
  const int64_t* p = t.data<int64_t>() + i * T;
  return std::vector<int64_t>(p, p + T);
}

// Two I64 [n, T] tensors equal row by row (the failure names the pair and its texts).
void expect_rows_equal(const Tensor& got, const Tensor& want, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(got.dtype(), DType::I64);
  ASSERT_EQ(got.shape(), want.shape());
  const json& pairs = test::hf_tokenizers_expected()["pairs"];
  for (int64_t i = 0; i < want.shape()[0]; ++i)
    EXPECT_EQ(row(got, i), row(want, i)) << "pair " << i + 1 << ": " << pairs[static_cast<size_t>(i)].dump()
                                         << "\n  cabm:         " << json(row(got, i)).dump()
                                         << "\n  transformers: " << json(row(want, i)).dump();
}

// The lengths tokenizers' truncate_encodings kept of a words "a" and b words "b" for every
// max_length from 3 to 21 (bert_uncased: one token each, 3 special tokens around a pair).
TEST(HfPairs, LongestFirstKeepsWhatTheLibraryKeeps) {
  const json& rows = test::hf_tokenizers_expected().at("longest_first");
  ASSERT_GE(rows.size(), 3000u);
  for (const json& r : rows) {
    const int64_t a = r[0], b = r[1], max_length = r[2];
    const PairLengths got = longest_first_lengths(a, b, max_length - 3);
    EXPECT_EQ(got.first, r[3].get<int64_t>()) << r.dump();
    EXPECT_EQ(got.second, r[4].get<int64_t>()) << r.dump();
  }
}

TEST(HfPairs, EveryFamilyMatchesTransformers) {
  std::vector<std::string> firsts, seconds;
  for (const json& p : test::hf_tokenizers_expected().at("pairs")) {
    firsts.push_back(p[0]);
    seconds.push_back(p[1]);
  }
  ASSERT_GE(firsts.size(), 50u);
  int compared = 0;
  for (const auto& [name, entry] : test::hf_tokenizers_expected().at("tokenizers").items()) {
    SCOPED_TRACE(name);
    const HfTokenizer tok = HfTokenizer::load(entry.at("dir").get<std::string>());
    const int64_t special = entry.at("pair_special");
    EXPECT_EQ(tok.special_token_count(true), special);
    const SafetensorsFile want = read_safetensors(test::hf_tokenizers_dir() + "/" + name + ".pairs.safetensors");
    for (const int64_t max_length : entry.at("pair_max_lengths").get<std::vector<int64_t>>()) {
      std::vector<TokenizedText> encoded;
      for (size_t i = 0; i < firsts.size(); ++i) encoded.push_back(tok.encode_pair(firsts[i], seconds[i], max_length));
      const std::map<std::string, Tensor> got = pad_batch(encoded, tok.pad_id(), true);
      for (const char* key : {"input_ids", "token_type_ids", "attention_mask"})
        expect_rows_equal(got.at(key), want.get(std::string(key) + "@" + std::to_string(max_length)),
                          std::string(key) + ", max_length " + std::to_string(max_length));
      ++compared;
    }
    // No room for the special tokens: a usage error, as for one input (the library would not
    // truncate at all: its max_length − special tokens wraps around).
    EXPECT_THROW(tok.encode_pair("a", "b", special - 1), UsageError);
  }
  EXPECT_GE(compared, 13 * 10);
}

// bert_uncased's tokenizer.json with another post-processor, against the tokenizers library.
TEST(HfPairs, PostProcessorsOfTokenizerJson) {
  std::vector<std::string> firsts, seconds;
  for (const json& p : test::hf_tokenizers_expected().at("pairs")) {
    firsts.push_back(p[0]);
    seconds.push_back(p[1]);
  }
  const json& variants = test::hf_tokenizers_expected().at("processor_variants");
  ASSERT_EQ(variants.size(), 4u);
  for (const auto& [name, entry] : variants.items()) {
    SCOPED_TRACE(name);
    const std::string file = entry.at("file");
    const HfTokenizer tok = HfTokenizer::from_tokenizer_json(test::read_file(file), file);
    EXPECT_EQ(tok.special_token_count(true), entry.at("added_pair").get<int64_t>());
    const std::pair<std::string, int64_t> runs[] = {{"whole", 0}, {"max_9", 9}};
    for (const auto& [key, max_length] : runs) {
      const json& want = entry.at(key);
      for (size_t i = 0; i < want.at("input_ids").size(); ++i) {
        const TokenizedText t = tok.encode_pair(firsts[i], seconds[i], max_length);
        EXPECT_EQ(json(t.input_ids), want["input_ids"][i]) << key << ", pair " << i + 1;
        EXPECT_EQ(json(t.token_type_ids), want["type_ids"][i]) << key << ", pair " << i + 1;
        EXPECT_EQ(t.attention_mask, std::vector<int64_t>(t.input_ids.size(), 1));
      }
    }
  }
}

// A 'pair' template cabm cannot follow does not stop single inputs; pairs are refused naming it.
TEST(HfPairs, BadPairTemplatesRefusePairsOnly) {
  const auto with_pair = [](const std::string& pair) {
    return R"({"model": {"type": "WordPiece", "unk_token": "[UNK]", "vocab": {"[UNK]": 0, "[CLS]": 1, "a": 2}},
               "pre_tokenizer": {"type": "BertPreTokenizer"}, "post_processor": {"type": "TemplateProcessing",
               "single": [{"SpecialToken": {"id": "[CLS]"}}, {"Sequence": {"id": "A"}}],)" +
           pair + R"("special_tokens": {"[CLS]": {"id": "[CLS]", "ids": [1], "tokens": ["[CLS]"]}}}})";
  };
  const struct {
    std::string pair, message;
  } cases[] = {
      {"", "t.json: post_processor has no 'pair' template"},
      {R"("pair": [{"Sequence": {"id": "A"}}, {"Sequence": {"id": "A"}}, {"Sequence": {"id": "B"}}],)",
       "t.json: post_processor's 'pair' template holds the sequence more than once"},
      {R"("pair": [{"Sequence": {"id": "C"}}],)", "uses sequence 'C'"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.pair);
    const HfTokenizer tok = HfTokenizer::from_tokenizer_json(with_pair(c.pair), "t.json");
    EXPECT_EQ(tok.encode("a a", 0).input_ids, (std::vector<int64_t>{1, 2, 2}));
    EXPECT_NE(test::error_of([&] { tok.encode_pair("a", "a", 0); }).find(c.message), std::string::npos)
        << test::error_of([&] { tok.encode_pair("a", "a", 0); });
  }
  // A pair template without $B: the library drops the second text (after truncating it).
  const HfTokenizer only_a = HfTokenizer::from_tokenizer_json(
      with_pair(R"("pair": [{"SpecialToken": {"id": "[CLS]"}}, {"Sequence": {"id": "A", "type_id": 1}}],)"), "t.json");
  const TokenizedText t = only_a.encode_pair("a a a", "a a", 4);
  EXPECT_EQ(t.input_ids, (std::vector<int64_t>{1, 2, 2}));
  EXPECT_EQ(t.token_type_ids, (std::vector<int64_t>{0, 1, 1}));
}

// ---- `cabm tokenize --pair-input` ------------------------------------------------------------

void expect_file_equals_fixture(const std::string& out, const std::string& name, int64_t max_length) {
  const json& entry = test::hf_tokenizers_expected()["tokenizers"][name];
  const SafetensorsFile got = read_safetensors(out);
  const SafetensorsFile want = read_safetensors(test::hf_tokenizers_dir() + "/" + name + ".pairs.safetensors");
  const bool types = entry.at("has_token_types");
  EXPECT_EQ(got.tensors.size(), types ? 3u : 2u);
  EXPECT_EQ(got.find("token_type_ids") != nullptr, types);
  for (const auto& [key, tensor] : got.tensors)
    expect_rows_equal(tensor, want.get(key + "@" + std::to_string(max_length)), name + " " + key);
}

TEST(HfPairs, TokenizeCommandWritesWhatTransformersReturns) {
  for (const std::string name : {"all_minilm_l6_v2", "bert_cased", "bert_vocab_txt", "distilbert", "roberta",
                                 "roberta_files", "xlmr", "xlmr_spm_only", "xlmr_unigram"}) {
    SCOPED_TRACE(name);
    const std::string out = test::temp_dir() + "/pairs_" + name + ".safetensors";
    const auto r = test::run_cabm("tokenize --model " + model_dir(name) + " --input " + first_file() +
                                  " --pair-input " + second_file() + " --output " + out);
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_TRUE(r.err.empty()) << r.err;
    expect_file_equals_fixture(out, name, 0);
  }
  // --max-length counts the pair as a whole; the second texts from standard input, \r\n ends.
  std::string crlf = test::read_file(second_file());
  for (size_t at = 0; (at = crlf.find('\n', at)) != std::string::npos; at += 2) crlf.replace(at, 1, "\r\n");
  const std::string in = test::temp_dir() + "/second_crlf.txt", out = test::temp_dir() + "/pairs_17.safetensors";
  write_bytes(in, crlf);
  const std::string cmd = "CABM_NUM_THREADS=2 " + test::cabm_binary() + " tokenize --model " +
                          model_dir("bert_uncased") + " --input " + first_file() +
                          " --pair-input - --max-length 17 --output " + out + " < " + in;
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  expect_file_equals_fixture(out, "bert_uncased", 17);
}

TEST(HfPairs, TokenizeCommandErrors) {
  const std::string out = test::temp_dir() + "/never.safetensors";
  const std::string model = " --model " + model_dir("bert_uncased");
  // A different number of lines: one line naming both files and both counts, status 1.
  const std::string three = test::temp_dir() + "/three.txt", two = test::temp_dir() + "/two.txt";
  write_bytes(three, "a\nb\nc\n");
  write_bytes(two, "x\ny");
  auto r = test::run_cabm("tokenize" + model + " --input " + three + " --pair-input " + two + " --output " + out);
  test::expect_one_line_error(r, "--input " + three + " has 3 lines but --pair-input " + two + " has 2");
  EXPECT_EQ(r.status, 1);
  // Both from standard input: a usage error, status 2.
  r = test::run_cabm("tokenize" + model + " --input - --pair-input - --output " + out);
  test::expect_one_line_error(r, "cannot both be '-'");
  EXPECT_EQ(r.status, 2);
  // Invalid UTF-8 in the second texts names that file and the line.
  const std::string bad = test::temp_dir() + "/bad_pair.txt";
  write_bytes(bad, "fine\nbad \xC3\x28\nfine\n");
  r = test::run_cabm("tokenize" + model + " --input " + three + " --pair-input " + bad + " --output " + out);
  test::expect_one_line_error(r, bad + ": line 2: not valid UTF-8");
  EXPECT_EQ(r.status, 1);
  r = test::run_cabm("tokenize" + model + " --input " + three + " --pair-input /nonexistent/b.txt --output " + out);
  test::expect_one_line_error(r, "/nonexistent/b.txt");
  // --max-length must leave room for a pair's special tokens (4 for RoBERTa; 3 is enough for one
  // input).
  const std::string roberta = " --model " + model_dir("roberta") + " --input " + three + " --output " + out;
  r = test::run_cabm("tokenize" + roberta + " --pair-input " + three + " --max-length 3");
  test::expect_one_line_error(r, "--max-length 3");
  EXPECT_EQ(r.status, 2);
  EXPECT_FALSE(std::filesystem::exists(out));
  EXPECT_EQ(test::run_cabm("tokenize" + roberta + " --max-length 3").status, 0);
}

}  // namespace
}  // namespace cabm
