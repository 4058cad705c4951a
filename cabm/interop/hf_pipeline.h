// Running an HfEncoder over many texts of mixed lengths without paying for padding: the token
// sequences are sorted by length (longest first, ties in input order) and cut into batches of
// `batch_size` consecutive sequences, so each batch is padded only to its own longest member,
// which is at most a few tokens longer than its shortest once there are many texts. Results come
// back in input order and do not depend on the batch size or on the order of the inputs beyond
// float rounding (the rows of a product never mix, and key padding is skipped by the attention
// kernels, not computed and masked).
//
// Pooling follows sentence-transformers (models.Pooling, models.Normalize):
//   mean:  Σ_t mask_t·h_t / max(Σ_t mask_t, 1e-9)      cls: h_0
//   normalize: v / max(‖v‖₂, 1e-12)                     (torch.nn.functional.normalize)
#pragma once

#include "cabm/interop/hf_encoder.h"
#include "cabm/io/hf_tokenizer.h"

#include <functional>
#include <vector>

namespace cabm {

// One tokenised input: unpadded, special tokens included. Empty token_type_ids mean zeros.
struct HfSequence {
  std::vector<int64_t> input_ids;
  std::vector<int64_t> token_type_ids;
};

// Each text through the tokenizer (truncated to max_length ids; <= 0: the tokenizer's maximum),
// token types kept only when the model takes them. With `pairs` (non-empty: one second text per
// text), each input is the pair (texts[i], pairs[i]) (HfTokenizer::encode_pair: BERT's token
// types 0 then 1 reach the token-type embeddings). An input the tokenizer refuses is an error
// naming `source` and the line (1-based). Tokenised inputs longer than the model's position table,
// and token ids or token types outside the model's tables (vocab_size, type_vocab_size: another
// model's tokenizer, a pair on a model with one token type) are errors naming the line, the model
// and the config key.
std::vector<HfSequence> hf_tokenize(const HfTokenizer& tokenizer, const HfEncoder& model,
                                    const std::vector<std::string>& texts, const std::vector<std::string>& pairs,
                                    int64_t max_length, const std::string& source);

struct HfBatchOptions {
  int64_t batch_size = 32;
  // Called after each batch with the number of sequences done and the total (progress bars).
  std::function<void(int64_t done, int64_t total)> progress;
  // Batches run at once (hf_batch_streams), each on one thread with single-threaded kernels;
  // 0 chooses from the thread count and the number of batches.
  int streams = 0;
};

// The number of batch streams for `batches` batches on `threads` threads, `requested` as in
// HfBatchOptions::streams (clamped to [1, threads]). Automatic: as many streams as threads when
// there are at least 4 batches per thread, else one stream with every kernel on all threads.
// Streams trade the products' intra-op parallelism for none at all between the threads: no
// fork-join per kernel, no thread waiting for the other at the end of a product (which on a
// shared machine means waiting for a thread the OS has descheduled), and the small products of
// short batches no longer split across threads. The cost: one workspace per stream.
int hf_batch_streams(int threads, int64_t batches, int requested);

// Runs the batches; consume(indices, outputs) gets the input positions of the batch's sequences
// (row b of the outputs is sequences[indices[b]]) and the model's outputs, padded to the batch's
// longest sequence. outputs.last_hidden_state is the encoder's own buffer, overwritten by the
// stream's next batch: copy what must outlive the call. With several streams the batches finish
// in no fixed order, but consume and progress are called for one batch at a time (under a lock),
// so they need no locking of their own; an exception from any batch stops the others from
// starting and is rethrown here. The batches (which sequences, how padded) and so the results do
// not depend on the number of streams beyond the products' rounding.
void hf_run_batches(const HfEncoder& model, const std::vector<HfSequence>& sequences, const HfBatchOptions& options,
                    const std::function<void(const std::vector<size_t>& indices, const HfOutputs& outputs)>& consume);

// embeddings F32 [n, E]; pooling kMean or kCls.
Tensor hf_embed(const HfEncoder& model, const std::vector<HfSequence>& sequences, HfPooling pooling, bool normalize,
                const HfBatchOptions& options = {});

// last_hidden_state F32 [n, T, E] (zeros at padded positions, which are never computed) and
// attention_mask I64 [n, T], T = the longest sequence.
struct HfHiddenStates {
  Tensor last_hidden_state;
  Tensor attention_mask;
};
HfHiddenStates hf_hidden_states(const HfEncoder& model, const std::vector<HfSequence>& sequences,
                                const HfBatchOptions& options = {});

// logits F32 [n, num_labels] of a *ForSequenceClassification model.
Tensor hf_logits(const HfEncoder& model, const std::vector<HfSequence>& sequences, const HfBatchOptions& options = {});

// Class probabilities from logits [n, L]: softmax over each row, or independent sigmoids when
// multi_label.
Tensor hf_probabilities(const Tensor& logits, bool multi_label);

}  // namespace cabm
