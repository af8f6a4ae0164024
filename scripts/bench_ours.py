"""Our side of scripts/benchmark.py: training and decoding speed, FLOPs, matmul ceiling.

Each arm is measured in a child process (``python scripts/bench_ours.py --arm A
--settings JSON --out FILE``) so its peak resident memory (``ru_maxrss``) is its own.
The functions are importable for tests: :func:`measure_arm` does everything for one arm.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from bench_flops import count_flops  # noqa: E402
from bench_turns import ENV as TURNS_ENV  # noqa: E402
from bench_turns import Turns  # noqa: E402

from seq2seq import contention, native, precision  # noqa: E402
from seq2seq.corpus import (  # noqa: E402
    batching,  # noqa: E402
    corpus_dir,
    load_corpus,
)
from seq2seq.corpus.tokenizer import Tokenizers, load_or_train  # noqa: E402
from seq2seq.errors import Seq2SeqError  # noqa: E402
from seq2seq.inference.decode import decode  # noqa: E402
from seq2seq.model import build_model, count_parameters, gemm  # noqa: E402
from seq2seq.model.loss import chunk_shapes  # noqa: E402
from seq2seq.runtime import (  # noqa: E402
    flush_denormals,
    keep_freed_memory,
    resolve_device,
    seed_everything,
)
from seq2seq.training.loop import Run, resolve_precision, train_step  # noqa: E402
from seq2seq.training.loop import precision_of as run_precision  # noqa: E402
from seq2seq.training.optim import build_optimizer  # noqa: E402

ARMS = ("none", "bahdanau", "luong")


def bench_config(data_overrides: list[str], arm: str, batch_tokens: int, precision_name: str,
                 threads: int, flush_denormals: bool = True, device: str = "cpu") -> DictConfig:
    """The fixed benchmark configuration (configs/ defaults: GRU 256/256, bidirectional,
    8k SentencePiece per side) with attention ``arm``, a constant learning rate, on
    ``device`` (cpu or cuda)."""
    from hydra import compose, initialize_config_dir

    from seq2seq.config import CONFIG_DIR, register_configs

    register_configs()

    overrides = [*data_overrides, f"model/attention={arm}", f"train.batch_tokens={batch_tokens}",
                 f"train.precision={precision_name}", f"train.device={device}", f"train.threads={threads}",
                 "train.lr_schedule=constant",
                 f"train.flush_denormals={str(flush_denormals).lower()}"]
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose("config", overrides=overrides)


@dataclass
class BenchData:
    """What both toolkits are fed: our encoded train split (length-filtered) and a test subset."""

    tokenizers: Tokenizers
    data: batching.TrainingData
    test_sources: list[str]
    test_refs: list[str]
    test_ids: list[int]  # rows of the test split in the subset
    spm_dir: Path | None  # the folder holding spm_src.model / spm_tgt.model


def decode_subset(n_test: int, n: int) -> list[int]:
    """Every k-th test row so the subset keeps the split's length mix; n=0 or n>=n_test: all."""
    if n <= 0 or n >= n_test:
        return list(range(n_test))
    return [int(i) for i in np.linspace(0, n_test - 1, n).round().astype(int)]


def load_bench_data(cfg: DictConfig, decode_sentences: int) -> BenchData:
    """Corpus, our SentencePiece models and encoded splits (the same cache train.py uses)."""
    corpus = load_corpus(cfg.data)
    tokenizers = load_or_train(corpus_dir(cfg.data), cfg.tokenizer, cfg.data.src_lang,
                               cfg.data.tgt_lang)
    data = batching.training_data(corpus, tokenizers, cfg.data.src_lang, cfg.data.tgt_lang,
                                  cfg.train.max_src_words, cache_dir=corpus_dir(cfg.data) / "cache")
    pairs = corpus["test"]["translation"]
    ids = decode_subset(len(pairs), decode_sentences)
    return BenchData(tokenizers, data, [pairs[i][cfg.data.src_lang] for i in ids],
                     [pairs[i][cfg.data.tgt_lang] for i in ids], ids, tokenizers.folder)


def make_run(cfg: DictConfig, bench: BenchData) -> Run:
    """A train.py Run without a run folder: what :func:`seq2seq.training.loop.train_step` needs."""
    seed_everything(cfg.train.seed)
    tok = bench.tokenizers
    device = resolve_device(cfg.train.device)
    model = build_model(cfg.model, tok.src.vocab_size, tok.tgt.vocab_size).to(device).train()
    optimizer, scheduler = build_optimizer(model, cfg.train)
    # a fixed precision as seq2seq-train resolves it (auto is resolved in _resolve)
    fixed = precision.choose("fp32" if cfg.train.precision == "auto" else cfg.train.precision,
                             device, lambda: None)
    return Run(cfg, None, device, model, optimizer, scheduler, tok, bench.data,
               bf16=fixed.bf16, loss_bf16=fixed.loss_bf16, gemm_bf16=fixed.gemm_bf16)


