#include "cabm/interop/hf_pipeline.h"

#include "cabm/core/error.h"
#include "cabm/core/threads.h"

#include <fmt/format.h>

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <mutex>
#include <numeric>

namespace cabm {
namespace {

// A token id from another model's tokenizer, or the token type 1 of a pair's second text on a
// model with one type (type_vocab_size 1), would index past an embedding table (transformers
// raises an IndexError there). The encoder refuses such ids too, but by batch row after the length
// sort; here the error names the input line and the config key.
void check_ids_fit_model(const TokenizedText& t, const HfEncoderConfig& config, bool types, bool pair,
                         const std::string& source, size_t line) {
  for (int64_t id : t.input_ids)
    if (id < 0 || id >= config.vocab_size)
      throw Error(
          fmt::format("{}: line {}: the tokenizer gave token id {}, outside the {} ids of {} (vocab_size): "
                      "is the tokenizer this model's?",
                      source, line, id, config.vocab_size, config.path));
  if (!types) return;
  const int64_t type_count = std::max<int64_t>(config.type_vocab_size, 1);
  for (int64_t type : t.token_type_ids)
    if (type < 0 || type >= type_count)
      throw Error(fmt::format("{}: line {}: token type {}{} is outside the {} token type{} of {} (type_vocab_size)",
                              source, line, type, pair ? " (the pair's second text)" : "", type_count,
                              type_count == 1 ? "" : "s", config.path));
}

}  // namespace

std::vector<HfSequence> hf_tokenize(const HfTokenizer& tokenizer, const HfEncoder& model,
                                    const std::vector<std::string>& texts, const std::vector<std::string>& pairs,
                                    int64_t max_length, const std::string& source) {
  if (!pairs.empty() && pairs.size() != texts.size())
    throw Error(fmt::format("{}: {} texts but {} second texts of pairs", source, texts.size(), pairs.size()));
  const bool types = model.config.family != HfFamily::kDistilBert && tokenizer.has_token_types();
  std::vector<HfSequence> out;
  out.reserve(texts.size());
  for (size_t i = 0; i < texts.size(); ++i) {
    TokenizedText t;
    try {
      t = pairs.empty() ? tokenizer.encode(texts[i], max_length)
                        : tokenizer.encode_pair(texts[i], pairs[i], max_length);
    } catch (const UsageError&) {
      throw;
    } catch (const Error& e) {
      throw Error(fmt::format("{}: line {}: {}", source, i + 1, e.what()));
    }
    if (static_cast<int64_t>(t.input_ids.size()) > model.config.max_tokens())
      throw Error(
          fmt::format("{}: line {}: {} tokens, more than the {} positions of {} (max_position_embeddings); "
                      "pass --max-length",
                      source, i + 1, t.input_ids.size(), model.config.max_tokens(), model.config.path));
    check_ids_fit_model(t, model.config, types, !pairs.empty(), source, i + 1);
    out.push_back(HfSequence{std::move(t.input_ids), types ? std::move(t.token_type_ids) : std::vector<int64_t>()});
  }
  return out;
}

int hf_batch_streams(int threads, int64_t batches, int requested) {
  CABM_CHECK(requested >= 0, "batch streams must not be negative, got {}", requested);
  if (requested > 0) return std::clamp(requested, 1, std::max(threads, 1));
  constexpr int64_t kBatchesPerStream = 4;  // enough for the dynamic hand-out to even out the loads
  return threads > 1 && batches >= kBatchesPerStream * threads ? threads : 1;
}

void hf_run_batches(const HfEncoder& model, const std::vector<HfSequence>& sequences, const HfBatchOptions& options,
                    const std::function<void(const std::vector<size_t>& indices, const HfOutputs& outputs)>& consume) {
  if (options.batch_size < 1) throw UsageError(fmt::format("batch size {} must be positive", options.batch_size));
  const size_t n = sequences.size();
  for (size_t i = 0; i < n; ++i) {
    const HfSequence& s = sequences[i];
    if (s.input_ids.empty()) throw Error(fmt::format("input {} has no tokens", i + 1));
    if (!s.token_type_ids.empty() && s.token_type_ids.size() != s.input_ids.size())
      throw Error(
          fmt::format("input {}: {} token type ids for {} tokens", i + 1, s.token_type_ids.size(), s.input_ids.size()));
  }
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return sequences[a].input_ids.size() > sequences[b].input_ids.size(); });
  const bool types = model.config.family != HfFamily::kDistilBert;
  const size_t batch = static_cast<size_t>(options.batch_size);
  const int64_t batches = static_cast<int64_t>((n + batch - 1) / batch);

  // Batch k: the sorted sequences [k·batch, (k+1)·batch), padded to the first (the longest).
  const auto batch_inputs = [&](int64_t k, std::vector<size_t>& indices) {
    const size_t begin = static_cast<size_t>(k) * batch;
    indices.assign(order.begin() + static_cast<std::ptrdiff_t>(begin),
                   order.begin() + static_cast<std::ptrdiff_t>(std::min(n, begin + batch)));
    const int64_t B = static_cast<int64_t>(indices.size());
    const int64_t T = static_cast<int64_t>(sequences[indices[0]].input_ids.size());  // the longest: sorted
    HfInputs in;
    in.input_ids = Tensor::empty({B, T}, DType::I64);
    in.attention_mask = Tensor::empty({B, T}, DType::I64);
    if (types) in.token_type_ids = Tensor::empty({B, T}, DType::I64);
    int64_t* ids = in.input_ids.data<int64_t>();
    int64_t* mask = in.attention_mask.data<int64_t>();
    int64_t* tt = types ? in.token_type_ids.data<int64_t>() : nullptr;
    for (int64_t b = 0; b < B; ++b) {
      const HfSequence& s = sequences[indices[static_cast<size_t>(b)]];
      const int64_t len = static_cast<int64_t>(s.input_ids.size());
      for (int64_t t = 0; t < T; ++t) {
        const bool token = t < len;
        ids[b * T + t] = token ? s.input_ids[static_cast<size_t>(t)] : model.config.pad_token_id;
        mask[b * T + t] = token ? 1 : 0;
        if (tt) tt[b * T + t] = token && !s.token_type_ids.empty() ? s.token_type_ids[static_cast<size_t>(t)] : 0;
      }
    }
    return in;
  };

  // One batch through the encoder, its outputs to `consume` and the progress (one stream at a
  // time: the lock). Once a batch has failed no other batch's outputs are delivered: a failure of
  // consume or progress is marked before the lock is let go, so another stream cannot deliver in
  // the moment before the failing one records it (a descheduled stream once let the others
  // deliver every remaining batch).
  std::mutex mutex;
  std::atomic<bool> failed{false};
  int64_t done = 0;
  const auto run_batch = [&](int64_t k, HfEncoderCache& cache, std::vector<size_t>& indices) {
    const HfInputs in = batch_inputs(k, indices);
    const HfOutputs out = hf_outputs(model, hf_encoder_hidden(model, in, cache));
    const std::lock_guard<std::mutex> lock(mutex);
    if (failed.load()) return;
    try {
      consume(indices, out);
      done += static_cast<int64_t>(indices.size());
      if (options.progress) options.progress(done, static_cast<int64_t>(n));
    } catch (...) {
      failed = true;
      throw;
    }
  };

  const int streams = hf_batch_streams(num_threads(), batches, options.streams);
  if (streams == 1) {  // one batch at a time, each on every thread
    HfEncoderCache cache;
    std::vector<size_t> indices;
    for (int64_t k = 0; k < batches; ++k) run_batch(k, cache, indices);
    return;
  }

  // Several streams: each thread its own workspace and single-threaded kernels (its nested
  // parallel regions get one thread; gemm() and oneDNN run serially inside a parallel region), the
  // batches handed out one at a time in order, longest first, so the short ones at the end even
  // out the streams' loads.
  std::exception_ptr error;  // the first, under `mutex`
