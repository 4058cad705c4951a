#!/usr/bin/python3
"""Seed corpora for cabm's libFuzzer targets (tests/fuzz/fuzz_*.cpp): valid and near-valid
inputs for each, written as OUT/<target>/<name>. Standard library only.

    python3 tests/fuzz/make_corpus.py build/fuzz/corpus            # every target
    python3 tests/fuzz/make_corpus.py build/fuzz/corpus forward    # some
"""
import json
import os
import struct
import sys

TARGETS = ["safetensors", "state_json", "model_metadata", "forward", "text_data", "hf_tokenizer", "hf_config",
           "attention_file", "word_lists", "adamw_state", "checkpoint_dir"]

# ---------------------------------------------------------------------------------------------
# safetensors, built by hand: u64 header length, JSON header, one buffer.

FORMATS = {"F32": "f", "F64": "d", "I64": "q", "I32": "i", "BOOL": "B", "F16": "e"}


def pack(dtype, values):
    if dtype == "BF16":  # the upper half of the F32 bits
        return b"".join(struct.pack("<I", struct.unpack("<I", struct.pack("<f", v))[0])[2:] for v in values)
    return struct.pack("<%d%s" % (len(values), FORMATS[dtype]), *values)


def numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def values(n, scale=0.1, offset=0):
    return [((i * 7 + offset) % 11 - 5) * scale for i in range(n)]


def safetensors(tensors, metadata=None, pad=True):
    """tensors: {name: (dtype, shape, values)}; names sorted, as write_safetensors does."""
    header, data = {}, b""
    if metadata:
        header["__metadata__"] = metadata
    for name in sorted(tensors):
        dtype, shape, vals = tensors[name]
        raw = pack(dtype, vals)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + data


def f32(shape, scale=0.1, offset=0):
    return ("F32", shape, values(numel(shape), scale, offset))


# ---------------------------------------------------------------------------------------------
# PyTorch modules (cabm forward) and cabm models (model metadata).


def mha_tensors(prefix, E, bias=True):
    t = {prefix + "in_proj_weight": f32([3 * E, E]), prefix + "out_proj.weight": f32([E, E], offset=3)}
    if bias:
        t[prefix + "in_proj_bias"] = f32([3 * E], offset=1)
        t[prefix + "out_proj.bias"] = f32([E], offset=2)
    return t


def layer_tensors(prefix, E, F):
    t = mha_tensors(prefix + "self_attn.", E)
    t.update({prefix + "linear1.weight": f32([F, E]), prefix + "linear1.bias": f32([F]),
              prefix + "linear2.weight": f32([E, F]), prefix + "linear2.bias": f32([E]),
              prefix + "norm1.weight": ("F32", [E], [1.0] * E), prefix + "norm1.bias": f32([E]),
              prefix + "norm2.weight": ("F32", [E], [1.0] * E), prefix + "norm2.bias": f32([E])})
    return t


def encoder_model(E=4, F=8, layers=2, nhead=2, norm=True, **meta):
    t = {}
    for l in range(layers):
        t.update(layer_tensors("layers.%d." % l, E, F))
    if norm:
        t["norm.weight"] = ("F32", [E], [1.0] * E)
        t["norm.bias"] = f32([E])
    m = {"module": "TransformerEncoder", "nhead": str(nhead)}
    m.update(meta)
    return t, m


def cabm_model(kind, V=6, T=4, E=4, F=8, layers=1, nhead=2, positional="learned", tie_head=True, classes=2,
               final_norm=True, extra_meta=None):
    t = {"embed.weight": f32([V, E])}
    if positional == "learned":
        t["pos_embed.weight"] = f32([T, E], offset=5)
    for l in range(layers):
        t.update(layer_tensors("encoder.layers.%d." % l, E, F))
    m = {"model": kind, "vocab_size": str(V), "max_seq_len": str(T), "d_model": str(E), "nhead": str(nhead),
         "num_layers": str(layers), "dim_feedforward": str(F), "dropout": "0.1", "activation": "gelu",
         "norm_first": "true", "layer_norm_eps": "1e-05", "positional": positional, "tokenizer": "bytes"}
    if kind == "CausalLM":
        t["encoder.norm.weight"] = ("F32", [E], [1.0] * E)
        t["encoder.norm.bias"] = f32([E])
        m["tie_head"] = "true" if tie_head else "false"
        if not tie_head:
            t["head.weight"] = f32([V, E])
    else:
        if final_norm:
            t["encoder.norm.weight"] = ("F32", [E], [1.0] * E)
            t["encoder.norm.bias"] = f32([E])
        t["classifier.weight"] = f32([classes, E])
        t["classifier.bias"] = f32([classes])
        m.update({"num_classes": str(classes), "final_norm": "true" if final_norm else "false",
                  "labels": ",".join("l%d" % i for i in range(classes))})
    if extra_meta:
        m.update(extra_meta)
    return safetensors(t, m)


