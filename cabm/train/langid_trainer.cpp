#include "cabm/train/langid_trainer.h"

#include "cabm/core/error.h"
#include "cabm/train/model_config.h"

#include <algorithm>
#include <cmath>

namespace cabm {

ClassifierConfig langid_model_config(const TrainConfig& c, int64_t num_classes) {
  ClassifierConfig m = byte_model_config<ClassifierConfig>(c);
  m.activation = Activation::kRelu;
  m.num_classes = num_classes;
  m.final_norm = true;
  return m;
}

void pack_words(const std::vector<std::string>& words, int64_t max_len, Tensor& tokens, std::vector<int64_t>& lengths) {
  int64_t T = 1;
  for (const auto& w : words) T = std::max<int64_t>(T, static_cast<int64_t>(w.size()));
  CABM_CHECK(T <= max_len, "a word of {} bytes exceeds the model's {} positions", T, max_len);
  const auto B = static_cast<int64_t>(words.size());
  ensure_shape(tokens, {B, T}, DType::I64);
  lengths.resize(words.size());
  int64_t* p = tokens.data<int64_t>();
  std::fill(p, p + B * T, 0);
  for (int64_t b = 0; b < B; ++b) {
    const std::string& w = words[static_cast<size_t>(b)];
    for (size_t t = 0; t < w.size(); ++t) p[b * T + static_cast<int64_t>(t)] = static_cast<unsigned char>(w[t]);
    lengths[static_cast<size_t>(b)] = std::max<int64_t>(1, static_cast<int64_t>(w.size()));
  }
}

ClassifierEval evaluate_classifier(const Classifier& model, const WordDataset& data, int64_t max_len, int64_t B) {
  ClassifierCache cache;
  return evaluate_classifier(model, data, max_len, B, cache);
}

ClassifierEval evaluate_classifier(const Classifier& model, const WordDataset& data, int64_t max_len, int64_t B,
                                   ClassifierCache& cache) {
  const auto C = static_cast<int64_t>(data.languages.size());
  ClassifierEval out;
  out.confusion.assign(static_cast<size_t>(C), std::vector<int64_t>(static_cast<size_t>(C), 0));
  // All held-out words, sorted by length so that batches carry little padding.
  std::vector<std::pair<std::string, int64_t>> items;
  for (int64_t c = 0; c < C; ++c)
    for (const auto& w : data.validation[static_cast<size_t>(c)]) items.emplace_back(w, c);
  std::stable_sort(items.begin(), items.end(),
                   [](const auto& a, const auto& b) { return a.first.size() < b.first.size(); });
  LossOptions options;
  options.compute_grad = false;
  Tensor tokens, labels;
  std::vector<std::string> words;
  std::vector<int64_t> lengths;
  double loss_sum = 0.0;
  int64_t correct = 0;
  for (size_t first = 0; first < items.size(); first += static_cast<size_t>(B)) {
    const size_t n = std::min(items.size() - first, static_cast<size_t>(B));
    words.clear();
    ensure_shape(labels, {static_cast<int64_t>(n)}, DType::I64);
    for (size_t i = 0; i < n; ++i) {
      words.push_back(items[first + i].first);
      labels.data<int64_t>()[i] = items[first + i].second;
    }
    pack_words(words, max_len, tokens, lengths);
    const Tensor& logits = classifier_forward(model, tokens, lengths, cache);
    loss_sum += static_cast<double>(classifier_loss(labels, options, cache).loss) * static_cast<double>(n);
    const float* z = logits.data<float>();
    for (size_t i = 0; i < n; ++i) {
      const int64_t predicted = std::max_element(z + static_cast<int64_t>(i) * C, z + static_cast<int64_t>(i + 1) * C) -
                                (z + static_cast<int64_t>(i) * C);
      const int64_t truth = items[first + i].second;
      ++out.confusion[static_cast<size_t>(truth)][static_cast<size_t>(predicted)];
      correct += predicted == truth;
    }
  }
  out.loss = loss_sum / static_cast<double>(items.size());
  out.accuracy = static_cast<double>(correct) / static_cast<double>(items.size());
  return out;
}

std::vector<float> classify_word(const Classifier& model, const std::string& word) {
  Tensor tokens;
  std::vector<int64_t> lengths;
  pack_words({word}, model.config.max_seq_len, tokens, lengths);
  ClassifierCache cache;
  const Tensor& logits = classifier_forward(model, tokens, lengths, cache);
  std::vector<float> p = logits.to_vector();
  const float m = *std::max_element(p.begin(), p.end());
  double total = 0;
  for (float& v : p) total += (v = std::exp(v - m));
  for (float& v : p) v = static_cast<float>(v / total);
  return p;
}

LangIdTrainer::LangIdTrainer(const TrainConfig& config, WordDataset data) : config_(config), data_(std::move(data)) {
  validate(config_);
  const ClassifierConfig mc = langid_model_config(config_, static_cast<int64_t>(data_.languages.size()));
  check_training_memory(config_, parameter_count(mc), mc.num_classes);
  try {
    state_.model = make_classifier(mc);
    state_.grad_model = make_classifier(mc);
    start_training(config_, state_);
  } catch (const OutOfMemory& e) {
    rethrow_training_out_of_memory(config_, e);
  }
}

void LangIdTrainer::restore(const LoadedCheckpoint& checkpoint) {
  restore_training(checkpoint, state_);
}

void LangIdTrainer::synchronize_ranks() {
  broadcast_training_state(state_);
}

void LangIdTrainer::sample_share(int64_t B) {
  const World& w = world();
  if (!w.distributed()) {
    sample_words(data_, B, state_.data_rng, words_, label_values_);
    return;
  }
  // The global batch of K·B words, as one process would draw it; this rank keeps its B.
  sample_words(data_, w.size * B, state_.data_rng, global_words_, global_labels_);
  const auto first = static_cast<size_t>(w.rank * B);
  words_.assign(global_words_.begin() + static_cast<std::ptrdiff_t>(first),
                global_words_.begin() + static_cast<std::ptrdiff_t>(first + static_cast<size_t>(B)));
  label_values_.assign(global_labels_.begin() + static_cast<std::ptrdiff_t>(first),
                       global_labels_.begin() + static_cast<std::ptrdiff_t>(first + static_cast<size_t>(B)));
}

StepStats LangIdTrainer::train_step() {
  return training_step(config_, config_.accum, state_,
                       [&](int64_t, const ForwardMode& mode, const LossOptions& loss_options) {
                         sample_share(config_.batch_size);
                         pack_words(words_, config_.seq_len, tokens_, lengths_);
                         ensure_shape(labels_, {config_.batch_size}, DType::I64);
                         std::copy(label_values_.begin(), label_values_.end(), labels_.data<int64_t>());
                         MicroBatchResult result;
                         for (const int64_t n : lengths_) result.tokens += n;
                         classifier_forward(state_.model, tokens_, lengths_, cache_, mode);
                         result.loss = classifier_loss(labels_, loss_options, cache_).loss;
                         classifier_backward(state_.model, cache_, state_.grad_model);
                         return result;
                       });
}

ClassifierEval LangIdTrainer::evaluate() {
  return evaluate_classifier(state_.model, data_, config_.seq_len, 256, cache_);
}

std::string LangIdTrainer::save(const nlohmann::json& metrics) {
  const nlohmann::json data = {{"languages", data_.languages}};
  return save_training(config_, state_, classifier_metadata(state_.model.config, data_.languages), data, metrics);
}

}  // namespace cabm
