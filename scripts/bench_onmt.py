"""OpenNMT-py 3.5.1 side of scripts/benchmark.py, driven as subprocesses of `.venv-onmt`.

OpenNMT-py sees exactly our token ids: our length-filtered training pairs and the same
test subset, written as SentencePiece pieces of our 8k models (tokenized once here, as
JoeyNMT tokenizes once before training and ours reads an encoded cache, so no toolkit
tokenizes inside its timed loop), and vocabulary files listing our pieces in our id
order (OpenNMT-py's own pad <blank> takes our <pad>'s id 0). `make onmt-env` builds
the environment: OpenNMT-py installed with --no-deps beside torch 2.13.0 (its metadata
pins torch<2.3, which would pull a CUDA build).

Two things it needs from torch 2.13 that its code predates, both set by this script
(no file of OpenNMT-py is changed):
- torch.load defaults to weights_only=True since torch 2.6, and OpenNMT-py's checkpoints
  hold an argparse.Namespace: onmt_translate fails with "Weights only load failed ...
  Unsupported global: GLOBAL argparse.Namespace". TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1
  (torch's documented switch) restores the old default for checkpoints we just wrote.
- the thread count: OpenNMT-py has no option for it on CPU; the wrapper sets it.
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
from bench_joey import write_lines

from seq2seq.constants import DECODE_BATCH_TOKENS
from seq2seq.errors import Seq2SeqError

ROOT = Path(__file__).resolve().parent.parent
ONMT_PYTHON = ROOT / ".venv-onmt" / "bin" / "python"
ATTENTIONS = {"bahdanau": "mlp", "luong": "general"}  # our arm -> OpenNMT-py global_attention
# "Step 40/  100; acc: ...; bsz: 2676/2990/93; 1234/1380 tok/s;  35 sec;"
STEP = re.compile(r"Step\s+(\d+)(?:/\s*\d+)?;.*?bsz:\s*([0-9.]+)/\s*([0-9.]+)/\s*([0-9.]+);"
                  r"\s*([0-9.]+)/\s*([0-9.]+) tok/s")
PARAMS = re.compile(r"\* number of parameters:\s*(\d+)")
AVG_MS = re.compile(r"Average translation time \(ms\):\s*([0-9.]+)")
PEAK = re.compile(r"PEAK_RSS_KB (\d+)")
# `python -c WRAPPER THREADS ENTRY ARGS`: onmt_train / onmt_translate in this process with
# THREADS torch threads, printing its own peak resident memory when it ends.
WRAPPER = ("import resource, sys, torch\n"
           "torch.set_num_threads(int(sys.argv[1]))\n"
           "entry = sys.argv[2]\n"
           "sys.argv = ['onmt_' + entry, *sys.argv[3:]]\n"
           "try:\n"
           "    if entry == 'train':\n        from onmt.bin.train import main\n"
           "    else:\n        from onmt.bin.translate import main\n"
           "    main()\n"
           "finally:\n    print('PEAK_RSS_KB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,"
           " file=sys.stderr)\n")

# Settings that cannot be matched exactly, and why (checked against OpenNMT-py 3.5.1's code).
MISMATCHES = [
    "Encoder size: OpenNMT-py requires the encoder and decoder RNNs to be the same size and "
    "its brnn splits hidden_size between the directions, so at hidden_size 256 each "
    "direction has 128 units (encoder states 256); ours has 256 per direction (states 512) "
    "and a 256 decoder. hidden_size 512 would double its decoder and output layer instead; "
    "256 keeps the decoder and output layer (most of the FLOPs per target token) equal. "
    "Parameter counts are in the rows ('params').",
    "OpenNMT-py's rnn decoder is one Luong-style design (InputFeedRNNDecoder) for both "
    "attentions: the query is the new state s_t, the attentional output is fed to the next "
    "step and read by the generator. 'mlp' is the additive score v^T tanh(W s_t + U h_j) "
    "(U h_j recomputed every step; its attentional layer linear_out has a bias and no "
    "tanh); 'general' is h_t^T W h_j and tanh(W_c [c_t; h_t]) with no bias (ours has one). "
    "Ours (bahdanau) queries with s_{t-1}, feeds c_t to the RNN and has a deep output.",
    "Bridge: OpenNMT-py's bridge is ReLU(W [h_fwd; h_bwd] + b) (bridge: true); ours tanh.",
    "Dropout 0.2 on embeddings and on the decoder output before the generator (OpenNMT-py); "
    "ours drops the embeddings and the readout.",
    "Batches: OpenNMT-py's batch_size (batch_type tokens) counts sentences x the longest of "
    "max(source, target + BOS + EOS) in the batch, after sorting a bucket by length; "
    "bucket_size is set to the number of training pairs (one epoch per bucket; its default "
    "262144 would hold every pair ~10 times and spend minutes filling it), and a batch "
    "skips a pair whose source is already in it. batch_size was chosen (simulating this on "
    "our pairs) so its real target tokens (+EOS) per batch match ours; see onmt.batch.",
    "Its tok/s windows include its in-process batching (num_workers 0, as JoeyNMT's; its "
    "default 2 would start data-loader processes competing for the 2 cores) and each "
    "epoch's bucket refill; ours times train_step on ready batches.",
    "Initialisation: OpenNMT-py's default uniform(-0.1, 0.1); ours torch's defaults.",
    "Denormals: ours flushes them to zero (train.flush_denormals); stock OpenNMT-py "
    "computes on them.",
    "Decoding: beam 5 with GNMT length penalty alpha 0.6 (length_penalty wu) as ours; "
    "greedy is beam 1 with random_sampling_topk 1 (argmax). Length cap: OpenNMT-py's "
    "default min(250, 1.25 x the longest source in the batch + 5); ours 2 x each source + "
    f"10. Batches of {DECODE_BATCH_TOKENS} padded source tokens, length-sorted, as ours. "
    "The time is its "
    "own 'Average translation time' x sentences (search, model and data loading excluded).",
    "Learning rate: Adam 1e-3 (betas 0.9/0.999) constant (decay_method none, "
    "learning_rate_decay 1.0); no validation set (none is needed to save a checkpoint).",
]


def onmt_available() -> bool:
    return ONMT_PYTHON.is_file()


def pieces(tok: Any, ids: Any) -> str:
    """Our ids as OpenNMT-py reads a pre-tokenized line (pieces never hold a space)."""
    return " ".join(tok.id_to_piece(int(i)) for i in ids)


def export_data(bench: Any, out: Path) -> dict[str, str]:
    """Pre-tokenized train/test files and vocab files for OpenNMT-py under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    tok, d = bench.tokenizers, bench.data
    write_lines(out / "train.src", [pieces(tok.src, d.train.src(i)) for i in d.train_idx])
    write_lines(out / "train.tgt", [pieces(tok.tgt, d.train.tgt(i)) for i in d.train_idx])
    write_lines(out / "test.src", [pieces(tok.src, tok.src.encode(s)) for s in bench.test_sources])
    for side, t in (("src", tok.src), ("tgt", tok.tgt)):
        # id 0 is our <pad>: OpenNMT-py puts its own <blank> first, so every id stays ours
        write_lines(out / f"vocab.{side}", [t.id_to_piece(i) for i in range(1, t.vocab_size)])
    return {"prefix": str(out), "train_pairs": str(len(d.train_idx))}