def forward_pair(model, inp):
    return struct.pack("<I", len(model)) + model + inp


def corpus_safetensors():
    out = {
        "empty_header": safetensors({}),
        "one_f32": safetensors({"x": f32([2, 3])}),
        "every_dtype": safetensors({
            "a": f32([2]), "b": ("BF16", [3], [1.0, -2.0, 0.5]), "c": ("BOOL", [4], [0, 1, 1, 0]),
            "d": ("I64", [2], [1, -7]), "e": ("F16", [2], [1.5, -0.25]), "f": ("F64", [2], [1e300, -3.0]),
            "g": ("I32", [3], [1, 2, -3])}, {"format": "pt", "k": "v"}),
        "zero_sized": safetensors({"z": ("F32", [0, 5], []), "s": ("F32", [], [3.0])}),
        "unpadded": safetensors({"x": f32([1])}, pad=False),
        "bad_bool": safetensors({"b": ("BOOL", [2], [0, 2])}),
        "bad_dtype": safetensors({"u": ("F32", [2], [1.0, 2.0])}).replace(b'"F32"', b'"U8" '),
    }
    good = out["one_f32"]
    out["truncated"] = good[:-3]
    out["short_length"] = good[:5]
    out["header_runs_past"] = struct.pack("<Q", 1000) + good[8:]
    entry = b'"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}'
    repeated = b"{" + entry + b"," + entry + b"}"
    out["repeated_key"] = struct.pack("<Q", len(repeated)) + repeated + pack("F32", [1.0])
    return out


def corpus_model_metadata():
    out = {
        "causal_lm": cabm_model("CausalLM"),
        "causal_lm_untied_sinusoidal": cabm_model("CausalLM", positional="sinusoidal", tie_head=False, layers=2),
        "classifier": cabm_model("Classifier", classes=3),
        "classifier_no_final_norm": cabm_model("Classifier", final_norm=False),
        "huge_vocab": cabm_model("CausalLM", extra_meta={"vocab_size": "9223372036854775807"}),
        "more_layers": cabm_model("CausalLM", extra_meta={"num_layers": "2147483648"}),
        "sinusoidal_long": cabm_model("CausalLM", positional="sinusoidal", extra_meta={"max_seq_len": "100000000"}),
        "nhead_not_dividing": cabm_model("Classifier", extra_meta={"nhead": "3"}),
        "labels_mismatch": cabm_model("Classifier", extra_meta={"labels": "a,b,c"}),
        "float_size": cabm_model("CausalLM", extra_meta={"d_model": "4.0"}),
        "nan_eps": cabm_model("CausalLM", extra_meta={"layer_norm_eps": "nan"}),
        "no_kind": safetensors({"embed.weight": f32([2, 2])}, {"vocab_size": "2"}),
    }
    return out


def corpus_forward():
    E = 4
    enc, enc_meta = encoder_model(E=E)
    model = safetensors(enc, enc_meta)
    src = f32([2, 3, E])
    out = {
        "encoder": forward_pair(model, safetensors({"src": src})),
        "encoder_masks": forward_pair(model, safetensors({
            "src": src, "mask": ("BOOL", [3, 3], [0, 1, 1, 0, 0, 1, 0, 0, 0]),
            "src_key_padding_mask": ("BOOL", [2, 3], [0, 0, 1, 0, 1, 1])}, {"is_causal": "true"})),
        "encoder_float_mask": forward_pair(model, safetensors({
            "src": src, "mask": ("F32", [2 * 2, 3, 3], [0.0, -1e30, 0.5] * 12)})),
        "encoder_fully_masked": forward_pair(model, safetensors({
            "src": src, "src_key_padding_mask": ("BOOL", [2, 3], [1, 1, 1, 0, 0, 0])})),
    }
    layer = layer_tensors("", E, 6)
    layer_model = safetensors(layer, {"module": "TransformerEncoderLayer", "nhead": "2", "norm_first": "true",
                                      "activation": "gelu", "layer_norm_eps": "1e-6"})
    out["layer"] = forward_pair(layer_model, safetensors({"src": f32([1, 5, E])}, {"is_causal": "false"}))
    out["layer_no_metadata"] = forward_pair(safetensors(layer, {"nhead": "1"}), safetensors({"src": f32([1, 2, E])}))
    mha = safetensors(mha_tensors("", E), {"module": "MultiheadAttention", "nhead": "2"})
    q, k = f32([2, 3, E]), f32([2, 4, E], offset=4)
    out["mha"] = forward_pair(mha, safetensors({"query": q, "key": k, "value": k}))
    out["mha_masks"] = forward_pair(mha, safetensors({
        "query": q, "key": k, "value": k, "attn_mask": ("BOOL", [3, 4], [0, 1, 0, 0] * 3),
        "key_padding_mask": ("F32", [2, 4], [0.0, 0.0, -1e9, 0.0] * 2)},
        {"need_weights": "true", "average_attn_weights": "false", "is_causal": "true"}))
    sep = {"q_proj_weight": f32([E, E]), "k_proj_weight": f32([E, 3]), "v_proj_weight": f32([E, 5]),
           "out_proj.weight": f32([E, E])}
    out["mha_kdim_vdim"] = forward_pair(safetensors(sep, {"nhead": "4"}), safetensors({
        "query": f32([1, 2, E]), "key": f32([1, 3, 3]), "value": f32([1, 3, 5])}, {"need_weights": "false"}))
    out["unexpected_input"] = forward_pair(model, safetensors({"src": src, "attn_mask": ("BOOL", [3, 3], [0] * 9)}))
    out["wrong_width"] = forward_pair(model, safetensors({"src": f32([1, 2, E + 1])}))
    return out


