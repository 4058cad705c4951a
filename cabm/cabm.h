// cabm's public API: one include for programs that use the library (docs/library.md has a
// complete example of each part). Link cabm::cabm (CMake: find_package(cabm CONFIG)) or
// `pkg-config --cflags --libs cabm`.
//
//   tensors    Tensor (cabm/core/tensor.h): shape, strides, dtype F32 / BF16 / BOOL / I64.
//              Tensor::from_external(ptr, shape) views your own buffer without a copy.
//   threads    set_num_threads (cabm/core/threads.h); default: CABM_NUM_THREADS or all cores.
//   attention  attention_forward / attention_backward (cabm/kernels/attention/attention.h) on
//              q [B, N, H, d], k [B, M, H, d], v [B, M, H, dv] with an explicit Mask
//              (cabm/kernels/attention/mask.h: causal, key_padding, sliding_window, block_sparse,
//              allow, additive, combined with &); the tiled O(N)-memory kernel runs for all.
//   modules    MultiHeadAttention, EncoderLayer, Encoder, CausalLM, Classifier (cabm/nn/),
//              forward and backward side by side with explicit caches.
//   files      safetensors (cabm/io/safetensors.h); PyTorch state_dicts of
//              nn.TransformerEncoder / TransformerEncoderLayer / MultiheadAttention and
//              PyTorch's mask conventions (cabm/interop/pytorch_modules.h); cabm's own model
//              files and checkpoints (cabm/train/model_config.h, cabm/train/checkpoint.h).
//   Hugging Face  BERT / RoBERTa / XLM-R / DistilBERT model directories: HfTokenizer
//              (cabm/io/hf_tokenizer.h), load_hf_encoder (cabm/interop/hf_encoder.h) and the
//              batching and pooling of `cabm embed` / `cabm classify` (cabm/interop/hf_pipeline.h).
//   training   train(config, callbacks) (cabm/train/train_run.h): the run `cabm train` does,
//              with validation, checkpoints and resume, data-parallel under mpirun
//              (cabm/train/distributed.h); evaluate_lm (cabm/train/lm_trainer.h);
//              generate (cabm/train/generate.h); text data (cabm/io/text_data.h).
//
// Errors in your input (shapes, files, options) throw cabm::Error with a message that names
// what was wrong: cabm::UsageError for options out of range or contradicting each other,
// cabm::OutOfMemory for an allocation the system refused (cabm/core/error.h). Untrusted
// numbers are narrowed by cabm/core/checked.h (docs/reliability.md).
#pragma once

#include "cabm/core/error.h"
#include "cabm/core/tensor.h"
#include "cabm/core/threads.h"
#include "cabm/interop/hf_encoder.h"
#include "cabm/interop/hf_pipeline.h"
#include "cabm/interop/pytorch_forward.h"
#include "cabm/interop/pytorch_modules.h"
#include "cabm/interop/state_dict.h"
#include "cabm/io/hf_tokenizer.h"
#include "cabm/io/safetensors.h"
#include "cabm/io/text_data.h"
#include "cabm/io/text_lines.h"
#include "cabm/io/tokenizer.h"
#include "cabm/kernels/attention/attention.h"
#include "cabm/kernels/attention/mask.h"
#include "cabm/nn/causal_lm.h"
#include "cabm/nn/classifier.h"
#include "cabm/nn/encoder.h"
#include "cabm/nn/multi_head_attention.h"
#include "cabm/train/checkpoint.h"
#include "cabm/train/distributed.h"
#include "cabm/train/generate.h"
#include "cabm/train/lm_trainer.h"
#include "cabm/train/model_config.h"
#include "cabm/train/train_config.h"
#include "cabm/train/train_run.h"