def simulate_batches(src_lens: np.ndarray, tgt_lens: np.ndarray, batch_size: int,
                     keys: list[Any] | None = None) -> dict[str, float]:
    """OpenNMT-py 3.5.1's training batches of one bucket holding every pair once
    (DynamicDatasetIter.batch_iter): pairs sorted by (source, target+2) length, a batch
    closes once sentences x max(source, target+2) >= batch_size (the pair that overflows
    it opens the next), and a pair whose source ``keys`` is already in the batch is
    skipped. Mean real target tokens (+EOS) and padded positions per batch."""
    n = len(src_lens)
    keys = keys if keys is not None else list(range(n))
    cost = np.maximum(src_lens, tgt_lens + 2)
    order = sorted(range(n), key=lambda i: (int(src_lens[i]), int(tgt_lens[i]) + 2))
    batches: list[list[int]] = []
    batch: list[int] = []
    longest, seen = 0, set()
    for i in order:
        if keys[i] in seen:
            continue
        seen.add(keys[i])
        batch.append(i)
        longest = max(longest, int(cost[i]))
        size = len(batch) * longest
        if size >= batch_size:
            if size == batch_size:
                batches.append(batch)
                batch, longest, seen = [], 0, set()
            elif len(batch) > 1:  # (one pair over the size alone waits for the next pair)
                batches.append(batch[:-1])
                batch, longest, seen = batch[-1:], int(cost[i]), set()
    if batch:
        batches.append(batch)
    real = [int(np.sum(tgt_lens[b] + 1)) for b in batches]
    padded = [len(b) * int(np.max(cost[b])) for b in batches]
    return {"batch_size": batch_size, "tgt_tokens": float(np.mean(real)),
            "padded_positions": float(np.mean(padded)),
            "sentences": float(np.mean([len(b) for b in batches])),
            "padding_fraction": 1.0 - float(np.sum(real)) / float(np.sum(padded)),
            "batches_per_epoch": len(batches)}