def state(**changes):
    config = {"task": "lm", "data": "", "init": "", "out": "runs/lm", "layers": 2, "heads": 2, "d_model": 16,
              "d_ff": 32, "seq_len": 16, "batch_size": 4, "accum": 1, "steps": 10, "warmup": 2,
              "eval_interval": 5, "checkpoint_interval": 5, "log_interval": 1, "eval_windows": 4,
              "keep_checkpoints": 2, "sample_tokens": 0, "dropout": 0.1, "norm_first": True,
              "schedule": "cosine", "lr": 0.001, "min_lr_ratio": 0.1, "beta1": 0.9, "beta2": 0.999,
              "eps": 1e-8, "weight_decay": 0.01, "clip": 1.0, "seed": 1, "precision": "fp32"}
    s = {"format": 1, "task": "lm", "step": 5, "seed": 1, "data_rng": {"seed": 12345, "position": 40},
         "data": {"source": "fortunes"}, "tokenizer": "bytes", "config": config, "metrics": {}}
    for key, value in changes.items():
        if key.startswith("config_"):
            if value is None:
                del config[key[7:]]
            else:
                config[key[7:]] = value
        elif value is None:
            del s[key]
        else:
            s[key] = value
    return json.dumps(s, indent=2).encode() + b"\n"


def corpus_state_json():
    return {
        "valid": state(),
        "langid_bf16": state(config_task="langid", config_precision="bf16", config_schedule="warmup"),
        "no_precision": state(config_precision=None),
        "huge_steps": state(config_steps=4.3e39),
        "fraction_position": state(data_rng={"seed": 1, "position": 1.5}),
        "negative_seed": state(seed=-1),
        "layers_1e12": state(config_layers=10 ** 12),
        "heads_not_dividing": state(config_heads=3),
        "string_number": state(config_accum="7"),
        "nan_literal": state().replace(b'"lr": 0.001', b'"lr": NaN'),
        "not_object": b"[1, 2, 3]\n",
        "no_step": state(step=None),
        "truncated": state()[:200],
        "unicode_keys": state(config_data="\u00e9\u00e8\ud7ff"),
    }


def corpus_text_data():
    fortune = (b"You will be fortunate.\n%\nA\bB overstruck, \x07bell and\ttab.\r\n%\n%\n"
               b"Caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\n%\nlast entry without separator")
    return {
        "ascii": b"\x10" + b"The quick brown fox jumps over the lazy dog.\n" * 4,
        "fortunes": b"\x05" + fortune,
        "utf8": b"\x03" + "na\u00efve \u6f22\u5b57 \U0001f600 \u00e9t\u00e9\n".encode() * 3,
        "invalid_continuation": b"\x02abc\x80def\n",
        "overlong": b"\x02\xc0\xafslash\n",
        "surrogate": b"\x02\xed\xa0\x80x\n",
        "truncated_sequence": b"\x01abc\xe2\x82",
        "above_max": b"\x04\xf4\x90\x80\x80\n",
        "empty_after_length": b"\x07",
        "only_separators": b"\x01%\n%\n%\n",
        "crlf_lines": b"\x08line one\r\nline two\r\n%\r\nline three\r\n",
        "short": b"\x1fab",
    }


# ---------------------------------------------------------------------------------------------
# Hugging Face tokenizer.json (the three model types cabm reads) and config.json.

def added(tokens):
    return [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True} for i, t in tokens]