#pragma omp parallel num_threads(streams)
  {
    omp_set_num_threads(1);
    HfEncoderCache cache;
    std::vector<size_t> indices;
#pragma omp for schedule(dynamic, 1)
    for (int64_t k = 0; k < batches; ++k) {
      if (failed.load()) continue;
      try {
        run_batch(k, cache, indices);
      } catch (...) {
        const std::lock_guard<std::mutex> lock(mutex);
        if (!error) error = std::current_exception();
        failed = true;
      }
    }
  }
  if (error) std::rethrow_exception(error);
}

Tensor hf_embed(const HfEncoder& model, const std::vector<HfSequence>& sequences, HfPooling pooling, bool normalize,
                const HfBatchOptions& options) {
  if (pooling == HfPooling::kNone) throw Error("hf_embed: pooling none has no embedding vector (hf_hidden_states)");
  const int64_t n = static_cast<int64_t>(sequences.size()), E = model.hidden_size();
  Tensor out = Tensor::zeros({n, E});
  float* dst = out.data<float>();
  std::vector<double> sum(static_cast<size_t>(E));
  hf_run_batches(model, sequences, options, [&](const std::vector<size_t>& indices, const HfOutputs& o) {
    const int64_t T = o.last_hidden_state.size(1);
    const float* h = o.last_hidden_state.data<float>();
    for (size_t b = 0; b < indices.size(); ++b) {
      const int64_t len = static_cast<int64_t>(sequences[indices[b]].input_ids.size());
      const float* row = h + static_cast<int64_t>(b) * T * E;
      float* v = dst + static_cast<int64_t>(indices[b]) * E;
      const int64_t count = pooling == HfPooling::kCls ? 1 : len;
      // Token by token (each feature's sum in token order), reading the rows as they lie in memory.
      std::fill(sum.begin(), sum.end(), 0.0);
      for (int64_t t = 0; t < count; ++t)
        for (int64_t e = 0; e < E; ++e) sum[static_cast<size_t>(e)] += row[t * E + e];
      for (int64_t e = 0; e < E; ++e)
        v[e] = static_cast<float>(sum[static_cast<size_t>(e)] / std::max<double>(static_cast<double>(count), 1e-9));
      if (normalize) {
        double sq = 0;
        for (int64_t e = 0; e < E; ++e) sq += static_cast<double>(v[e]) * v[e];
        const double scale = 1.0 / std::max(std::sqrt(sq), 1e-12);
        for (int64_t e = 0; e < E; ++e) v[e] = static_cast<float>(v[e] * scale);
      }
    }
  });
  return out;
}