def match_batch_size(src_lens: np.ndarray, tgt_lens: np.ndarray, target_tokens: int,
                     keys: list[Any] | None = None) -> dict[str, float]:
    """The OpenNMT-py batch_size whose batches hold ~``target_tokens`` real target tokens."""
    size = target_tokens
    for _ in range(4):
        stats = simulate_batches(src_lens, tgt_lens, size, keys)
        size = max(1, int(round(size * target_tokens / stats["tgt_tokens"])))
    return simulate_batches(src_lens, tgt_lens, size, keys)


def onmt_config(arm: str, files: dict[str, str], model_dir: Path, batch_size: int,
                updates: int, log_every: int) -> dict[str, Any]:
    """The OpenNMT-py YAML (as a dict) for ``arm`` (bahdanau | luong) at our configuration."""
    prefix = files["prefix"]
    return {
        "name": f"onmt_{arm}", "seed": 1,
        "src_vocab": f"{prefix}/vocab.src", "tgt_vocab": f"{prefix}/vocab.tgt",
        "data": {"corpus_1": {"path_src": f"{prefix}/train.src", "path_tgt": f"{prefix}/train.tgt",
                              "transforms": [], "weight": 1}},
        "save_model": str(Path(model_dir) / "model"), "save_checkpoint_steps": updates,
        "keep_checkpoint": 1, "overwrite": True,
        # model: GRU 256/256, one layer, bidirectional encoder (128 per direction, see MISMATCHES)
        "encoder_type": "brnn", "decoder_type": "rnn", "rnn_type": "GRU",
        "enc_layers": 1, "dec_layers": 1, "word_vec_size": 256, "hidden_size": 256,
        "global_attention": ATTENTIONS[arm], "global_attention_function": "softmax",
        "input_feed": 1, "bridge": True, "dropout": [0.2],
        # optimisation: Adam 1e-3 constant, clip 1.0, token batches, loss per target token
        "optim": "adam", "learning_rate": 0.001, "adam_beta1": 0.9, "adam_beta2": 0.999,
        "decay_method": "none", "learning_rate_decay": 1.0, "max_grad_norm": 1.0,
        "label_smoothing": 0.0, "batch_type": "tokens", "batch_size": batch_size,
        "normalization": "tokens", "accum_count": [1], "batch_size_multiple": 1,
        "bucket_size": int(files["train_pairs"]), "num_workers": 0, "model_dtype": "fp32",
        "train_steps": updates, "report_every": log_every, "valid_steps": updates + 1,
    }


def write_config(cfg: dict[str, Any], path: Path) -> Path:
    body = {k: v for k, v in cfg.items() if k != "name"}  # ours; OpenNMT-py has no such key
    path.write_text(yaml.safe_dump(body, sort_keys=False, allow_unicode=True), encoding="utf-8")
    return path


def run_onmt(entry: str, args: list[str], log_path: Path, threads: int, timeout: float
             ) -> tuple[str, float]:
    """onmt_ENTRY ARGS under ``.venv-onmt`` with ``threads`` torch threads; its whole output
    goes to ``log_path``."""
    start = time.perf_counter()
    env = {**os.environ, "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1", "PYTHONWARNINGS": "ignore"}
    env.pop("PYTHONPATH", None)  # our package is no concern of OpenNMT-py's
    proc = subprocess.run([str(ONMT_PYTHON), "-c", WRAPPER, str(threads), entry, *args],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)
    wall = time.perf_counter() - start
    text = proc.stdout + proc.stderr
    log_path.write_text(text, encoding="utf-8")
    if proc.returncode != 0:
        raise Seq2SeqError(f"onmt_{entry} failed (exit {proc.returncode}); see {log_path}:\n"
                           + "\n".join(text.splitlines()[-15:]))
    return text, wall


def peak_rss_mib(text: str) -> float:
    found = PEAK.findall(text)
    return int(found[-1]) / 1024 if found else float("nan")


