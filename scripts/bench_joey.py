"""JoeyNMT 2.3.0 side of scripts/benchmark.py, driven as subprocesses of `.venv-joey`.

JoeyNMT sees exactly our data and tokenization: our length-filtered training pairs,
a few dev pairs (it needs a dev set to save a checkpoint), the same test subset, our
SentencePiece models, and vocabulary files listing our pieces in our id order (JoeyNMT
puts its own <unk>, <pad>, <s>, </s> first, so only UNK and PAD ids swap; the pieces
and the size are the same). `make joeynmt-env` builds the environment.
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from seq2seq.constants import DECODE_BATCH_TOKENS
from seq2seq.errors import Seq2SeqError

ROOT = Path(__file__).resolve().parent.parent
# the Python with joeynmt: `.venv-joey` (make joeynmt-env), or SEQ2SEQ_JOEY_PYTHON where JoeyNMT
# lives elsewhere (a GPU machine's own Python with JoeyNMT's wheels on PYTHONPATH: scripts/gpu_check.sh)
JOEY_PYTHON_ENV = "SEQ2SEQ_JOEY_PYTHON"
JOEY_PYTHON = Path(os.environ.get(JOEY_PYTHON_ENV) or ROOT / ".venv-joey" / "bin" / "python")
TOKENS_PER_SEC = re.compile(r"Tokens per Sec:\s*([0-9.]+)")
GENERATION = re.compile(r"Generation took\s*([0-9.]+)\[sec\]")
PEAK = re.compile(r"PEAK_RSS_KB (\d+)")
FLUSHED = re.compile(r"DENORMALS_FLUSHED (True|False)")
# `python -m joeynmt ARGS` that prints its own peak resident memory when it ends. With
# BENCH_FLUSH_DENORMALS=1 it first sets flush-to-zero, before torch starts its worker
# threads (they copy the flag from this thread), and prints whether every thread has it:
# a matmul whose true result is denormal must come out all zero. With BENCH_TURNS set it
# takes turns with our process (scripts/bench_turns.py; it runs in the repository root).
PEAK_WRAPPER = ("import os, resource, runpy, sys\n"
                "if os.environ.get('BENCH_TURNS'):\n"
                "    sys.path.insert(0, os.path.join(os.getcwd(), 'scripts'))\n"
                "    import bench_turns\n"
                "    bench_turns.hook_joey()\n"
                "if os.environ.get('BENCH_FLUSH_DENORMALS') == '1':\n"
                "    import torch\n"
                "    torch.set_flush_denormal(True)\n"
                "    a = torch.full((512, 512), 1e-20) @ torch.full((512, 512), 1e-22)\n"
                "    print('DENORMALS_FLUSHED', bool((a == 0).all()), file=sys.stderr)\n"
                "sys.argv = ['joeynmt', *sys.argv[1:]]\n"
                "try:\n    runpy.run_module('joeynmt', run_name='__main__')\n"
                "finally:\n    print('PEAK_RSS_KB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,"
                " file=sys.stderr)\n")

# Settings that cannot be matched exactly, and why (checked against JoeyNMT 2.3.0's code).
MISMATCHES = [
    "JoeyNMT's decoder is one Luong-style design for both attentions: the query is the new "
    "state s_t (after the RNN step), h~_t = tanh(W[s_t; c_t]) is fed to the next step "
    "(input feeding) and read by the output layer. Its 'bahdanau' is therefore only the "
    "additive score; ours queries with s_{t-1}, feeds c_t to the RNN and has a deep output "
    "(s_t, E y_{t-1}, c_t).",
    "Luong: JoeyNMT's score is 'general' (key layer without bias) with input feeding, as ours; "
    "the output layer has no bias in JoeyNMT, ours has one.",
    "Dropout: JoeyNMT drops the embeddings (0.2) and the attentional layer's input "
    "[s_t; c_t] (hidden_dropout 0.2); ours drops the embeddings and the readout (0.2).",
    "Batches: JoeyNMT's batch_size counts padded positions max(src+1, trg+1) x sentences "
    "and does not bucket by length; batch_size was chosen (simulating its sampler on our "
    "pairs) so its real target tokens per batch match ours; see joey.batch.",
    "Vocabulary: same 8k pieces per side, but JoeyNMT's ids 0/1 are <unk>/<pad> (ours "
    "<pad>/<unk>); no effect on the model.",
    "Decoding length cap: JoeyNMT 1.5 x the longest source in the batch; ours 2 x each "
    "source + 10 per sentence. Both stop at EOS; beam length penalty alpha 0.6 in both.",
    f"Decoding batches: JoeyNMT test batches of {DECODE_BATCH_TOKENS} padded tokens in file order "
    f"(no length sorting); ours {DECODE_BATCH_TOKENS} padded source tokens, length-sorted.",
    "Initialisation: embeddings N(0, 1) in both (JoeyNMT embed_initializer normal, weight "
    "1.0: torch's nn.Embedding default, which ours keeps). JoeyNMT's own default, "
    "xavier_uniform embeddings (std ~0.016 at 8k x 256), left it at the unigram loss for "
    "hundreds of updates on this corpus (docs/performance.md). Other weights: each "
    "toolkit's default (JoeyNMT xavier_uniform, ours torch's).",
    "Denormals: ours flushes them to zero in every thread (train.flush_denormals, default "
    "true); stock JoeyNMT computes on them. --joey-flush-denormals also times JoeyNMT with "
    "them flushed (set before its threads start, checked in every thread): rows 'ARM+ftz'.",
    "Learning rate: Adam 1e-3 constant in both (JoeyNMT: scheduling exponential with "
    "decrease_factor 1.0, since its plateau scheduler crashes with torch 2.13).",
]


def joey_available() -> bool:
    return JOEY_PYTHON.is_file()


def write_lines(path: Path, lines: list[str]) -> None:
    # one sentence per line: a stray newline inside a verse would shift every later pair
    path.write_text("".join(s.replace("\n", " ") + "\n" for s in lines), encoding="utf-8")


def export_data(bench: Any, corpus: Any, src_lang: str, tgt_lang: str, out: Path,
                dev_sentences: int = 20) -> dict[str, str]:
    """Plain-text train/dev/test files and vocab files for JoeyNMT under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    train = corpus["train"]["translation"]
    kept = [train[int(i)] for i in bench.data.train_idx]
    dev = corpus["valid"]["translation"][:dev_sentences]
    for split, pairs in (("train", kept), ("dev", dev)):
        write_lines(out / f"{split}.{src_lang}", [p[src_lang] for p in pairs])
        write_lines(out / f"{split}.{tgt_lang}", [p[tgt_lang] for p in pairs])
    write_lines(out / f"test.{src_lang}", bench.test_sources)
    write_lines(out / f"test.{tgt_lang}", bench.test_refs)
    for side, tok in (("src", bench.tokenizers.src), ("tgt", bench.tokenizers.tgt)):
        write_lines(out / f"vocab.{side}", [tok.id_to_piece(i) for i in range(tok.vocab_size)])
    folder = bench.tokenizers.folder
    return {"prefix": str(out), "src_model": str(folder / "spm_src.model"),
            "tgt_model": str(folder / "spm_tgt.model")}