HfHiddenStates hf_hidden_states(const HfEncoder& model, const std::vector<HfSequence>& sequences,
                                const HfBatchOptions& options) {
  const int64_t n = static_cast<int64_t>(sequences.size()), E = model.hidden_size();
  int64_t T = 0;
  for (const HfSequence& s : sequences) T = std::max(T, static_cast<int64_t>(s.input_ids.size()));
  HfHiddenStates out{Tensor::zeros({n, T, E}), Tensor::zeros({n, T}, DType::I64)};
  float* dst = out.last_hidden_state.data<float>();
  int64_t* mask = out.attention_mask.data<int64_t>();
  hf_run_batches(model, sequences, options, [&](const std::vector<size_t>& indices, const HfOutputs& o) {
    const int64_t Tb = o.last_hidden_state.size(1);
    const float* h = o.last_hidden_state.data<float>();
    for (size_t b = 0; b < indices.size(); ++b) {
      const int64_t len = static_cast<int64_t>(sequences[indices[b]].input_ids.size());
      const int64_t i = static_cast<int64_t>(indices[b]);
      std::copy(h + static_cast<int64_t>(b) * Tb * E, h + (static_cast<int64_t>(b) * Tb + len) * E, dst + i * T * E);
      std::fill(mask + i * T, mask + i * T + len, int64_t{1});
    }
  });
  return out;
}

Tensor hf_logits(const HfEncoder& model, const std::vector<HfSequence>& sequences, const HfBatchOptions& options) {
  if (!model.has_classifier())
    throw Error(
        fmt::format("{}: {} has no classification head (architectures must name a "
                    "*ForSequenceClassification)",
                    model.config.path, model.config.architecture));
  const int64_t n = static_cast<int64_t>(sequences.size()), L = model.num_labels();
  Tensor out = Tensor::zeros({n, L});
  float* dst = out.data<float>();
  hf_run_batches(model, sequences, options, [&](const std::vector<size_t>& indices, const HfOutputs& o) {
    const float* logits = o.logits.data<float>();
    for (size_t b = 0; b < indices.size(); ++b)
      std::copy(logits + static_cast<int64_t>(b) * L, logits + static_cast<int64_t>(b + 1) * L,
                dst + static_cast<int64_t>(indices[b]) * L);
  });
  return out;
}

Tensor hf_probabilities(const Tensor& logits, bool multi_label) {
  const int64_t n = logits.size(0), L = logits.size(1);
  Tensor out = Tensor::empty({n, L});
  const Tensor in = logits.contiguous();
  const float* x = in.data<float>();
  float* p = out.data<float>();
  for (int64_t i = 0; i < n; ++i) {
    const float* row = x + i * L;
    if (multi_label) {
      for (int64_t j = 0; j < L; ++j) p[i * L + j] = static_cast<float>(1.0 / (1.0 + std::exp(-double{row[j]})));
      continue;
    }
    const double mx = *std::max_element(row, row + L);
    double sum = 0;
    for (int64_t j = 0; j < L; ++j) sum += std::exp(double{row[j]} - mx);
    for (int64_t j = 0; j < L; ++j) p[i * L + j] = static_cast<float>(std::exp(double{row[j]} - mx) / sum);
  }
  return out;
}

}  // namespace cabm