def parse_train_log(text: str) -> dict[str, Any]:
    """Its report lines: per window (step, src/tgt tokens per batch, sentences per batch,
    src/tgt tokens/s), and the parameter count."""
    windows = [{"step": int(m[0]), "src_tokens": float(m[1]), "tgt_tokens": float(m[2]),
                "sentences": float(m[3]), "src_tok_per_s": float(m[4]),
                "tgt_tok_per_s": float(m[5])} for m in STEP.findall(text)]
    params = PARAMS.findall(text)
    return {"windows": windows, "params": int(params[-1]) if params else None}


def train(cfg: dict[str, Any], work: Path, threads: int, timeout: float = 3600,
          warmup_windows: int = 1) -> dict[str, Any]:
    """Train; tokens/s from its log lines, the first ``warmup_windows`` (warm-up) dropped."""
    path = write_config(cfg, work / f"{cfg['name']}.yaml")
    log = work / f"{cfg['name']}.train.log"
    text, wall = run_onmt("train", ["-config", str(path)], log, threads, timeout)
    parsed = parse_train_log(text)
    windows = parsed["windows"]
    timed = windows[warmup_windows:] or windows
    rates = [w["tgt_tok_per_s"] for w in timed]
    return {"tgt_tok_per_s": statistics.median(rates) if rates else float("nan"),
            "src_tok_per_s": statistics.median([w["src_tok_per_s"] for w in timed])
            if timed else float("nan"),
            "tgt_tok_per_s_repeats": rates, "warmup_windows": len(windows) - len(timed),
            "tgt_tokens_per_batch": statistics.fmean([w["tgt_tokens"] for w in timed])
            if timed else float("nan"),
            "updates": cfg["train_steps"], "wall_s": wall, "config": str(path),
            "params": parsed["params"], "peak_rss_mib": peak_rss_mib(text)}


def checkpoint(cfg: dict[str, Any]) -> Path:
    """The last checkpoint training wrote (model_step_N.pt, largest N)."""
    folder, stem = Path(cfg["save_model"]).parent, Path(cfg["save_model"]).name
    found = sorted(folder.glob(f"{stem}_step_*.pt"), key=lambda p: int(p.stem.rsplit("_", 1)[1]))
    if not found:
        raise Seq2SeqError(f"OpenNMT-py wrote no checkpoint under {folder}")
    return found[-1]


def detokenize(tok: Any, lines: list[str]) -> list[str]:
    """Output lines of pieces as text, through our SentencePiece model (a piece it does
    not know, e.g. OpenNMT-py's <blank>, reads as <unk>)."""
    ids = {tok.id_to_piece(i): i for i in range(tok.vocab_size)}
    unk = ids.get("<unk>", 1)
    return [tok.decode([ids.get(p, unk) for p in line.split()]) for line in lines]


def translate_args(model: Path, src: Path, out: Path, beam: int) -> list[str]:
    args = ["-model", str(model), "-src", str(src), "-output", str(out), "-beam_size", str(beam),
            "-batch_type", "tokens", "-batch_size", str(DECODE_BATCH_TOKENS), "-report_time",
            "-seed", "1"]
    if beam == 1:
        return [*args, "-random_sampling_topk", "1"]  # argmax; its default 0 samples
    return [*args, "-length_penalty", "wu", "-alpha", "0.6"]


def test(cfg: dict[str, Any], files: dict[str, str], work: Path, beam: int, threads: int,
         tgt_tokenizer: Any = None, timeout: float = 3600) -> dict[str, Any]:
    """Decode the test subset with the trained model; its own 'Average translation time'
    x sentences (search only: model and data loading excluded). Hypotheses are text when
    ``tgt_tokenizer`` (our target SentencePiece) is given, pieces otherwise."""
    name = f"{cfg['name']}.beam{beam}"
    out = work / f"{name}.hyp"
    args = translate_args(checkpoint(cfg), Path(files["prefix"]) / "test.src", out, beam)
    text, wall = run_onmt("translate", args, work / f"{name}.log", threads, timeout)
    hyps = out.read_text(encoding="utf-8").splitlines()
    if tgt_tokenizer is not None:
        hyps = detokenize(tgt_tokenizer, hyps)
    avg = AVG_MS.findall(text)
    seconds = float(avg[-1]) * len(hyps) / 1000 if avg else float("nan")
    return {"seconds": seconds, "sent_per_s": len(hyps) / seconds if seconds > 0 else float("nan"),
            "hypotheses": hyps, "wall_s": wall, "peak_rss_mib": peak_rss_mib(text)}
