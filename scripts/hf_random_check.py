"""Random differential checks of cabm against Hugging Face's own libraries, beyond the fixed cases of
the test suite (tests/fixtures/hf_make_*.py):

  tokenizers  random lines (scripts, whitespace kinds, controls, combining marks, emoji, special
              tokens' text, long words and long lines) through `cabm tokenize` and transformers' fast
              tokenizer (truncation=True), alone and as sentence pairs, at the tokenizer's maximum
              length and at a random --max-length, for every tokenizer directory of the fixtures;
  models      random BERT, RoBERTa, XLM-R and DistilBERT configs (odd head sizes, every supported
              activation, layer-norm eps, positions, token types, labels, multi-label heads) built
              and saved by transformers, with a fixture tokenizer, on lines or sentence pairs, through
              `cabm embed` (--pooling none, mean or cls, with or without --normalize) or `cabm
              classify` (logits) against transformers' forward.

Usage (the test virtual environment, after a build has made the fixtures):
  HF_HUB_OFFLINE=1 .venv/bin/python scripts/hf_random_check.py tokenizers|models \\
      [--fixtures build/release/tests/hf_fixtures/tokenizers] [--cabm build/release/cabm] [--seed S] [--cases N]
Prints one line per tokenizer or model and exits 1 if any differs (models: beyond 1e-4 of the
largest output, fp32)."""
import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402

POOLS = [
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ", "0123456789", "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
    " ", "  ", "\t", "\u00a0", "\u3000", "\u2009", "\u200b", "\u200d", "\ufeff", "\u2028", "\u0085", "\x0b", "\x0c",
    "\u0301\u0308\u0327\u0300", "éèêëàâäôöûüçñßøåæœÉÀÇÑÅ", "日本語中文字符東京都市我们喜欢", "한국어텍스트",
    "Ελληνικάγράμματα", "Кириллицарусский", "العربيةلغة", "עבריתשפה", "हिन्दीभाषा", "ไทยภาษา",
    "😀🎉👍🏽👨‍👩‍👧🇫🇷❤️", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢𝟘𝟙", "ﬁﬂ½²³™Ⅻ①ＡＢＣａｂｃ１２３", "\x01\x02\x7f\x1f", "\ue000\U000f0000",
    "’“”–—…«»",
]
WORDS = ["[CLS]", "[SEP]", "[PAD]", "[MASK]", "[UNK]", "<s>", "</s>", "<pad>", "<mask>", "<unk>", "the", "The",
         "don't", "it's", "café", "naïve", "straße", "hello", "world", "C++", "a.b@c.org", "https://x.org/p?q=1",
         "ﬁnance", "Ⅻ", "１２３", "a" * 120, "'s", "'ll", "'re", "日本", "😀"]


def random_line(rng):
    """One input line: no '\\n' or '\\r' (cabm's line rules and the fixtures' corpus agree there)."""
    if rng.random() < 0.05:  # a long line, for truncation
        return " ".join(rng.choice(WORDS[10:25]) for _ in range(rng.randint(200, 700)))
    parts = []
    for _ in range(rng.randint(0, 25)):
        if rng.random() < 0.3:
            parts.append(rng.choice(WORDS))
        else:
            pool = rng.choice(POOLS)
            parts.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 8))))
        if rng.random() < 0.5:
            parts.append(rng.choice([" ", " ", "  ", "\t", "\u00a0"]))
    return "".join(parts).replace("\n", " ").replace("\r", " ")


def write_lines(path, lines):
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for line in lines:
            f.write(line + "\n")