def precision_of(row: dict[str, Any]) -> str:
    """The precision a measured row trained in: bf16, bf16_gemm, bf16_loss or fp32."""
    return precision.Choice(row["bf16"], "", row.get("loss_bf16", False),
                            row.get("gemm_bf16", False)).name


def batch_stats(batches: list[batching.Batch]) -> dict[str, float]:
    """Mean real and padded tokens per batch (padding is what JoeyNMT's batch_size counts)."""
    def mean(xs: list[float]) -> float:
        return float(statistics.fmean(xs))
    return {"sentences": mean([b.src.size(0) for b in batches]),
            "tgt_tokens": mean([b.n_tgt_tokens for b in batches]),
            "tgt_positions": mean([b.tgt_out.numel() for b in batches]),
            "src_tokens": mean([b.n_src_tokens for b in batches]),
            "src_positions": mean([b.src.numel() for b in batches])}


def time_training(run: Run, batches: list[batching.Batch], warmup: int, repeats: int,
                  per_repeat: int, turns: Turns | None = None, warm_turns: int = 1
                  ) -> dict[str, Any]:
    """train.py's train_step (fwd + loss + bwd + clip + Adam) over real batches.

    The first ``warmup`` batches are not timed; then ``repeats`` groups of ``per_repeat``
    batches, each giving target and source tokens/s; the medians are reported.
    ``turns`` (paired timing, scripts/bench_turns.py): called during a turn; the warm-up
    is split over ``warm_turns`` turns, each timed group is a turn of its own, and it
    returns in the last turn.
    """
    turns = turns or Turns(None)
    need = warmup + repeats * per_repeat
    if len(batches) < need:
        batches = [batches[i % len(batches)] for i in range(need)]
    cuts = [warmup * i // warm_turns for i in range(warm_turns + 1)]
    for i in range(warm_turns):
        if i:
            turns.take()
        for b in batches[cuts[i]:cuts[i + 1]]:
            train_step(run, b)
        turns.give()
    tgt_rates, src_rates, secs, shares = [], [], [], []
    for r in range(repeats):
        group = batches[warmup + r * per_repeat: warmup + (r + 1) * per_repeat]
        turns.take()
        synchronize(run.device)  # a GPU may still be running the warm-up's last steps
        cores = contention.Meter()
        cores.start()
        for b in group:
            loss = train_step(run, b)
        float(loss)  # a no-op on CPU; on a GPU it waits for the queued work
        cores.stop()
        sec = cores.wall
        turns.give()
        secs.append(sec)
        shares.append(cores.share())
        tgt_rates.append(sum(b.n_tgt_tokens for b in group) / sec)
        src_rates.append(sum(b.n_src_tokens for b in group) / sec)
    turns.take()
    return {"tgt_tok_per_s": statistics.median(tgt_rates), "src_tok_per_s": statistics.median(src_rates),
            "tgt_tok_per_s_repeats": tgt_rates, "src_tok_per_s_repeats": src_rates,
            "sec_per_repeat": secs, "batches_per_repeat": per_repeat, "warmup_batches": warmup,
            # CPU seconds per wall second per thread: well under 1 where another process
            # took a core (seq2seq.contention); meaningless on a GPU
            "cpu_share_repeats": shares}


def profile_steps(run: Run, batches: list[batching.Batch], top: int = 15) -> str:
    """torch.profiler's table of the ops costing most CPU time over train_step on ``batches``."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for b in batches:
            train_step(run, b)
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top)


def matmul_rate(n: int, dtype: torch.dtype, repeats: int = 5, budget_s: float = 10.0,
                sizes: dict[str, int] | None = None, device: str = "cpu") -> float:
    """FLOP/s of an (n, n) @ (n, n) matmul on ``device``: the best of ``repeats`` after a warm-up.

    Where a 256-sized product predicts more than ``budget_s`` for that at size n (bf16
    emulated on a CPU without native bf16 runs a 2048-sized product for about a minute),
    the size is halved until it fits (on a CPU): the rate of the slow path is then
    measured in seconds, not minutes. The size used is stored in ``sizes`` under the
    dtype's name ("float32", "bfloat16").
    """
    small = min(n, 256)
    # a GPU's 256-sized product is launch-bound: scaling its time by n^3 would shrink n for
    # nothing, and no GPU emulates bf16 the slow way
    once = _seconds_of_mm(small, dtype, device) if torch.device(device).type == "cpu" else 0.0
    while n > small and once * (n / small) ** 3 * (repeats + 1) > budget_s:
        n //= 2
    if sizes is not None:
        sizes[str(dtype).removeprefix("torch.")] = n
    return 2.0 * n ** 3 / _best_seconds(n, dtype, repeats, device)


def synchronize(device: str | torch.device) -> None:
    """Wait for the work queued on a GPU (a CPU runs each op to its end: nothing to wait for)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _best_seconds(n: int, dtype: torch.dtype, repeats: int, device: str = "cpu") -> float:
    """The fastest of ``repeats`` (n, n) @ (n, n) products, after one untimed."""
    dev = torch.device(device)
    a = torch.randn(n, n, device=dev).to(dtype)
    b = torch.randn(n, n, device=dev).to(dtype)

    def product() -> None:
        torch.mm(a, b)

    precision.timed(product, dev)  # the warm-up, waited for on a GPU
    return min(precision.timed(product, dev) for _ in range(repeats))


def _seconds_of_mm(n: int, dtype: torch.dtype, device: str = "cpu") -> float:
    """The fastest of three (n, n) products after one untimed: the size check's prediction.

    One timed product is not enough: a single slow call (a preempted vCPU, threads waking)
    can cut a fast product's size, and a smaller product's lower rate then becomes the rate
    every fraction of the matmul rate is of."""
    return _best_seconds(n, dtype, 3, device)


def time_decoding(model: torch.nn.Module, bench: BenchData, beam: int) -> dict[str, float]:
    """Sentences/s decoding the test subset (tokenize + search + detokenize, model loaded),
    on the model's device."""
    device = next(model.parameters()).device
    warmup = min(8, max(1, len(bench.test_sources) // 4))
    decode(model, bench.tokenizers, bench.test_sources[:warmup], beam=beam, device=device,
           progress=False)
    out = decode(model, bench.tokenizers, bench.test_sources, beam=beam, device=device,
                 progress=False)
    n_out = sum(out.lengths)
    return {"sent_per_s": len(bench.test_sources) / out.seconds, "seconds": out.seconds,
            "out_tok_per_s": n_out / out.seconds, "mean_out_len": n_out / max(len(out.lengths), 1)}


def measure_arm(arm: str, settings: dict[str, Any]) -> dict[str, Any]:
    """Everything for one arm. settings: data_overrides, batch_tokens, precision (fp32,
    bf16, or auto: both timed first, as seq2seq-train does), threads,
    flush_denormals (train.flush_denormals, default true),
    warmup, repeats, per_repeat, decode_sentences, decode (bool), profile (batches under
    torch.profiler after the timing, 0 = none), decode_runs ({arm: run
    folder} whose trained model is timed decoding; the run's tokenizers must be ours).
    With BENCH_TURNS set (scripts/bench_turns.py) it waits for its first turn, which covers
    the start-up, the probes and the warm-up, and takes turns through the timed groups."""
    turns = Turns(os.environ.get(TURNS_ENV))
    turns.take()
    torch.set_num_threads(settings["threads"])
    os.environ[gemm.ENV] = settings.get("fp32_gemm", "auto")  # this child's route, as seq2seq-train's
    cfg = bench_config(settings["data_overrides"], arm, settings["batch_tokens"],
                       settings["precision"], settings["threads"],
                       settings.get("flush_denormals", True), settings.get("device", "cpu"))
    keep_freed_memory()  # as seq2seq-train does
    flushed = cfg.train.flush_denormals and flush_denormals()
    bench = load_bench_data(cfg, settings["decode_sentences"])
    run = make_run(cfg, bench)
    os.environ[gemm.BF16_ENV] = settings.get("bf16_gemm", "default")
    route = gemm.choose(run.device, chunk_shapes(run.model), gemm.step_probe(run.model))
    row = _measure(run, bench, arm, settings, route, turns)
    row["denormals_flushed"] = flushed
    return row


def _resolve(run: Run, batches: list[batching.Batch], settings: dict[str, Any], route: gemm.Choice
             ) -> tuple[str, gemm.Choice]:
    """(the precision's reason, the GEMM route), resolved as seq2seq-train does: the
    precision probe times fp32 on ``route``, and bf16 training takes gemm.for_bf16's route."""
    reason = f"{run_precision(run).name} (train.precision={run.cfg.train.precision})"
    if settings["precision"] == "auto":
        with gemm.using(route):
            choice = resolve_precision(run, batches)  # cfg.train.precision is auto here
        run.bf16, run.loss_bf16, run.gemm_bf16 = choice.bf16, choice.loss_bf16, choice.gemm_bf16
        reason = choice.reason
    return reason, gemm.for_bf16(route, run.device) if run.bf16 else route


def _measure(run: Run, bench: BenchData, arm: str, settings: dict[str, Any],
             route: gemm.Choice, turns: Turns | None = None) -> dict[str, Any]:
    """measure_arm's timings, FLOPs, profile and decoding of ``run``, its fp32 GEMMs on ``route``."""
    cfg, d = run.cfg, bench.data
    need = settings["warmup"] + settings["repeats"] * settings["per_repeat"]
    idx = batching.train_batches(d.train, d.train_idx, cfg.train.batch_tokens, cfg.train.seed, 0)
    batches = [batching.collate(d.train, i).to(run.device) for i in idx[:need]]
    reason, route = _resolve(run, batches, settings, route)
    ctx = (torch.autocast(run.device.type, dtype=torch.bfloat16) if run.bf16
           else contextlib.nullcontext())
    row: dict[str, Any] = {"arm": arm, "bf16": run.bf16, "loss_bf16": run.loss_bf16,
                           "gemm_bf16": run.gemm_bf16,
                           "precision": reason,
                           "params": count_parameters(run.model),
                           "batch": batch_stats(batches),
                           "fp32_gemm": route.name, "fp32_gemm_reason": route.reason}
    if run.bf16:
        row["bf16_gemm"], row["bf16_gemm_reason"] = route.bf16_name, route.bf16_reason
    with gemm.using(route):
        row["train"] = time_training(run, batches, settings["warmup"], settings["repeats"],
                                     settings["per_repeat"], turns, settings.get("warm_turns", 1))
        row.update(count_flops(run, batches[0]))
        # the C kernels' timed choices of this process: a row slower than its twin in another
        # process may have taken another path
        row["native"] = native.status()
        if settings.get("profile", 0):
            row["profile"] = profile_steps(run, batches[-settings["profile"]:])
    if settings.get("decode", True):  # off the route, as seq2seq-translate and -evaluate decode
        model, trained = run.model, settings.get("decode_runs", {}).get(arm)
        if trained:  # an untrained model's outputs run to the length cap: time a trained one
            from seq2seq.runs.checkpoint import load_model
            model = load_model(trained)[0].to(run.device)
        row["decode_model"] = trained or "untrained (weights after the timed training batches)"
        with ctx:  # train.precision covers training only; decoding under bf16 needs it explicitly
            row["greedy"] = time_decoding(model, bench, beam=1)
            row["beam5"] = time_decoding(model, bench, beam=5)
        row["decode_sentences"] = len(bench.test_sources)
    row["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if run.device.type == "cuda":
        row["device"] = gpu_description(run.device)
        row["peak_gpu_mib"] = torch.cuda.max_memory_allocated(run.device) / 2 ** 20
    return row


def gpu_description(device: torch.device) -> dict[str, Any]:
    """The GPU a row was measured on: name, compute capability, memory, CUDA and cuDNN."""
    props = torch.cuda.get_device_properties(device)
    return {"name": props.name, "capability": f"{props.major}.{props.minor}",
            "memory_gib": round(props.total_memory / 2 ** 30, 1),
            "multiprocessors": props.multi_processor_count, "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(), "torch": torch.__version__}


def child_command(arm: str, settings: dict[str, Any], out: Path) -> tuple[list[str], dict[str, str]]:
    """The command and environment that measure ``arm`` in a child process, writing ``out``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop(TURNS_ENV, None)  # a paired child gets its own folder from bench_turns.start
    return ([sys.executable, str(Path(__file__).resolve()), "--arm", arm,
             "--settings", json.dumps(settings), "--out", str(out)], env)


def run_child(arm: str, settings: dict[str, Any]) -> dict[str, Any]:
    """One arm in a fresh process, so ru_maxrss is that arm's peak alone."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "arm.json"
        cmd, env = child_command(arm, settings, out)
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise Seq2SeqError(f"measuring arm {arm} failed:\n{proc.stderr[-3000:]}")
        return json.loads(out.read_text(encoding="utf-8"))


def main() -> None:
    parser = argparse.ArgumentParser(description="measure one arm (a child of scripts/benchmark.py)")
    parser.add_argument("--arm", required=True, choices=ARMS, help="attention arm")
    parser.add_argument("--settings", required=True, help="JSON dict, see measure_arm")
    parser.add_argument("--out", required=True, help="write the arm's results (JSON) here")
    args = parser.parse_args()
    row = measure_arm(args.arm, json.loads(args.settings))
    Path(args.out).write_text(json.dumps(row, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