def wordpiece_json(lowercase=True, strip_accents=None, max_chars=100):
    vocab = {t: i for i, t in enumerate(
        ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "world", ",", "!", "caf", "##e", "##s",
         "\u65e5", "\u672c", "x", "##x"])}
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": added([(0, "[PAD]"), (1, "[UNK]"), (2, "[CLS]"), (3, "[SEP]"), (4, "[MASK]")]),
        "normalizer": {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True,
                       "strip_accents": strip_accents, "lowercase": lowercase},
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                       {"SpecialToken": {"id": "[SEP]", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": "[SEP]", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}},
                     {"SpecialToken": {"id": "[SEP]", "type_id": 1}}],
            "special_tokens": {"[CLS]": {"id": "[CLS]", "ids": [2], "tokens": ["[CLS]"]},
                               "[SEP]": {"id": "[SEP]", "ids": [3], "tokens": ["[SEP]"]}}},
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True},
        "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                  "max_input_chars_per_word": max_chars, "vocab": vocab}}


def byte_bpe_json():
    vocab = {t: i for i, t in enumerate(["<s>", "<pad>", "</s>", "<unk>", "<mask>", "h", "e", "l", "o", "\u0120",
                                         "w", "r", "d", "he", "ll", "hell", "hello", "\u0120w"])}
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": added([(0, "<s>"), (1, "<pad>"), (2, "</s>"), (3, "<unk>"), (4, "<mask>")]),
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": {"type": "RobertaProcessing", "sep": ["</s>", 2], "cls": ["<s>", 0],
                           "trim_offsets": True, "add_prefix_space": False},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": ["h e", "l l", "he ll", "hell o", "\u0120 w"]}}


def unigram_json():
    pieces = [["<s>", 0.0], ["<pad>", 0.0], ["</s>", 0.0], ["<unk>", 0.0], ["\u2581", -2.0],
              ["\u2581hello", -4.0], ["\u2581world", -4.5], ["h", -6.0], ["e", -6.0], ["l", -6.0], ["o", -6.0],
              [",", -5.0], ["<mask>", 0.0]]
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": added([(0, "<s>"), (1, "<pad>"), (2, "</s>"), (3, "<unk>"), (12, "<mask>")]),
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "}]},
        "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                       {"SpecialToken": {"id": "</s>", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 0}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [0], "tokens": ["<s>"]},
                               "</s>": {"id": "</s>", "ids": [2], "tokens": ["</s>"]}}},
        "decoder": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True},
        "model": {"type": "Unigram", "unk_id": 3, "vocab": pieces, "byte_fallback": False}}


def as_json(doc):
    return json.dumps(doc, ensure_ascii=False).encode("utf-8")


def corpus_hf_tokenizer():
    return {
        "wordpiece_uncased": as_json(wordpiece_json()),
        "wordpiece_cased": as_json(wordpiece_json(lowercase=False, strip_accents=False, max_chars=5)),
        "wordpiece_strip": as_json(wordpiece_json(lowercase=False, strip_accents=True)),
        "byte_bpe": as_json(byte_bpe_json()),
        "unigram": as_json(unigram_json()),
        "not_json": b"{\"model\": {\"type\": \"WordPiece\", \"vocab\": {\"a\": 0",
        "unknown_model": as_json({"model": {"type": "WordLevel", "vocab": {"a": 0}}}),
    }


def hf_config(**changes):
    config = {"architectures": ["BertModel"], "model_type": "bert", "vocab_size": 30, "hidden_size": 8,
              "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 16, "hidden_act": "gelu",
              "max_position_embeddings": 16, "type_vocab_size": 2, "layer_norm_eps": 1e-12, "pad_token_id": 0,
              "position_embedding_type": "absolute"}
    config.update(changes)
    return as_json(config)


def corpus_hf_config():
    return {
        "bert": hf_config(),
        "bert_classifier": hf_config(architectures=["BertForSequenceClassification"],
                                     id2label={"0": "neg", "1": "pos"}, problem_type="single_label_classification"),
        "roberta": hf_config(architectures=["RobertaModel"], model_type="roberta", pad_token_id=1,
                             max_position_embeddings=18, type_vocab_size=1, hidden_act="gelu_new"),
        "xlmr_multilabel": hf_config(architectures=["XLMRobertaForSequenceClassification"], model_type="xlm-roberta",
                                     pad_token_id=1, problem_type="multi_label_classification",
                                     id2label={"0": "a", "1": "b", "2": "c"}),
        "distilbert": as_json({"architectures": ["DistilBertModel"], "model_type": "distilbert", "vocab_size": 30,
                               "dim": 8, "n_layers": 2, "n_heads": 2, "hidden_dim": 16, "activation": "gelu",
                               "max_position_embeddings": 16, "sinusoidal_pos_embds": False, "pad_token_id": 0}),
        "bad_act": hf_config(hidden_act="swish"),
        "huge": hf_config(hidden_size=2 ** 40, num_attention_heads=2 ** 20),
    }


