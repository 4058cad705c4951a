// The encoder demo: language identification of single words with the sequence classifier
// (cabm/nn/classifier.h). A word is its UTF-8 bytes; a batch pads words to its longest one and
// passes the true lengths, which become a key-padding mask (padding is never attended to and
// not pooled). Training batches are balanced over languages (cabm/io/word_lists.h); validation
// reports accuracy and a confusion matrix on held-out words.
#pragma once

#include "cabm/io/word_lists.h"
#include "cabm/nn/classifier.h"
#include "cabm/train/checkpoint.h"
#include "cabm/train/train_config.h"
#include "cabm/train/training_state.h"

#include <string>
#include <vector>

namespace cabm {

ClassifierConfig langid_model_config(const TrainConfig& config, int64_t num_classes);

// Bytes of each word as tokens, padded with 0 to the longest: tokens I64 [B, T], lengths [B].
void pack_words(const std::vector<std::string>& words, int64_t max_len, Tensor& tokens, std::vector<int64_t>& lengths);

struct ClassifierEval {
  double loss = 0;
  double accuracy = 0;
  std::vector<std::vector<int64_t>> confusion;  // [true class][predicted class]
};

// Loss, accuracy and confusion matrix of `model` over data.validation (eval mode). The overload
// with a cache runs in its workspaces (a trainer passes its training cache, as evaluate_lm).
ClassifierEval evaluate_classifier(const Classifier& model, const WordDataset& data, int64_t max_len, int64_t B);
ClassifierEval evaluate_classifier(const Classifier& model, const WordDataset& data, int64_t max_len, int64_t B,
                                   ClassifierCache& cache);

// Predicted class probabilities for one word.
std::vector<float> classify_word(const Classifier& model, const std::string& word);

class LangIdTrainer {
 public:
  LangIdTrainer(const TrainConfig& config, WordDataset data);
  void restore(const LoadedCheckpoint& checkpoint);
  // Data parallelism: every rank takes rank 0's weights, optimizer state and data position.
  void synchronize_ranks();

  StepStats train_step();
  ClassifierEval evaluate();
  std::string save(const nlohmann::json& metrics = {});

  int64_t step() const { return state_.opt.step; }
  const TrainConfig& config() const { return config_; }
  const Classifier& model() const { return state_.model; }
  const WordDataset& data() const { return data_; }

 private:
  TrainConfig config_;
  WordDataset data_;
  TrainingState<Classifier> state_;
  ClassifierCache cache_;
  Tensor tokens_, labels_;
  std::vector<std::string> words_;
  std::vector<int64_t> label_values_, lengths_;
  std::vector<std::string> global_words_;  // data parallelism: the K·B words of a micro-batch
  std::vector<int64_t> global_labels_;

  // This rank's B words of the next micro-batch (all B words on one process).
  void sample_share(int64_t B);
};

}  // namespace cabm
