// Byte tokenizer and UTF-8 handling, the fortunes parser and split, text files, training
// windows, and the langid word lists.
#include "cabm/io/text_data.h"
#include "cabm/io/tokenizer.h"
#include "cabm/io/word_lists.h"
#include "util/test_util.h"

#include <filesystem>
#include <fstream>
#include <functional>
#include <set>

namespace cabm {
namespace {

std::string write_temp(const std::string& name, const std::string& bytes) {
  const std::string path = test::temp_dir() + "/" + name;
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

using test::error_of;

TEST(Tokenizer, BytesRoundTrip) {
  const std::string text = "héllo, wörld! €";
  const auto tokens = encode_bytes(text);
  EXPECT_EQ(tokens.size(), text.size());
  EXPECT_EQ(tokens[1], 0xC3);
  EXPECT_EQ(decode_bytes(tokens), text);
  EXPECT_THROW(decode_bytes({300}), Error);
}

TEST(Tokenizer, FindsInvalidUtf8) {
  EXPECT_FALSE(find_invalid_utf8("plain ascii\n"));
  EXPECT_FALSE(find_invalid_utf8("ä € 𝄞"));
  EXPECT_EQ(find_invalid_utf8("ab\xC3"), 2u);            // truncated
  EXPECT_EQ(find_invalid_utf8("a\xC0\x80"), 1u);         // overlong NUL
  EXPECT_EQ(find_invalid_utf8("\xE0\x80\x80"), 0u);      // overlong 3-byte
  EXPECT_EQ(find_invalid_utf8("x\xED\xA0\x80"), 1u);     // surrogate U+D800
  EXPECT_EQ(find_invalid_utf8("\xF4\x90\x80\x80"), 0u);  // above U+10FFFF
  EXPECT_EQ(find_invalid_utf8("ok\x80"), 2u);            // stray continuation
  EXPECT_EQ(find_invalid_utf8("\xFF"), 0u);
}

TEST(Tokenizer, Utf8StreamPrintsWholeCharactersAndRepairs) {
  Utf8Stream s;
  EXPECT_EQ(s.push('a'), "a");
  EXPECT_EQ(s.push(0xE2), "");
  EXPECT_EQ(s.push(0x82), "");
  EXPECT_EQ(s.push(0xAC), "\xE2\x82\xAC");  // €
  EXPECT_EQ(s.push(0x80), "\xEF\xBF\xBD");  // stray continuation → U+FFFD
  EXPECT_EQ(s.push(0xC3), "");
  EXPECT_EQ(s.push('b'),
            "\xEF\xBF\xBD"
            "b");  // broken sequence, then b
  EXPECT_EQ(s.push(0xC3), "");
  EXPECT_EQ(s.finish(), "\xEF\xBF\xBD");
  EXPECT_EQ(s.finish(), "");
}

TEST(Fortunes, ParsesEntries) {
  const std::string file =
      "First one.\n%\nSecond\n  -- someone\n%\n%\n_\bB_\bo_\bl_\bd text\x07\n\n%\nLast, no separator\n";
  const auto entries = parse_fortunes(file);
  ASSERT_EQ(entries.size(), 4u);
  EXPECT_EQ(entries[0], "First one.");
  EXPECT_EQ(entries[1], "Second\n  -- someone");
  EXPECT_EQ(entries[2], "Bold text");  // overstrikes resolved, BEL dropped, blank lines trimmed
  EXPECT_EQ(entries[3], "Last, no separator");
}

TEST(Fortunes, SplitIsDeterministicAndByContent) {
  std::vector<std::string> docs;
  for (int i = 0; i < 2000; ++i) docs.push_back("fortune number " + std::to_string(i));
  const TextSplit a = split_documents(docs, 0.05, "x");
  std::vector<std::string> reversed(docs.rbegin(), docs.rend());
  const TextSplit b = split_documents(reversed, 0.05, "x");
  EXPECT_EQ(a.validation_documents, b.validation_documents);
  EXPECT_EQ(a.train_documents + a.validation_documents, 2000);
  EXPECT_GT(a.validation_documents, 60);  // about 5%
  EXPECT_LT(a.validation_documents, 140);
  // Same entries held out whatever the order.
  EXPECT_EQ(a.validation.size(), b.validation.size());
  for (int i : {0, 1, 17, 1999}) {
    const std::string entry = "fortune number " + std::to_string(i) + "\n%\n";
    const bool in_train = a.train.find(entry) != std::string::npos;
    const bool in_validation = a.validation.find(entry) != std::string::npos;
    EXPECT_NE(in_train, in_validation) << i;
    EXPECT_EQ(in_validation, b.validation.find(entry) != std::string::npos) << i;
  }
}

TEST(Fortunes, DebianCorpus) {
  if (!std::filesystem::is_directory(kFortunesDir)) GTEST_SKIP() << "fortunes not installed";
  const TextSplit split = load_fortunes();
  EXPECT_GT(split.train_documents, 5000);
  EXPECT_GT(split.validation_documents, 100);
  EXPECT_GT(split.train.size(), 1000000u);
  EXPECT_FALSE(find_invalid_utf8(split.train));
  for (const char c : split.train) {
    const auto u = static_cast<unsigned char>(c);
    ASSERT_TRUE(u >= 0x20 || c == '\n' || c == '\t') << "control byte " << int(u);
  }
}

TEST(TextFile, ErrorsAreClear) {
  EXPECT_NE(error_of([] { read_utf8_file("/nonexistent/x.txt"); }).find("/nonexistent/x.txt: no such file"),
            std::string::npos);
  EXPECT_NE(error_of([] { read_utf8_file(test::temp_dir()); }).find("is a directory"), std::string::npos);
  const std::string empty = write_temp("empty.txt", "");
  EXPECT_NE(error_of([&] { read_utf8_file(empty); }).find("file is empty"), std::string::npos);
  const std::string bad = write_temp("bad.txt", "hello \xFF world");
  EXPECT_NE(error_of([&] { read_utf8_file(bad); }).find("not valid UTF-8 (byte offset 6)"), std::string::npos);
}

TEST(TextFile, SplitsAtTheEnd) {
  std::string text;
  for (int i = 0; i < 100; ++i) text += "line " + std::to_string(i) + "\n";
  const TextSplit s = load_text_file(write_temp("lines.txt", text), 0.1);
  EXPECT_EQ(s.train + s.validation, text);
  EXPECT_EQ(s.train.back(), '\n');  // cut at a line boundary
  EXPECT_NEAR(static_cast<double>(s.validation.size()) / text.size(), 0.1, 0.03);
}

// split_text is load_text_file on bytes already in memory (what tests/fuzz/fuzz_text_data runs).
TEST(TextFile, SplitTextIsLoadTextFileOnABuffer) {
  std::string text;
  for (int i = 0; i < 50; ++i) text += "r\xC3\xA9sum\xC3\xA9 " + std::to_string(i) + "\n";
  const TextSplit from_file = load_text_file(write_temp("buffer.txt", text), 0.2);
  const TextSplit from_buffer = split_text(text, 0.2, "buffer");
  EXPECT_EQ(from_buffer.train, from_file.train);
  EXPECT_EQ(from_buffer.validation, from_file.validation);
  EXPECT_EQ(from_buffer.source, "buffer");
  EXPECT_NE(error_of([] { split_text("", 0.1, "buffer"); }).find("buffer: file is empty"), std::string::npos);
  EXPECT_NE(error_of([] { split_text("ok \xC0\xAF", 0.1, "buffer"); }).find("buffer: not valid UTF-8 (byte offset 3)"),
            std::string::npos);
}

TEST(Windows, RandomWindowsAreShiftedPairsAndReproducible) {
  const std::string text = "abcdefghijklmnopqrstuvwxyz";
  const int64_t B = 50, T = 5;
  std::vector<int64_t> in(B * T), tg(B * T), in2(B * T), tg2(B * T);
  Rng rng(3);
  sample_windows(text, B, T, rng, in.data(), tg.data());
  EXPECT_EQ(rng.position(), static_cast<uint64_t>(B));
  std::set<int64_t> starts;
  for (int64_t b = 0; b < B; ++b) {
    starts.insert(in[b * T]);
    for (int64_t t = 0; t < T; ++t) {
      EXPECT_EQ(tg[b * T + t], in[b * T + t] + 1);  // consecutive letters
      EXPECT_LE(tg[b * T + t], 'z');
    }
  }
  EXPECT_GT(starts.size(), 10u);
  Rng again(3);
  sample_windows(text, B, T, again, in2.data(), tg2.data());
  EXPECT_EQ(in, in2);
  EXPECT_THROW(sample_windows("abc", 1, 3, rng, in.data(), tg.data()), Error);
}

TEST(Windows, EvaluationWindowsCoverWithoutOverlap) {
  const std::string text(1000, 'x');
  const auto offsets = evaluation_offsets(text, 64, 1000);
  EXPECT_EQ(offsets.size(), 15u);  // (1000 − 65) / 64 + 1
  for (size_t i = 1; i < offsets.size(); ++i) EXPECT_GE(offsets[i] - offsets[i - 1], 64);
  EXPECT_EQ(offsets.back(), 1000 - 65);
  EXPECT_EQ(evaluation_offsets(text, 64, 4).size(), 4u);
}

TEST(WordLists, Lowercase) {
  EXPECT_EQ(lowercase_word("Hello"), "hello");
  EXPECT_EQ(lowercase_word("ÄÖÜß"), "äöüß");
  EXPECT_EQ(lowercase_word("ÉCOLE"), "école");
  EXPECT_EQ(lowercase_word("Œuvre"), "œuvre");
  EXPECT_EQ(lowercase_word("Ÿ×"), "ÿ×");
}

TEST(WordLists, CleansDeduplicatesAndBalances) {
  const std::string en = write_temp("en.txt", "Cat\ncat's\nhouse\ndie\nsupercalifragilisticexpialidocious\n");
  const std::string de = write_temp("de.txt", "Haus\nKatze\ndie\nÄrger\n");
  std::vector<WordListSource> sources = {{"english", en}, {"german", de}};
  WordListOptions options;
  options.validation_fraction = 0.5;
  options.max_bytes = 12;
  const WordDataset d = load_word_lists(sources, options);
  EXPECT_EQ(d.dropped_apostrophe, 1);
  EXPECT_EQ(d.dropped_long, 1);
  EXPECT_EQ(d.dropped_shared, 2);  // "die" in both lists, dropped from both
  std::set<std::string> en_words, de_words;
  for (const auto& w : d.train[0]) en_words.insert(w);
  for (const auto& w : d.validation[0]) en_words.insert(w);
  for (const auto& w : d.train[1]) de_words.insert(w);
  for (const auto& w : d.validation[1]) de_words.insert(w);
  EXPECT_EQ(en_words, (std::set<std::string>{"cat", "house"}));
  EXPECT_EQ(de_words, (std::set<std::string>{"haus", "katze", "ärger"}));

  EXPECT_NE(error_of([&] {
              load_word_lists({{"x", "/nonexistent/list"}});
            }).find("/nonexistent/list"),
            std::string::npos);
}

// The count of lists is checked before any list is read: 33 lists are refused as such, not after
// reading them (nor with the first one's "cannot open").
TEST(WordLists, TooManyListsAreRefusedBeforeReading) {
  const std::vector<WordListSource> many(33, WordListSource{"x", "/nonexistent/list"});
  const std::string message = error_of([&] { load_word_lists(many); });
  EXPECT_NE(message.find("at most 32 languages"), std::string::npos) << message;
  EXPECT_NE(error_of([&] { load_word_lists({}); }).find("no word lists"), std::string::npos);
}

TEST(WordLists, ParseWordListsIsLoadWordListsOnBuffers) {
  const std::string en_text = "Cat\ncat's\nhouse\ndie\r\nmouse \nbird\n\xC3\x28" "bad\n";
  const std::string de_text = "Haus\nKatze\ndie\n\xC3\x84rger\nMaus\nVogel";
  const std::vector<WordListSource> sources = {{"english", write_temp("en2.txt", en_text)},
                                               {"german", write_temp("de2.txt", de_text)}};
  WordListOptions options;
  options.validation_fraction = 0.5;
  const WordDataset from_files = load_word_lists(sources, options);
  const WordDataset from_buffers = parse_word_lists(sources, {en_text, de_text}, options);
  EXPECT_EQ(from_buffers.languages, from_files.languages);
  EXPECT_EQ(from_buffers.train, from_files.train);
  EXPECT_EQ(from_buffers.validation, from_files.validation);
  EXPECT_EQ(from_buffers.dropped_shared, from_files.dropped_shared);
  EXPECT_EQ(from_buffers.dropped_apostrophe, from_files.dropped_apostrophe);
  // Errors name the list's path, as when it was read from the file.
  EXPECT_NE(error_of([&] { parse_word_lists(sources, {en_text, "x'y\n"}, options); }).find(sources[1].path),
            std::string::npos);
}

TEST(WordLists, BalancedSampling) {
  std::string many, few;
  for (int i = 0; i < 500; ++i) many += "word" + std::to_string(i) + "\n";
  for (int i = 0; i < 30; ++i) few += "mot" + std::to_string(i) + "\n";
  const WordDataset d = load_word_lists({{"a", write_temp("many.txt", many)}, {"b", write_temp("few.txt", few)}});
  Rng rng(5);
  std::vector<std::string> words;
  std::vector<int64_t> labels;
  sample_words(d, 4000, rng, words, labels);
  int64_t ones = 0;
  for (const int64_t l : labels) ones += l;
  EXPECT_NEAR(static_cast<double>(ones) / 4000, 0.5, 0.04);
  for (size_t i = 0; i < words.size(); ++i) EXPECT_EQ(words[i].rfind(labels[i] ? "mot" : "word", 0), 0u);
}

TEST(WordLists, DebianLists) {
  for (const auto& s : default_word_lists())
    if (!std::filesystem::exists(s.path)) GTEST_SKIP() << s.path << " not installed";
  const WordDataset d = load_word_lists(default_word_lists());
  ASSERT_EQ(d.languages.size(), 5u);
  for (size_t c = 0; c < 5; ++c) {
    EXPECT_GT(d.train[c].size(), 30000u) << d.languages[c];
    EXPECT_EQ(d.validation[c].size(), 2000u) << d.languages[c];
  }
  EXPECT_GT(d.dropped_shared, 1000);
}

}  // namespace
}  // namespace cabm