# ---------------------------------------------------------------------------------------------
# cabm attention (docs/attention_file.md): q [B, N, Hq, d], k [B, M, Hkv, d], v [B, M, Hkv, dv].


def attention(B=1, N=3, M=4, Hq=2, Hkv=2, d=4, dv=4, extra=None, meta=None, backward=False):
    t = {"q": f32([B, N, Hq, d]), "k": f32([B, M, Hkv, d], offset=3), "v": f32([B, M, Hkv, dv], offset=5)}
    if backward:
        t["dout"] = f32([B, N, Hq, dv], offset=7)
    t.update(extra or {})
    return safetensors(t, meta)


def corpus_attention_file():
    inf = float("inf")
    return {
        "plain": attention(),
        "gqa": attention(Hq=4, Hkv=2, dv=3, backward=True),
        "mqa": attention(B=2, Hq=4, Hkv=1, meta={"scale": "0.25"}),
        "bool_mask": attention(extra={"mask": ("BOOL", [3, 4], [1, 0, 1, 1, 0, 0, 0, 0, 1, 1, 1, 0])},
                               backward=True),
        "float_mask": attention(extra={"mask": ("F32", [1, 2, 1, 4], [0.0, -inf, 0.5, -1.0, -inf, -inf, -inf, -inf])},
                                backward=True),
        "causal_top_left": attention(N=4, M=3, meta={"causal": "top_left"}, backward=True),
        "causal_bottom_right": attention(meta={"causal": "bottom_right", "format": "pt"}),
        "windows": attention(N=5, M=6, meta={"window_left": "1", "window_right": "0", "causal": "none"}),
        "alibi_paper": attention(Hq=3, Hkv=1, meta={"alibi": "true", "causal": "bottom_right"}, backward=True),
        "alibi_slopes": attention(extra={"alibi_slopes": ("F32", [2], [0.5, 0.25])}, meta={"alibi": "false"}),
        "softcap": attention(meta={"softcap": "0.5", "scale": "4.0"}, backward=True),
        "sinks": attention(extra={"sinks": ("F32", [2], [0.5, -1.0])}, meta={"causal": "top_left"}, backward=True),
        "rope_neox": attention(d=6, meta={"rope": "neox", "rope_dim": "4", "rope_theta": "500000.0"},
                               backward=True),
        "rope_gptj": attention(meta={"rope": "gptj", "rope_theta": "10000"},
                               extra={"q_positions": ("I64", [3], [5, 9, 1000]),
                                      "k_positions": ("I64", [4], [0, 1, 2, 1099511627776])}),
        "positions_alibi": attention(meta={"alibi": "true", "window_left": "2"},
                                     extra={"q_positions": ("I64", [3], [7, 8, 9]),
                                            "k_positions": ("I64", [4], [-3, 0, 4, 9])}, backward=True),
        "everything": attention(Hq=4, Hkv=2, d=4, dv=2, meta={
            "rope": "neox", "softcap": "30", "causal": "bottom_right", "window_left": "2", "window_right": "-1"},
            extra={"sinks": ("F32", [4], [0.0, 1.0, -2.0, 0.5]), "alibi_slopes": ("F32", [4], [0.5, 0.25, 0.1, 0.0]),
                   "mask": ("F32", [1, 4], [0.0, -0.5, -inf, 0.25])}, backward=True),
        # Shapes that reach each kernel: decode (N <= 8, no tensor mask) and the tiled kernels
        # with tails (N, M not multiples of the tiles), fully masked rows.
        "decode": attention(N=1, M=37, Hq=4, Hkv=1, d=8, dv=8, meta={"window_left": "5", "softcap": "20"},
                            extra={"sinks": ("F32", [4], [0.0, 1.0, -2.0, 0.5])}, backward=True),
        "decode_alibi_positions": attention(N=3, M=29, Hq=2, Hkv=2, d=8, dv=4, meta={"alibi": "true",
                                            "causal": "bottom_right", "rope": "gptj"},
                                            extra={"k_positions": ("I64", [29], list(range(100, 129)))}),
        "tiles": attention(N=33, M=35, Hq=2, Hkv=1, d=8, dv=8, meta={"causal": "bottom_right", "window_left": "7"},
                           backward=True),
        "tiles_mask": attention(N=13, M=30, Hq=2, Hkv=2, d=4, dv=4, backward=True, extra={
            "mask": ("F32", [13, 30], [(-inf if (i * 7) % 5 == 0 else 0.25 * (i % 3)) for i in range(13 * 30)])}),
        "fully_masked_rows": attention(N=4, M=5, backward=True, extra={
            "mask": ("BOOL", [1, 1, 4, 5], [0] * 5 + [1] * 5 + [0] * 5 + [0, 0, 0, 0, 1]),
            "sinks": ("F32", [2], [1.0, -1.0])}),
        "heads_not_dividing": attention(Hq=3, Hkv=2),
        "unknown_tensor": attention(extra={"attn_mask": ("BOOL", [3, 4], [1] * 12)}),
        "unknown_metadata": attention(meta={"is_causal": "true"}),
        "odd_rope_dim": attention(meta={"rope": "neox", "rope_dim": "3"}),
        "scale_beyond_float": attention(meta={"scale": "1e39"}),  # was a float +inf
        "softcap_below_float": attention(meta={"softcap": "1e-50"}),  # rounded to 0: "off"
        "tiny_rope_theta": attention(d=64, dv=2, meta={"rope": "neox", "rope_theta": "1e-42"}),
        "wrong_dout": safetensors({"q": f32([1, 2, 2, 4]), "k": f32([1, 3, 2, 4]), "v": f32([1, 3, 2, 4]),
                                   "dout": f32([1, 2, 2, 3])}),
    }


