#include "train/langid_trainer.h"

#include "core/error.h"
#include "io/state_dict.h"
#include "io/tokenizer.h"
#include "nn/init.h"
#include "nn/parameters.h"
#include "train/grad_clip.h"
#include "train/model_config.h"
#include "train/schedule.h"

#include <algorithm>
#include <chrono>
#include <cmath>

namespace cabm {

ClassifierConfig langid_model_config(const TrainConfig& c, int64_t num_classes) {
  ClassifierConfig m;
  m.vocab_size = kByteVocabSize;
  m.max_seq_len = c.seq_len;
  m.d_model = c.d_model;
  m.nhead = c.heads;
  m.num_layers = c.layers;
  m.dim_feedforward = c.d_ff;
  m.dropout = c.dropout;
  m.activation = Activation::kRelu;
  m.norm_first = c.norm_first;
  m.num_classes = num_classes;
  m.final_norm = true;
  m.positional = PositionalKind::kLearned;
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
  const auto C = static_cast<int64_t>(data.languages.size());
  ClassifierEval out;
  out.confusion.assign(static_cast<size_t>(C), std::vector<int64_t>(static_cast<size_t>(C), 0));
  // All held-out words, sorted by length so that batches carry little padding.
  std::vector<std::pair<std::string, int64_t>> items;
  for (int64_t c = 0; c < C; ++c)
    for (const auto& w : data.validation[static_cast<size_t>(c)]) items.emplace_back(w, c);
  std::stable_sort(items.begin(), items.end(),
                   [](const auto& a, const auto& b) { return a.first.size() < b.first.size(); });
  ClassifierCache cache;
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

LangIdTrainer::LangIdTrainer(const TrainConfig& config, WordDataset data)
    : config_(config), data_(std::move(data)), data_rng_(data_seed(config.seed)) {
  validate(config_);
  const ClassifierConfig mc = langid_model_config(config_, static_cast<int64_t>(data_.languages.size()));
  model_ = make_classifier(mc);
  grad_model_ = make_classifier(mc);
  params_ = named_parameters(model_);
  grads_ = named_parameters(grad_model_);
  if (config_.init.empty()) {
    Rng init_rng(config_.seed);
    init_parameters(model_, init_rng);
  } else {
    load_parameters(read_safetensors(config_.init), params_);
  }
  set_precision(model_, config_.precision);  // bf16 copies of the initial weights
  opt_ = make_adamw(params_, config_.adamw);
  config_.schedule.total_steps = config_.steps;
  config_.schedule.d_model = config_.d_model;
  if (config_.schedule.kind == ScheduleKind::kWarmup)
    config_.schedule.scale = warmup_scale_for_peak(config_.schedule.lr, config_.d_model, config_.schedule.warmup);
}

void LangIdTrainer::restore(const LoadedCheckpoint& checkpoint) {
  load_parameters(checkpoint.model, params_);
  refresh_bf16_weights(model_);
  if (!checkpoint.optimizer) throw Error(fmt::format("{}: no optimizer state to resume from", checkpoint.dir));
  load_adamw_state(*checkpoint.optimizer, opt_);
  try {
    const auto& data = checkpoint.state.at("data_rng");
    data_rng_ = Rng(data.at("seed").get<uint64_t>(), data.at("position").get<uint64_t>());
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("{}/{}: malformed training state: {}", checkpoint.dir, kStateFile, e.what()));
  }
}

StepStats LangIdTrainer::train_step() {
  const auto start = std::chrono::steady_clock::now();
  zero_tensors(grads_);
  LossOptions loss_options;
  loss_options.grad_scale = 1.0f / static_cast<float>(config_.accum);
  double loss_sum = 0.0;
  int64_t tokens = 0;
  for (int64_t micro = 0; micro < config_.accum; ++micro) {
    sample_words(data_, config_.batch_size, data_rng_, words_, label_values_);
    pack_words(words_, config_.seq_len, tokens_, lengths_);
    ensure_shape(labels_, {config_.batch_size}, DType::I64);
    std::copy(label_values_.begin(), label_values_.end(), labels_.data<int64_t>());
    for (const int64_t n : lengths_) tokens += n;
    ForwardMode mode;
    mode.training = true;
    mode.seed = config_.seed;
    mode.step = static_cast<uint64_t>(opt_.step * config_.accum + micro);
    classifier_forward(model_, tokens_, lengths_, cache_, mode);
    loss_sum += classifier_loss(labels_, loss_options, cache_).loss;
    classifier_backward(model_, cache_, grad_model_);
  }
  StepStats stats;
  stats.step = opt_.step + 1;
  stats.loss = loss_sum / static_cast<double>(config_.accum);
  if (!std::isfinite(stats.loss))
    throw Error(fmt::format("training diverged: loss is {} at step {} (try a lower --lr)", stats.loss, stats.step));
  stats.grad_norm = clip_grad_norm(grads_, config_.clip);
  stats.lr = learning_rate(config_.schedule, stats.step);
  adamw_step(opt_, params_, grads_, stats.lr);
  refresh_bf16_weights(model_);  // mixed precision: the next products see the new weights
  stats.tokens = tokens;
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stats;
}

ClassifierEval LangIdTrainer::evaluate() {
  return evaluate_classifier(model_, data_, config_.seq_len, 256);
}

std::string LangIdTrainer::save(const nlohmann::json& metrics) {
  CheckpointWrite w;
  w.step = opt_.step;
  w.params = &params_;
  w.model_metadata = classifier_metadata(model_.config, data_.languages);
  w.optimizer = &opt_;
  w.state = {{"format", 1},
             {"task", task_name(config_.task)},
             {"step", opt_.step},
             {"seed", config_.seed},
             {"data_rng", {{"seed", data_rng_.seed()}, {"position", data_rng_.position()}}},
             {"data", {{"languages", data_.languages}}},
             {"tokenizer", "bytes"},
             {"config", to_json(config_)},
             {"metrics", metrics.is_null() ? nlohmann::json::object() : metrics}};
  return save_checkpoint(config_.out_dir, w, config_.keep_checkpoints);
}

}  // namespace cabm