def simulate_batches(src_lens: np.ndarray, tgt_lens: np.ndarray, batch_size: int, seed: int = 1
                     ) -> dict[str, float]:
    """JoeyNMT's TokenBatchSampler on shuffled pairs: a batch closes once
    max(src+1, trg+1) x sentences >= batch_size. Mean real/padded tokens per batch."""
    order = np.random.default_rng(seed).permutation(len(src_lens))
    real, padded, sents, n, longest, tok = [], [], [], 0, 0, 0
    for i in order:
        n, tok = n + 1, tok + int(tgt_lens[i]) + 1  # JoeyNMT's ntokens: target incl. EOS
        longest = max(longest, int(max(src_lens[i], tgt_lens[i])) + 1)
        if longest * n >= batch_size:
            real.append(tok)
            padded.append(longest * n)
            sents.append(n)
            n, longest, tok = 0, 0, 0
    return {"batch_size": batch_size, "tgt_tokens": float(np.mean(real)),
            "padded_positions": float(np.mean(padded)), "sentences": float(np.mean(sents)),
            "padding_fraction": 1.0 - float(np.sum(real)) / float(np.sum(padded))}


def match_batch_size(src_lens: np.ndarray, tgt_lens: np.ndarray, target_tokens: int) -> dict[str, float]:
    """The JoeyNMT batch_size whose batches hold ~``target_tokens`` real target tokens."""
    size = target_tokens
    for _ in range(4):  # the ratio real/padded barely moves with the size: converges fast
        stats = simulate_batches(src_lens, tgt_lens, size)
        size = int(round(size * target_tokens / stats["tgt_tokens"]))
    return simulate_batches(src_lens, tgt_lens, size)