# ---------------------------------------------------------------------------------------------
# Word lists of `cabm train --task langid` (fuzz_word_lists): [max_bytes - 1][validation byte]
# then the lists, separated by 0xFF. Validation byte: low 4 bits validation_per_language - 1,
# 0x10 a held-out fraction of 0.5 instead of 0.1.

SYLLABLES = {
    "english": ["the", "wor", "ing", "ness", "ship", "ough", "ly", "ter", "wh", "ight", "str", "ck"],
    "german": ["sch", "ung", "keit", "ge", "lich", "\u00fcber", "stra\u00dfe", "ei", "tz", "ach", "pf", "zw"],
    "french": ["eau", "ti", "on", "ment", "\u00e9t\u00e9", "qu", "oi", "ai", "\u00e8re", "ch", "gn", "eux"],
    "spanish": ["ci\u00f3n", "ll", "\u00f1o", "ado", "ero", "rr", "que", "ue", "ita", "mos", "dad", "es"],
    "italian": ["zione", "gli", "cch", "etto", "ssi", "ato", "ore", "sce", "zz", "ino", "gn", "ia"],
}


def words_of(language, n, capitalise=False):
    syl = SYLLABLES[language]
    out = []
    for i in range(n):
        w = syl[i % len(syl)] + syl[(i // len(syl)) % len(syl)] + syl[(i * 7 + 1) % len(syl)][: 1 + i % 3]
        out.append(w.capitalize() if capitalise and i % 4 == 0 else w)
    return out


def word_lists(lists, max_bytes=24, per_language=16, half=False):
    head = bytes([(max_bytes - 1) % 256, ((per_language - 1) % 16) | (0x10 if half else 0)])
    return head + b"\xff".join(("\n".join(words) + "\n").encode() if isinstance(words, list) else words
                               for words in lists)


def corpus_word_lists():
    five = [words_of(lang, 60, capitalise=True) for lang in SYLLABLES]
    noisy = [
        words_of("english", 40) + ["cat's", "o'clock", "Zebra", "ZEBRA", "zebra", "pain", "die"],
        words_of("german", 40) + ["Stra\u00dfe", "\u00c4pfel", "\u00dcBER", "die", "Donaudampfschifffahrtsgesellschaft"],
        words_of("french", 40) + ["l'eau", "aujourd\u2019hui", "pain", "\u00c9T\u00c9", "\u0152uvre", "\u0178"],
    ]
    return {
        "five_languages": word_lists(five),
        "noisy": word_lists(noisy, max_bytes=16, per_language=4),
        "half_held_out": word_lists([words_of("spanish", 12), words_of("italian", 12)], half=True),
        "latin_extended_a": word_lists([["\u0141\u00f3d\u017a", "\u0150r\u00fcl", "\u0130stanbul", "\u0131s\u0131k",
                                         "\u0138ra", "\u0149nam", "\u017fun", "\u0110akovo", "\u0132sselmeer",
                                         "\u0174ales", "\u0179r\u00f3d\u0142o", "\u00d7times"] * 3,
                                        words_of("english", 30)], half=True),
        "crlf_and_spaces": word_lists([("\r\n".join(words_of("german", 30)) + "\r\n").encode(),
                                       (" \t\n".join(words_of("french", 30)) + "\n").encode()], half=True),
        "invalid_utf8": word_lists([b"abc\n\xc0\xaf\nd\xed\xa0\x80e\nf\xf4\x90\x80\x80\nok\n\xe2\x82\n" +
                                    ("\n".join(words_of("english", 30)) + "\n").encode(), words_of("italian", 30)],
                                   half=True),
        "one_word_each": word_lists([["a"], ["b"], ["c"]]),
        "empty_list": word_lists([words_of("english", 30), b""]),
        "only_apostrophes": word_lists([["it's", "don't"], words_of("english", 30)]),
        "all_shared": word_lists([words_of("spanish", 20), words_of("spanish", 20)]),
        "long_words_only": word_lists([words_of("german", 20), words_of("italian", 20)], max_bytes=3),
        "thirty_three_lists": word_lists([["w%d" % i, "x%d" % i] for i in range(33)], half=True),
        "control_bytes": word_lists([b"a\x00b\nc\x07d\n\x7f\n\tlead\n" * 5, words_of("english", 20)], half=True),
    }


# ---------------------------------------------------------------------------------------------
# A checkpoint's optimizer.safetensors (fuzz_adamw_state), laid out as save_checkpoint writes
# it (adamw_state_tensors + adamw_state_metadata through write_safetensors: keys sorted).


def adamw_file(params=None, step=2, m=None, v=None, meta=None, dtype="F32", drop=(), extra=None):
    params = params if params is not None else {"l.weight": [3, 4], "l.bias": [4]}
    t = {}
    for name, shape in params.items():
        n = numel(shape)
        t["exp_avg." + name] = (dtype, shape, m(n) if m else values(n, 0.01))
        t["exp_avg_sq." + name] = (dtype, shape, v(n) if v else [abs(x) * 0.001 for x in values(n, 0.1, 3)])
    for name in drop:
        del t[name]
    t.update(extra or {})
    metadata = {"beta1": "0.9", "beta2": "0.999", "eps": "1e-08", "optimizer": "AdamW", "step": str(step),
                "weight_decay": "0.01"}
    metadata.update(meta or {})
    return safetensors(t, dict(sorted((k, val) for k, val in metadata.items() if val is not None)))


def corpus_adamw_state():
    nan, inf = float("nan"), float("inf")
    return {
        "valid": adamw_file(),
        "step_zero_zero_moments": adamw_file(step=0, m=lambda n: [0.0] * n, v=lambda n: [0.0] * n),
        "model_params": adamw_file({"embed.weight": [6, 4], "encoder.layers.0.norm1.weight": [4],
                                    "encoder.layers.0.linear1.weight": [8, 4], "head.weight": [2, 4]}, step=7),
        "scalar_and_empty": adamw_file({"s": [], "z": [0, 3]}, step=1),
        "max_step": adamw_file(step=2 ** 40),
        "step_past_max": adamw_file(step=2 ** 40 + 1),
        "negative_step": adamw_file(step=-1),
        "fraction_step": adamw_file(meta={"step": "2.5"}),
        "no_step": adamw_file(meta={"step": None}),
        "not_adamw": adamw_file(meta={"optimizer": "SGD"}),
        "no_optimizer_key": adamw_file(meta={"optimizer": None}),
        "nan_exp_avg": adamw_file(m=lambda n: [nan] + [0.0] * (n - 1)),
        "inf_exp_avg": adamw_file(m=lambda n: [0.0] * (n - 1) + [-inf]),
        "negative_exp_avg_sq": adamw_file(v=lambda n: [0.5] * (n - 1) + [-1e-3]),
        "inf_exp_avg_sq": adamw_file(v=lambda n: [inf] * n),
        "negative_zero_exp_avg_sq": adamw_file(v=lambda n: [-0.0] * n),
        "huge_exp_avg": adamw_file(m=lambda n: [3e38] * n, v=lambda n: [0.0] * n),
        # The file's betas bound the state when looser than the run's: (0.9, 0.9999) allow
        # |m| <= 45.9·(√v + eps), the defaults 14.6; with β1² >= β2 there is no bound at all.
        "looser_file_betas": adamw_file(m=lambda n: [0.3] * n, v=lambda n: [1e-4] * n,
                                        meta={"beta2": "0.9999"}),
        "unbounded_file_betas": adamw_file(m=lambda n: [1e20] * n, v=lambda n: [1e-4] * n,
                                           meta={"beta2": "0.5"}),
        "bf16_moments": adamw_file(dtype="BF16"),
        "missing_exp_avg_sq": adamw_file(drop=("exp_avg_sq.l.bias",)),
        "extra_tensor": adamw_file(extra={"exp_avg_sq.l.other": f32([2])}),
        "wrong_shape": adamw_file(extra={"exp_avg_sq.l.bias": f32([5])}),
        "no_tensors": safetensors({}, {"optimizer": "AdamW", "step": "0"}),
    }


# ---------------------------------------------------------------------------------------------
# A run directory (fuzz_checkpoint_dir): [flags][keep - 1][step: 6 bytes LE] `latest` NUL
# entries, one a line: kind (c m o s d f l) and a name (l: NAME>TARGET). Flags: 1 for_resume,
# 2 write `latest`, 4 save at the step first, 8 load the first entry's path, 16 a trailing '/'.


def run_dir(latest=b"step-00000003\n", entries=("cstep-00000003",), resume=False, write_latest=True, save=None,
            keep=2, first_entry=False, slash=False):
    flags = (1 if resume else 0) | (2 if write_latest else 0) | (4 if save is not None else 0) | \
            (8 if first_entry else 0) | (16 if slash else 0)
    step = save or 0
    return bytes([flags, keep - 1]) + struct.pack("<Q", step)[:6] + latest + b"\0" + \
        "\n".join(entries).encode() + b"\n"


def corpus_checkpoint_dir():
    two = ("cstep-00000001", "cstep-00000003")
    return {
        "latest": run_dir(),
        "latest_resume": run_dir(resume=True, entries=two),
        "latest_crlf_no_newline": run_dir(latest=b"step-00000003\r\n", resume=True),
        "latest_unterminated": run_dir(latest=b"step-00000003"),
        "checkpoint_given": run_dir(write_latest=False, first_entry=True, resume=True),
        "checkpoint_given_slash": run_dir(write_latest=False, first_entry=True, slash=True),
        "run_slash": run_dir(slash=True, resume=True),
        "leftovers": run_dir(resume=True, entries=("cstep-00000003", "d.tmp-step-00000004-77-0",
                                                   "c.old-step-00000002-77", "flatest.tmp.77", "fnotes.txt",
                                                   "dstep-x")),
        "save_and_resume": run_dir(save=5, keep=2, resume=True, entries=two + ("d.tmp-step-00000005-1-0",)),
        "save_keep_one": run_dir(save=4, keep=1, entries=two + ("cstep-00000009",)),
        "save_over_latest": run_dir(save=3, entries=two),
        "save_step_zero": run_dir(save=0, keep=3, write_latest=False, entries=()),
        "save_nine_digits": run_dir(save=123456789, resume=True),
        "save_max_step": run_dir(save=2 ** 40, resume=True),
        "latest_names_missing": run_dir(latest=b"step-00000009\n"),
        "latest_garbage": run_dir(latest=b"garbage\n"),
        "latest_nine_digits": run_dir(latest=b"step-123456789\n", entries=("cstep-123456789",)),
        "latest_empty": run_dir(latest=b""),
        "latest_path": run_dir(latest=b"../step-00000003\n"),
        "latest_is_dir": run_dir(write_latest=False, entries=("dlatest", "cstep-00000003")),
        "model_only_resume": run_dir(resume=True, entries=("mstep-00000003",)),
        "model_only": run_dir(entries=("mstep-00000003",)),
        "no_state_resume": run_dir(resume=True, entries=("ostep-00000003",)),
        "no_optimizer_resume": run_dir(resume=True, entries=("sstep-00000003",)),
        "step_is_file": run_dir(entries=("fstep-00000003",)),
        "symlinked_step": run_dir(latest=b"step-00000007\n", resume=True,
                                  entries=("cstep-00000003", "lstep-00000007>step-00000003")),
        "symlink_loop": run_dir(entries=("lstep-00000003>step-00000003",)),
        "model_in_run_dir": run_dir(entries=("cstep-00000003", "lmodel.safetensors>step-00000003/model.safetensors")),
        "empty_run_dir": run_dir(write_latest=False, entries=()),
        "nested": run_dir(write_latest=False, first_entry=True, resume=True,
                          entries=("dinner", "cinner/step-00000003", "flatest")),
    }


CORPORA = {"safetensors": corpus_safetensors, "state_json": corpus_state_json,
           "model_metadata": corpus_model_metadata, "forward": corpus_forward, "text_data": corpus_text_data,
           "hf_tokenizer": corpus_hf_tokenizer, "hf_config": corpus_hf_config,
           "attention_file": corpus_attention_file, "word_lists": corpus_word_lists,
           "adamw_state": corpus_adamw_state, "checkpoint_dir": corpus_checkpoint_dir}


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    out_dir, targets = sys.argv[1], sys.argv[2:] or TARGETS
    for target in targets:
        if target not in CORPORA:
            sys.exit("unknown target %r (one of %s)" % (target, ", ".join(TARGETS)))
        directory = os.path.join(out_dir, target)
        os.makedirs(directory, exist_ok=True)
        files = CORPORA[target]()
        if target == "model_metadata":  # the loaders also see every plain safetensors seed
            files.update({"st_" + k: v for k, v in corpus_safetensors().items()})
        for name, data in files.items():
            with open(os.path.join(directory, name), "wb") as f:
                f.write(data)
        print("%s: %d seeds in %s" % (target, len(files), directory))


if __name__ == "__main__":
    main()