def check_tokenizers(args, rng, work):
    """Each tokenizer three ways: single lines at its own maximum length, single lines and sentence
    pairs (the pair template, 'longest_first' truncation) at a random --max-length."""
    lines = [random_line(rng) for _ in range(args.cases)]
    seconds = [random_line(rng) for _ in range(args.cases)]
    path, pair_path = os.path.join(work, "lines.txt"), os.path.join(work, "seconds.txt")
    write_lines(path, lines)
    write_lines(pair_path, seconds)
    differing = 0
    for name in sorted(os.listdir(args.fixtures)):
        directory = os.path.join(args.fixtures, name)
        if not os.path.isdir(directory) or not os.path.exists(os.path.join(directory, "tokenizer_config.json")):
            continue
        tok = transformers.AutoTokenizer.from_pretrained(directory, use_fast=True)
        max_length = rng.randint(8, 64)
        for pairs, limit in ((False, None), (False, max_length), (True, max_length)):
            what = f"{name}{' pairs' if pairs else ''}{f' --max-length {limit}' if limit else ''}"
            out = os.path.join(work, name + ".safetensors")
            command = [args.cabm, "tokenize", "--model", directory, "--input", path, "--output", out]
            command += ["--pair-input", pair_path] if pairs else []
            command += ["--max-length", str(limit)] if limit else []
            p = subprocess.run(command, capture_output=True, text=True)
            if p.returncode != 0:
                print(f"{what}: cabm tokenize failed: {p.stderr.strip()}")
                differing += 1
                continue
            got = load_file(out)
            # The batch call, as `cabm tokenize` promises: transformers' one-pair call tok(a, "")
            # would take an empty second text as absent (docs/tokenizers.md).
            extra = {"max_length": limit} if limit else {}
            encoded = tok(lines, seconds, truncation=True, **extra) if pairs else tok(lines, truncation=True, **extra)
            types = "token_type_ids" in got and "token_type_ids" in encoded
            bad = []
            for i, theirs in enumerate(encoded["input_ids"]):
                kept = got["attention_mask"][i] != 0
                mine = [int(x) for x in got["input_ids"][i][kept]]
                if mine != theirs or (types and [int(x) for x in got["token_type_ids"][i][kept]] !=
                                      encoded["token_type_ids"][i]):
                    bad.append((i, mine, theirs))
            print(f"{what}: {len(bad)} of {len(lines)} inputs differ")
            for i, mine, theirs in bad[:3]:
                shown = repr(lines[i]) + (f" + {seconds[i]!r}" if pairs else "")
                print(f"  input {i} {shown}\n    transformers {theirs[:40]}\n    cabm         {mine[:40]}")
            differing += len(bad)
    return differing


def random_model(rng, tokenizers_dir, case_seed):
    family = rng.choice(["bert", "roberta", "xlm-roberta", "distilbert"])
    head = rng.random() < 0.4
    tok_name = {"bert": "bert_uncased", "distilbert": "bert_uncased", "roberta": "roberta", "xlm-roberta": "xlmr"}[family]
    tok_dir = os.path.join(tokenizers_dir, tok_name)
    tok = transformers.AutoTokenizer.from_pretrained(tok_dir)
    heads, head_dim = rng.randint(1, 6), rng.choice([1, 2, 3, 5, 8, 12, 16, 32, 33])
    width, layers, ff = heads * head_dim, rng.randint(1, 3), rng.randint(1, 200)
    activation = rng.choice(["gelu", "relu", "gelu_new", "gelu_pytorch_tanh"])
    max_len, labels = rng.randint(4, 80), rng.randint(1, 5)
    common = dict(vocab_size=len(tok) + rng.randint(0, 20), pad_token_id=tok.pad_token_id, num_labels=labels)
    if family == "distilbert":
        activation = rng.choice(["gelu", "relu"])  # DistilBERT's two
        config = transformers.DistilBertConfig(dim=width, n_heads=heads, n_layers=layers, hidden_dim=ff,
                                               activation=activation, max_position_embeddings=max_len,
                                               sinusoidal_pos_embds=rng.random() < 0.3, **common)
        cls = transformers.DistilBertForSequenceClassification if head else transformers.DistilBertModel
    else:
        positions = max_len + (tok.pad_token_id + 1 if family != "bert" else 0)
        config_class, base, classifier = {
            "bert": (transformers.BertConfig, transformers.BertModel, transformers.BertForSequenceClassification),
            "roberta": (transformers.RobertaConfig, transformers.RobertaModel,
                        transformers.RobertaForSequenceClassification),
            "xlm-roberta": (transformers.XLMRobertaConfig, transformers.XLMRobertaModel,
                            transformers.XLMRobertaForSequenceClassification)}[family]
        config = config_class(hidden_size=width, num_attention_heads=heads, num_hidden_layers=layers,
                              intermediate_size=ff, hidden_act=activation,
                              layer_norm_eps=rng.choice([1e-12, 1e-6, 1e-5, 0.1]), max_position_embeddings=positions,
                              type_vocab_size=rng.randint(1, 3), **common)
        if head and rng.random() < 0.3:
            config.problem_type = "multi_label_classification"
        cls = classifier if head else base
    torch.manual_seed(case_seed)
    model = cls(config).eval()
    with torch.no_grad():  # away from the initialisation's zeros and ones (biases, LayerNorm)
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    text = (f"{cls.__name__} E {width} H {heads} L {layers} F {ff} {activation} max_len {max_len} "
            f"labels {labels}")
    return model, tok, tok_dir, head, max_len, text