def joey_config(arm: str, files: dict[str, str], langs: tuple[str, str], model_dir: Path,
                batch_size: int, updates: int, log_every: int, beam: int = 5,
                use_cuda: bool = False) -> dict[str, Any]:
    """The JoeyNMT YAML (as a dict) for ``arm`` (bahdanau | luong) at our configuration;
    ``use_cuda``: on the GPU, in fp32 (JoeyNMT's only mixed precision is fp16, not bf16)."""
    src, tgt = langs
    prefix = files["prefix"]

    def side(lang: str, model: str, vocab: str) -> dict[str, Any]:
        return {"lang": lang, "level": "bpe", "lowercase": False, "normalize": False,
                "max_length": 100000, "min_length": 1, "voc_file": f"{prefix}/{vocab}",
                "tokenizer_type": "sentencepiece", "tokenizer_cfg": {"model_file": model}}

    rnn = {"type": "recurrent", "rnn_type": "gru", "hidden_size": 256, "num_layers": 1,
           "embeddings": {"embedding_dim": 256, "dropout": 0.2}, "dropout": 0.2}
    return {
        "name": f"bench_{arm}", "joeynmt_version": "2.3.0", "model_dir": str(model_dir),
        "use_cuda": use_cuda, "fp16": False, "random_seed": 1,
        "data": {"train": f"{prefix}/train", "dev": f"{prefix}/dev", "test": f"{prefix}/test",
                 "dataset_type": "plain",
                 "src": side(src, files["src_model"], "vocab.src"),
                 "trg": side(tgt, files["tgt_model"], "vocab.tgt")},
        "training": {"optimizer": "adam", "learning_rate": 0.001, "learning_rate_min": 1e-9,
                     "scheduling": "exponential", "decrease_factor": 1.0, "clip_grad_norm": 1.0,
                     "batch_size": batch_size, "batch_type": "token", "normalization": "tokens",
                     "loss": "crossentropy", "label_smoothing": 0.0, "epochs": 1000,
                     "updates": updates, "validation_freq": updates, "logging_freq": log_every,
                     "eval_metrics": ["bleu"], "early_stopping_metric": "loss",
                     "keep_best_ckpts": 1, "overwrite": True, "shuffle": True,
                     "print_valid_sents": [], "num_workers": 0},
        "testing": {"beam_size": beam, "beam_alpha": 0.6, "batch_size": DECODE_BATCH_TOKENS,
                    "batch_type": "token", "eval_metrics": ["bleu"],
                    "sacrebleu_cfg": {"tokenize": "13a"}},
        "model": {"embed_initializer": "normal", "embed_init_weight": 1.0,  # see MISMATCHES
                  "encoder": {**rnn, "bidirectional": True},
                  "decoder": {**rnn, "attention": arm, "hidden_dropout": 0.2,
                              "init_hidden": "bridge", "input_feeding": True}},
    }


def write_config(cfg: dict[str, Any], path: Path) -> Path:
    path.write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
    return path


def run_joey(args: list[str], log_path: Path, timeout: float, flush_denormals: bool = False
             ) -> tuple[str, float]:
    """``.venv-joey/bin/python -m joeynmt ARGS``; its whole output goes to ``log_path``.
    flush_denormals: with flush-to-zero in every thread (not JoeyNMT's default)."""
    start = time.perf_counter()
    proc = subprocess.run(joey_command(args), capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT, env=joey_env(flush_denormals))
    wall = time.perf_counter() - start
    text = proc.stdout + proc.stderr
    log_path.write_text(text, encoding="utf-8")
    if proc.returncode != 0:
        raise joey_failed(args, proc.returncode, log_path, text)
    return text, wall


