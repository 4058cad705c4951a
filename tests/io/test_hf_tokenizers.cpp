// Hugging Face tokenizers (cabm/io/hf_tokenizer.h) and `cabm tokenize` against the ids that
// transformers' fast tokenizer returned for a corpus of hard strings
// (tests/fixtures/hf_make_tokenizers.py): WordPiece cased and uncased, with and without accent
// stripping, from tokenizer.json and from vocab.txt; byte-level BPE from tokenizer.json and
// from vocab.json + merges.txt, with and without add_prefix_space; XLM-R's SentencePiece
// model (converted as transformers converts it, and as a tokenizer.json Unigram pipeline); the
// real all-MiniLM-L6-v2 tokenizer. Then the command end to end, and its errors.
#include "cabm/core/error.h"
#include "cabm/io/hf_tokenizer.h"
#include "cabm/io/safetensors.h"
#include "cabm/io/text_lines.h"
#include "cabm/io/unicode_text.h"
#include "cabm/io/wordpiece.h"

#include "util/hf_tokenizer_fixtures.h"
#include "util/test_util.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

namespace cabm {
namespace {

using nlohmann::json;

std::vector<std::string> corpus() {
  return test::hf_tokenizers_expected().at("corpus").get<std::vector<std::string>>();
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

std::vector<int64_t> row(const Tensor& t, int64_t i, int64_t length) {
  const int64_t* p = t.data<int64_t>() + i * t.shape()[1];
  return std::vector<int64_t>(p, p + length);
}

bool matches(const json& entry, size_t line, const std::vector<int64_t>& ids, const std::string& key) {
  return ids == entry.at(key).at(line).get<std::vector<int64_t>>();
}

TEST(HfTokenizers, IdsOfEveryCorpusLineMatchTransformers) {
  const std::vector<std::string> lines = corpus();
  ASSERT_GE(lines.size(), 40u);
  ASSERT_GE(test::hf_tokenizers_expected().at("tokenizers").size(), 13u);
  for (const auto& [name, entry] : test::hf_tokenizers_expected().at("tokenizers").items()) {
    SCOPED_TRACE(name);
    const HfTokenizer tok = HfTokenizer::load(entry.at("dir").get<std::string>());
    EXPECT_EQ(tok.pad_id(), entry.at("pad_id").get<int64_t>());
    EXPECT_EQ(tok.has_token_types(), entry.at("has_token_types").get<bool>());
    EXPECT_EQ(tok.max_length(), entry.at("max_length").get<int64_t>());
    EXPECT_EQ(tok.special_token_count(), 2);
    for (size_t i = 0; i < lines.size(); ++i) {
      const TokenizedText t = tok.encode(lines[i], 0);
      EXPECT_TRUE(matches(entry, i, t.input_ids, "input_ids"))
          << "line " << i + 1 << ": " << json(lines[i]).dump() << "\n  cabm: " << json(t.input_ids).dump()
          << "\n  transformers: " << entry["input_ids"][i].dump();
      EXPECT_EQ(t.token_type_ids, std::vector<int64_t>(t.input_ids.size(), 0));
      EXPECT_EQ(t.attention_mask, std::vector<int64_t>(t.input_ids.size(), 1));
      const TokenizedText short_t = tok.encode(lines[i], 16);
      EXPECT_TRUE(matches(entry, i, short_t.input_ids, "input_ids_16"))
          << "max_length 16, line " << i + 1 << ": " << json(short_t.input_ids).dump() << " vs "
          << entry["input_ids_16"][i].dump();
    }
  }
}

// The corpus exercises what it claims: unknown tokens, truncation to the maximum, and special
// tokens written in the text.
TEST(HfTokenizers, CorpusCoversUnknownsTruncationAndSpecials) {
  const json& bert = test::hf_tokenizers_expected()["tokenizers"]["all_minilm_l6_v2"];
  int unknown = 0, truncated = 0, mask = 0;
  for (const json& ids : bert["input_ids"]) {
    for (const json& id : ids) {
      unknown += id == 100;
      mask += id == 103;
    }
    truncated += ids.size() == 512;
  }
  EXPECT_GT(unknown, 5);
  EXPECT_GE(truncated, 1);
  EXPECT_GE(mask, 2);
}

TEST(HfTokenizers, TokenizeCommandWritesWhatTransformersReturns) {
  const std::string corpus_file = test::hf_tokenizers_dir() + "/corpus.txt";
  for (const std::string name :
       {"all_minilm_l6_v2", "bert_uncased", "bert_cased_strip_accents", "bert_vocab_txt", "distilbert", "roberta",
        "roberta_prefix_space", "roberta_files", "xlmr", "xlmr_spm_only", "xlmr_unigram"}) {
    SCOPED_TRACE(name);
    const json& entry = test::hf_tokenizers_expected()["tokenizers"][name];
    const std::string out = test::temp_dir() + "/" + name + ".safetensors";
    const auto r = test::run_cabm("tokenize --model " + entry["dir"].get<std::string>() + " --input " + corpus_file +
                                  " --output " + out);
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_TRUE(r.err.empty()) << r.err;
    const SafetensorsFile got = read_safetensors(out);
    const SafetensorsFile want = read_safetensors(test::hf_tokenizers_dir() + "/" + name + ".expected.safetensors");
    ASSERT_EQ(got.tensors.size(), want.tensors.size());
    for (const auto& [key, tensor] : want.tensors) {
      SCOPED_TRACE(key);
      const Tensor& g = got.get(key, DType::I64, tensor.shape());
      for (int64_t i = 0; i < tensor.shape()[0]; ++i)
        EXPECT_EQ(row(g, i, tensor.shape()[1]), row(tensor, i, tensor.shape()[1])) << "input " << i + 1;
    }
  }
}

// --max-length, standard input, \r\n line ends, a last line without a newline.
TEST(HfTokenizers, TokenizeCommandReadsStandardInputWithCrLf) {
  const std::vector<std::string> lines = corpus();
  const json& entry = test::hf_tokenizers_expected()["tokenizers"]["all_minilm_l6_v2"];
  std::string text;
  for (size_t i = 0; i < 12; ++i) text += lines[i] + (i + 1 < 12 ? "\r\n" : "");
  const std::string in = test::temp_dir() + "/crlf.txt", out = test::temp_dir() + "/crlf.safetensors";
  write_bytes(in, text);
  const std::string cmd = "CABM_NUM_THREADS=2 " + test::cabm_binary() + " tokenize --model " +
                          entry["dir"].get<std::string>() + " --input - --max-length 16 --output " + out + " < " + in;
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  const SafetensorsFile got = read_safetensors(out);
  const Tensor& ids = got.get("input_ids");
  const Tensor& mask = got.get("attention_mask");
  ASSERT_EQ(ids.shape(), (Shape{12, 16}));
  EXPECT_NE(got.find("token_type_ids"), nullptr);
  for (int64_t i = 0; i < 12; ++i) {
    const auto want = entry["input_ids_16"][static_cast<size_t>(i)].get<std::vector<int64_t>>();
    const int64_t n = static_cast<int64_t>(want.size());
    EXPECT_EQ(row(ids, i, n), want) << "input " << i + 1;
    EXPECT_EQ(row(mask, i, 16),
              [&] {
                std::vector<int64_t> m(16, 0);
                std::fill(m.begin(), m.begin() + n, 1);
                return m;
              }())
        << "input " << i + 1;
    for (int64_t j = n; j < 16; ++j) EXPECT_EQ(ids.data<int64_t>()[i * 16 + j], 0);  // [PAD]
  }
}

std::string corpus_file() {
  return test::hf_tokenizers_dir() + "/corpus.txt";
}
std::string model_dir(const std::string& name) {
  return test::hf_tokenizers_expected()["tokenizers"][name]["dir"].get<std::string>();
}

TEST(HfTokenizers, TokenizeCommandErrorsAreOneLine) {
  const std::string out = test::temp_dir() + "/err.safetensors";
  const std::string base = " --input " + corpus_file() + " --output " + out;
  test::expect_one_line_error(test::run_cabm("tokenize --model /nonexistent/model" + base), "/nonexistent/model");
  test::expect_one_line_error(test::run_cabm("tokenize --model " + test::hf_tokenizers_dir() + "/bin_only" + base),
                              "no tokenizer files");
  test::expect_one_line_error(test::run_cabm("tokenize --model " + corpus_file() + base), "not a directory");

  const std::string bad = test::temp_dir() + "/bad_utf8.txt";
  write_bytes(bad, "good line\nanother\nbad \xC3\x28 byte\n");
  const auto r =
      test::run_cabm("tokenize --model " + model_dir("bert_uncased") + " --input " + bad + " --output " + out);
  test::expect_one_line_error(r, "line 3");
  EXPECT_EQ(r.status, 1);
  test::expect_one_line_error(
      test::run_cabm("tokenize --model " + model_dir("bert_uncased") + " --input /nonexistent.txt --output " + out),
      "/nonexistent.txt");
  const std::string empty = test::temp_dir() + "/empty.txt";
  write_bytes(empty, "");
  test::expect_one_line_error(
      test::run_cabm("tokenize --model " + model_dir("bert_uncased") + " --input " + empty + " --output " + out),
      "no input lines");
  for (const std::string flag : {"0", "-3", "abc", "1.5", "99999999999999999999"}) {
    const auto u = test::run_cabm("tokenize --model " + model_dir("bert_uncased") + base + " --max-length " + flag);
    test::expect_one_line_error(u, "--max-length");
    EXPECT_EQ(u.status, 2) << flag;
  }
  const auto few = test::run_cabm("tokenize --model " + model_dir("roberta") + base + " --max-length 1");
  test::expect_one_line_error(few, "--max-length");
  EXPECT_EQ(few.status, 2);
  test::expect_one_line_error(test::run_cabm("tokenize --model " + model_dir("bert_uncased") + " --input " +
                                             corpus_file() + " --output /nonexistent/dir/out.safetensors"),
                              "/nonexistent/dir");
  EXPECT_FALSE(std::filesystem::exists(out));
  // A directory whose tokenizer.json is not JSON, or names a model cabm does not run.
  const std::string broken = test::temp_dir() + "/broken";
  std::filesystem::create_directories(broken);
  write_bytes(broken + "/tokenizer.json", "{\"model\": ");
  test::expect_one_line_error(test::run_cabm("tokenize --model " + broken + base), "tokenizer.json");
  write_bytes(broken + "/tokenizer.json", R"({"model": {"type": "WordLevel", "vocab": {}}})");
  test::expect_one_line_error(test::run_cabm("tokenize --model " + broken + base), "WordLevel");
  write_bytes(broken + "/tokenizer.json",
              R"({"model": {"type": "WordPiece", "vocab": {"a": 0}, "unk_token": "[UNK]"}})");
  test::expect_one_line_error(test::run_cabm("tokenize --model " + broken + base), "[UNK]");
  write_bytes(broken + "/tokenizer.json",
              R"({"model": {"type": "WordPiece", "vocab": {"[UNK]": 0}}, "pre_tokenizer": {"type": "Whitespace"}})");
  test::expect_one_line_error(test::run_cabm("tokenize --model " + broken + base), "pre_tokenizer 'Whitespace'");
  write_bytes(broken + "/tokenizer.json", R"({"model": {"type": "Unigram", "vocab": [["a", -1.0]], "unk_id": 4}})");
  test::expect_one_line_error(test::run_cabm("tokenize --model " + broken + base), "unk_id");
}

TEST(HfTokenizers, LoadErrorsNameTheFile) {
  EXPECT_NE(test::error_of([] { HfTokenizer::load("/nonexistent/dir"); }).find("/nonexistent/dir"), std::string::npos);
  const std::string dir = test::temp_dir() + "/bpe_bad";
  std::filesystem::create_directories(dir);
  write_bytes(dir + "/vocab.json", R"({"a": 0, "b": 1, "<s>": 2, "</s>": 3, "<pad>": 4})");
  write_bytes(dir + "/merges.txt", "#version: 0.2\na b\n");
  EXPECT_NE(test::error_of([&] { HfTokenizer::load(dir); }).find("merges.txt: merge 1 'a b'"), std::string::npos)
      << test::error_of([&] { HfTokenizer::load(dir); });
  write_bytes(dir + "/merges.txt", "#version: 0.2\nab\n");
  EXPECT_NE(test::error_of([&] { HfTokenizer::load(dir); }).find("is not a merge"), std::string::npos);
  write_bytes(dir + "/merges.txt", "#version: 0.2\n");
  const HfTokenizer tok = HfTokenizer::load(dir);
  EXPECT_EQ(tok.encode("ab", 0).input_ids, (std::vector<int64_t>{2, 0, 1, 3}));
  EXPECT_FALSE(tok.has_token_types());
  EXPECT_EQ(tok.max_length(), std::numeric_limits<int64_t>::max());  // nothing says a maximum
  EXPECT_NE(test::error_of([&] { tok.encode("ab", 1); }).find("special tokens"), std::string::npos);
  EXPECT_NE(test::error_of([&] { tok.encode("\xFF", 0); }).find("not valid UTF-8"), std::string::npos);
}

TEST(HfTokenizers, FromTokenizerJsonParsesWhatLoadReads) {
  const std::string dir = model_dir("bert_uncased");
  const HfTokenizer from_text =
      HfTokenizer::from_tokenizer_json(test::read_file(dir + "/tokenizer.json"), "bert_uncased/tokenizer.json");
  const HfTokenizer loaded = HfTokenizer::load(dir);
  EXPECT_EQ(from_text.max_length(), std::numeric_limits<int64_t>::max());  // no tokenizer_config.json
  for (const std::string& line : corpus())
    EXPECT_EQ(from_text.encode(line, 128).input_ids, loaded.encode(line, 0).input_ids);
  std::string nested = "null";
  for (int i = 0; i < 100; ++i) nested = R"({"type": "Sequence", "normalizers": [)" + nested + "]}";
  const std::string doc = R"({"model": {"type": "WordPiece", "vocab": {"[UNK]": 0}}, "normalizer": )" + nested + "}";
  EXPECT_NE(
      test::error_of([&] { HfTokenizer::from_tokenizer_json(doc, "deep.json"); }).find("deep.json: Sequence nested"),
      std::string::npos);
}

// Found by fuzz_hf_tokenizer: a 'single' template holding the sequence twice (or $B) made
// encodings longer than max_length, since truncation reserves room for special tokens only.
TEST(HfTokenizers, SingleTemplateHoldsTheSequenceOnce) {
  const auto with_single = [](const std::string& single) {
    return R"({"model": {"type": "WordPiece", "unk_token": "[UNK]", "vocab": {"[UNK]": 0, "[CLS]": 1, "a": 2}},
               "pre_tokenizer": {"type": "BertPreTokenizer"}, "post_processor": {"type": "TemplateProcessing", "single": )" +
           single + R"(, "special_tokens": {"[CLS]": {"id": "[CLS]", "ids": [1], "tokens": ["[CLS]"]}}}})";
  };
  const std::string once = R"([{"SpecialToken": {"id": "[CLS]"}}, {"Sequence": {"id": "A"}}])";
  EXPECT_EQ(HfTokenizer::from_tokenizer_json(with_single(once), "t.json").encode("a a a a", 3).input_ids,
            (std::vector<int64_t>{1, 2, 2}));
  const std::string twice = R"([{"Sequence": {"id": "A"}}, {"SpecialToken": {"id": "[CLS]"}}, {"Sequence": {"id": "A"}}])";
  EXPECT_NE(test::error_of([&] { HfTokenizer::from_tokenizer_json(with_single(twice), "t.json"); })
                .find("t.json: post_processor's 'single' template holds the sequence more than once"),
            std::string::npos);
  const std::string b = R"([{"Sequence": {"id": "B"}}])";
  EXPECT_NE(test::error_of([&] { HfTokenizer::from_tokenizer_json(with_single(b), "t.json"); }).find("sequence 'B'"),
            std::string::npos);
}

// Found by fuzz_hf_tokenizer (session 9): a float where tokenizer.json has an integer (an id, a
// type id, pad_id, max_input_chars_per_word) was converted by nlohmann's get<int64_t>, undefined
// behaviour beyond 2^63 (UBSan: "6.66667e+23 is outside the range of representable values").
// Each is now an error naming the file and the key; so is a negative id.
TEST(HfTokenizers, NonIntegerIdsAreErrorsNamingTheKey) {
  const auto doc = [](const std::string& model_extra, const std::string& added, const std::string& type_id,
                      const std::string& special_ids) {
    return R"({"model": {"type": "WordPiece", "unk_token": "[UNK]", "vocab": {"[UNK]": 0, "[CLS]": 1, "a": 2})" +
           model_extra + R"(}, "added_tokens": [{"id": )" + added +
           R"(, "content": "[CLS]", "special": true}], "pre_tokenizer": {"type": "BertPreTokenizer"},
               "post_processor": {"type": "TemplateProcessing",
                 "single": [{"SpecialToken": {"id": "[CLS]", "type_id": )" +
           type_id + R"(}}, {"Sequence": {"id": "A", "type_id": 0}}],
                 "special_tokens": {"[CLS]": {"id": "[CLS]", "ids": )" +
           special_ids + R"(, "tokens": ["[CLS]"]}}}})";
  };
  EXPECT_EQ(HfTokenizer::from_tokenizer_json(doc("", "1", "0", "[1]"), "t.json").encode("a", 4).input_ids,
            (std::vector<int64_t>{1, 2}));
  const struct {
    std::string text, key;
  } bad[] = {
      {doc("", "6.66667e+23", "0", "[1]"), "t.json: added_tokens id"},
      {doc("", "1.5", "0", "[1]"), "t.json: added_tokens id"},
      {doc("", "-1", "0", "[1]"), "t.json: added_tokens id"},
      {doc("", "1", "4.44111e+91", "[1]"), "t.json: type_id"},
      {doc("", "1", "0", "[1e30]"), "t.json: post_processor special token id"},
      {doc(R"(, "max_input_chars_per_word": 1e19)", "1", "0", "[1]"), "t.json: max_input_chars_per_word"},
  };
  for (const auto& b : bad) {
    SCOPED_TRACE(b.text);
    EXPECT_NE(test::error_of([&] { HfTokenizer::from_tokenizer_json(b.text, "t.json"); }).find(b.key),
              std::string::npos);
  }
}

TEST(TextLines, SplitsLinesAsTheContractSays) {
  EXPECT_EQ(split_text_lines("a\r\nb\n", "x"), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(split_text_lines("a\n\n", "x"), (std::vector<std::string>{"a", ""}));
  EXPECT_EQ(split_text_lines("a\nb", "x"), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(split_text_lines("\n", "x"), (std::vector<std::string>{""}));
  EXPECT_EQ(split_text_lines("a\rb\n", "x"), (std::vector<std::string>{"a\rb"}));
  EXPECT_NE(test::error_of([] { split_text_lines("", "f.txt"); }).find("f.txt: no input lines"), std::string::npos);
  EXPECT_NE(test::error_of([] { split_text_lines("ok\nok\n\xE2\x82\n", "f.txt"); }).find("f.txt: line 3"),
            std::string::npos);
}

// The Unicode predicates follow the Rust functions that tokenizers calls.
TEST(UnicodeText, PredicatesAndLowercase) {
  using namespace unicode;
  EXPECT_TRUE(is_whitespace(U'\u3000'));
  EXPECT_TRUE(is_whitespace(U'\u0085'));
  EXPECT_TRUE(is_whitespace(U'\u2028'));
  EXPECT_FALSE(is_whitespace(U'\u200B'));  // zero-width space is Cf, not White_Space
  EXPECT_TRUE(is_other(U'\u200B'));
  EXPECT_TRUE(is_other(U'\uE000'));
  EXPECT_FALSE(is_other(U'\U000E0000'));  // unassigned (Cn) is not "other" in unicode_categories
  EXPECT_TRUE(is_punctuation(U'\u00BF'));
  EXPECT_FALSE(is_punctuation(U'$'));
  EXPECT_TRUE(is_mark_nonspacing(U'\u0301'));
  std::u32string lower;
  append_lowercase(lower, U'\u0130');
  append_lowercase(lower, U'\u03A3');
  append_lowercase(lower, U'A');
  EXPECT_EQ(lower, U"i\u0307\u03C3a");
  EXPECT_EQ(normalize(U"\u00E9", NormalForm::NFD), U"e\u0301");
  EXPECT_EQ(normalize(U"\uFB01", NormalForm::NFKC), U"fi");
  EXPECT_NE(test::error_of([] { decode_utf8("\xED\xA0\x80", "s"); }).find("s: not valid UTF-8 (byte offset 0)"),
            std::string::npos);  // a surrogate
}

TEST(Wordpiece, GreedyLongestMatchAndUnknown) {
  WordPiece wp;
  wp.vocab = {{"[UNK]", 0}, {"un", 1}, {"##aff", 2}, {"##able", 3}, {"u", 4}, {"##n", 5}};
  wp.unk_id = 0;
  wp.max_input_chars_per_word = 8;
  std::vector<int64_t> ids;
  wp.tokenize(U"unaffable", ids);  // 9 characters > 8
  wp.tokenize(U"unaff", ids);
  wp.tokenize(U"unx", ids);
  EXPECT_EQ(ids, (std::vector<int64_t>{0, 1, 2, 0}));
  EXPECT_EQ(bert_pre_tokenize(U" a,b  c$ "), (std::vector<std::u32string>{U"a", U",", U"b", U"c", U"$"}));
  BertNormalizerOptions options;
  const std::u32string text = std::u32string(U"\u00C9t\u00E9\t\u4E2D") + char32_t{0} + U"\u200Bx";
  EXPECT_EQ(bert_normalize(text, options), U"ete  \u4E2D x");
}

}  // namespace
}  // namespace cabm