def check_models(args, rng, work):
    """Each model on random lines, a third of them as sentence pairs; base models with --pooling
    none (last_hidden_state), mean or cls, the pooled ones with or without --normalize
    (sentence-transformers' masked mean and torch's F.normalize)."""
    differing = 0
    words = ("the quick brown fox jumps over lazy dog café naïve 日本 語 hello world don't it's 123 4.5 ! ? , . "
             "[CLS] <s> <mask> 😀 Ελληνικά Кириллица").split()
    for case in range(args.cases):
        model, tok, tok_dir, head, max_len, text = random_model(rng, args.fixtures, args.seed * 1000 + case)
        directory = os.path.join(work, f"model{case}")
        model.save_pretrained(directory, safe_serialization=True)
        for f in os.listdir(tok_dir):
            shutil.copy(os.path.join(tok_dir, f), directory)
        count = rng.randint(1, 12)
        lines = [" ".join(rng.choice(words) for _ in range(rng.randint(0, 40))) for _ in range(count)]
        write_lines(os.path.join(directory, "in.txt"), lines)
        pairs = rng.random() < 0.3
        seconds = [" ".join(rng.choice(words) for _ in range(rng.randint(0, 30))) for _ in range(count)]
        write_lines(os.path.join(directory, "second.txt"), seconds)
        enc = tok(lines, seconds if pairs else None, padding=True, truncation=True, max_length=max_len,
                  return_tensors="pt")
        if isinstance(model, (transformers.DistilBertModel, transformers.DistilBertForSequenceClassification)):
            enc.pop("token_type_ids", None)
        try:
            with torch.no_grad():
                expected = model(**enc)
        except IndexError:  # an id past an embedding table (a pair's token type 1 with type_vocab_size 1)
            expected = None
        out = os.path.join(directory, "out.safetensors")
        command = [args.cabm, "classify" if head else "embed", "--model", directory, "--input",
                   os.path.join(directory, "in.txt"), "--output", out, "--max-length", str(max_len),
                   "--batch-size", str(rng.randint(1, 5))]
        command += ["--pair-input", os.path.join(directory, "second.txt")] if pairs else []
        pooling = None if head else rng.choice(["none", "mean", "cls"])
        normalize = pooling in ("mean", "cls") and rng.random() < 0.4
        if pooling:
            command += ["--pooling", pooling] + (["--normalize"] if normalize else [])
        what = f"{text}, {count} {'pairs' if pairs else 'lines'}" + (f", pooling {pooling}" if pooling else "") + \
            (" normalized" if normalize else "")
        p = subprocess.run(command, capture_output=True, text=True)
        if expected is None:  # cabm must refuse the input too, with a one-line error
            ok = p.returncode == 1 and len(p.stderr.strip().splitlines()) == 1
            differing += 0 if ok else 1
            print(f"case {case} {'ok' if ok else 'DIFFERS'}: transformers raised IndexError, cabm exit {p.returncode}: "
                  f"{p.stderr.strip()!r}, {what}")
            continue
        if p.returncode != 0:
            print(f"case {case} {what}: cabm failed: {p.stderr.strip()}")
            differing += 1
            continue
        got = load_file(out)
        mask = enc["attention_mask"].numpy()
        if head:
            want = expected.logits.numpy()
            diff = float(np.abs(got["logits"] - want).max())
        elif pooling == "none":
            want = expected.last_hidden_state.numpy()
            diff = 0.0
            for i in range(count):
                n, m = int(got["attention_mask"][i].sum()), int(mask[i].sum())
                diff = max(diff, float("inf") if n != m else float(np.abs(got["last_hidden_state"][i, :n] - want[i, :m]).max()))
        else:
            h = expected.last_hidden_state
            m = enc["attention_mask"].unsqueeze(-1).float()
            pooled = (h * m).sum(1) / m.sum(1).clamp(min=1e-9) if pooling == "mean" else h[:, 0]
            if normalize:
                pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
            want = pooled.numpy()
            diff = float(np.abs(got["embeddings"] - want).max())
        ok = diff <= 1e-4 * max(1.0, float(np.abs(want).max()))
        differing += 0 if ok else 1
        print(f"case {case} {'ok' if ok else 'DIFFERS'}: max |diff| {diff:.2e}, {what}")
    return differing


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["tokenizers", "models"])
    ap.add_argument("--fixtures", default="build/release/tests/hf_fixtures/tokenizers",
                    help="the tokenizer fixtures (tests/fixtures/hf_make_tokenizers.py's output)")
    ap.add_argument("--cabm", default="build/release/cabm")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cases", type=int, default=None, help="lines (tokenizers, default 400) or models (default 30)")
    args = ap.parse_args()
    if args.cases is None:
        args.cases = 400 if args.what == "tokenizers" else 30
    torch.set_num_threads(2)
    transformers.logging.set_verbosity_error()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="cabm-hf-random-") as work:
        differing = (check_tokenizers if args.what == "tokenizers" else check_models)(args, rng, work)
    print(f"{differing} differing" if differing else "no differences")
    sys.exit(1 if differing else 0)


if __name__ == "__main__":
    main()