def joey_command(args: list[str]) -> list[str]:
    """``python -m joeynmt ARGS`` in `.venv-joey`, through PEAK_WRAPPER."""
    return [str(JOEY_PYTHON), "-c", PEAK_WRAPPER, *args]


def joey_env(flush_denormals: bool = False) -> dict[str, str]:
    return {**os.environ, "BENCH_FLUSH_DENORMALS": "1" if flush_denormals else "0"}


def joey_failed(args: list[str], returncode: int, log_path: Path, text: str) -> Seq2SeqError:
    """The error for a JoeyNMT command that failed: its exit status and its output's tail."""
    return Seq2SeqError(f"joeynmt {args[0]} failed (exit {returncode}); see {log_path}:\n"
                        + "\n".join(text.splitlines()[-15:]))


def peak_rss_mib(text: str) -> float:
    found = PEAK.findall(text)
    return int(found[-1]) / 1024 if found else float("nan")


def train(cfg: dict[str, Any], work: Path, timeout: float = 3600, flush_denormals: bool = False,
          warmup_windows: int = 1) -> dict[str, Any]:
    """Train; tokens/s from its log lines, the first ``warmup_windows`` (warm-up) dropped.
    flush_denormals: stock JoeyNMT computes on denormals; this times it with them flushed."""
    path = write_config(cfg, work / f"{cfg['name']}.yaml")
    log = work / f"{cfg['name']}{'.ftz' if flush_denormals else ''}.train.log"
    text, wall = run_joey(["train", str(path), "--skip-test"], log, timeout, flush_denormals)
    if flush_denormals and FLUSHED.findall(text) != ["True"]:
        raise Seq2SeqError(f"JoeyNMT could not be run with denormals flushed; see {log}")
    return train_result(cfg, text, wall, path, log, warmup_windows)


def train_result(cfg: dict[str, Any], text: str, wall: float, config: Path, log: Path,
                 warmup_windows: int = 1) -> dict[str, Any]:
    """What `train` returns, read from a finished `joeynmt train` log ``text``."""
    rates = [float(m) for m in TOKENS_PER_SEC.findall(text)]
    timed = rates[warmup_windows:] or rates
    return {"tgt_tok_per_s": statistics.median(timed) if timed else float("nan"),
            "tgt_tok_per_s_repeats": timed, "warmup_windows": len(rates) - len(timed),
            "updates": cfg["training"]["updates"], "wall_s": wall, "config": str(config),
            "log": str(log), "peak_rss_mib": peak_rss_mib(text)}


def test(cfg: dict[str, Any], work: Path, beam: int, timeout: float = 3600,
         ckpt: Path | None = None, test_prefix: str | None = None, tag: str = "") -> dict[str, Any]:
    """Decode dev + test with the trained model (``ckpt``, default its latest.ckpt); the test
    hypotheses and JoeyNMT's own 'Generation took' time for the test set (search only: model
    and data loading excluded). ``test_prefix``: another test set (data.test, the path
    without its .<lang>); ``tag`` goes into the names of the files written."""
    data = {**cfg["data"], "test": test_prefix} if test_prefix else cfg["data"]
    cfg = {**cfg, "data": data, "testing": {
        **cfg["testing"], "beam_size": beam,
        "load_model": str(ckpt or Path(cfg["model_dir"]) / "latest.ckpt")}}
    name = f"{cfg['name']}{'.' + tag if tag else ''}.beam{beam}"
    path = write_config(cfg, work / f"{name}.yaml")
    out = work / name
    text, wall = run_joey(["test", str(path), "-o", str(out)], work / f"{name}.log", timeout)
    gen = [float(m) for m in GENERATION.findall(text)]  # dev first, then test
    hyps = Path(f"{out}.test").read_text(encoding="utf-8").splitlines()
    return {"seconds": gen[-1] if gen else float("nan"), "sent_per_s": len(hyps) / gen[-1] if gen else
            float("nan"), "hypotheses": hyps, "wall_s": wall, "peak_rss_mib": peak_rss_mib(text)}
