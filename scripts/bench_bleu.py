"""`scripts/benchmark.py --minutes M`: test BLEU after equal wall-clock training.

Ours: `seq2seq-train model/attention=ARM train.max_minutes=M` (our defaults otherwise),
or a run folder given with `--ours-run ARM=DIR`. JoeyNMT has no time limit: its
`updates` is M minutes x its training tokens/s measured earlier in the same run,
divided by its real target tokens per batch (so its M minutes count training steps
only, not its start-up nor its one validation); it validates (and so saves its
checkpoint) at the last update. Our max_minutes counts wall time including our dev
validations, so the budget leans slightly toward JoeyNMT; both wall times are recorded. Both then decode the same test subset with beam 5 and greedy; BLEU
is sacrebleu on detokenized text against the same references (the corpus's target side).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import bench_joey
import bench_ours
import sacrebleu

from seq2seq.errors import Seq2SeqError


def train_ours(args: argparse.Namespace, arm: str, work: Path) -> tuple[str, float]:
    """Our run folder for ``arm``: the one given with --ours-run, else trained M minutes now."""
    given = bench_ours_runs(args).get(arm)
    if given:
        return given, float("nan")
    run_dir = work / f"ours_{arm}"
    cmd = [sys.executable, "-c", "from seq2seq.cli import train_main; train_main()",
           f"model/attention={arm}", f"train.max_minutes={args.minutes}", f"run_dir={run_dir}",
           f"train.threads={args.threads}", f"train.batch_tokens={args.batch_tokens}",
           "train.device=cpu", *args.data]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(bench_ours.ROOT), os.environ.get("PYTHONPATH", "")])}
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=bench_ours.ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise Seq2SeqError(f"seq2seq-train for {arm} failed:\n{proc.stderr[-3000:]}")
    return str(run_dir), time.perf_counter() - start


def bench_ours_runs(args: argparse.Namespace) -> dict[str, str]:
    return dict(spec.partition("=")[::2] for spec in args.ours_run)


def run_summary(run_dir: str) -> dict[str, Any]:
    """Our run's summary.json (steps, wall_time_s incl. validation, train_time_s steps only)."""
    path = Path(run_dir) / "summary.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def bleu(hyps: list[str], refs: list[str]) -> dict[str, Any]:
    metric = sacrebleu.BLEU()
    score = metric.corpus_score(hyps, [refs])
    return {"bleu": score.score, "signature": str(metric.get_signature())}


def decode_ours(run_dir: str, bench: bench_ours.BenchData) -> dict[str, Any]:
    """Greedy and beam-5 sentences/s and BLEU of a trained run on the test subset."""
    from seq2seq.inference.decode import decode
    from seq2seq.runs.checkpoint import load_model

    model, tokenizers, _ = load_model(run_dir)
    out: dict[str, Any] = {"run": run_dir}
    for beam, key in ((1, "greedy"), (5, "beam5")):
        decode(model, tokenizers, bench.test_sources[:8], beam=beam, progress=False)  # warm-up
        dec = decode(model, tokenizers, bench.test_sources, beam=beam, progress=False)
        out[key] = {"sent_per_s": len(dec.hypotheses) / dec.seconds, "seconds": dec.seconds,
                    **bleu(dec.hypotheses, bench.test_refs)}
    return out


def train_joey(args: argparse.Namespace, arm: str, work: Path, results: dict[str, Any],
               bench: bench_ours.BenchData) -> dict[str, Any]:
    joey = results["joey"]
    speed = joey["arms"][arm]["train"]["tgt_tok_per_s"]
    updates = max(1, int(args.minutes * 60 * speed / joey["batch"]["tgt_tokens"]))
    log_every = min(100, updates)  # JoeyNMT wants validation_freq (= updates) divisible by it
    updates = round(updates / log_every) * log_every
    cfg = bench_joey.joey_config(arm, joey["files"], tuple(args.langs), work / f"joey_{arm}_{args.minutes:g}min",
                                 joey["batch"]["batch_size"], updates, log_every)
    cfg["name"] = f"bench_{arm}_{args.minutes:g}min"
    out: dict[str, Any] = {"train": bench_joey.train(cfg, work)}
    for beam, key in ((1, "greedy"), (5, "beam5")):
        res = bench_joey.test(cfg, work, beam)
        out[key] = {"sent_per_s": res["sent_per_s"], "seconds": res["seconds"],
                    **bleu(res["hypotheses"], bench.test_refs)}
    return out


def equal_time_bleu(args: argparse.Namespace, work: Path, results: dict[str, Any]) -> dict[str, Any]:
    """Per JoeyNMT arm: both toolkits trained ~M minutes, test BLEU and decoding speed."""
    cfg = bench_ours.bench_config(args.data, "bahdanau", args.batch_tokens, False, args.threads)
    args.langs = [cfg.data.src_lang, cfg.data.tgt_lang]
    bench = bench_ours.load_bench_data(cfg, args.decode_sentences)
    out: dict[str, Any] = {"minutes": args.minutes, "test_sentences": len(bench.test_sources)}
    for arm in filter(None, args.joey_arms.split(",")):
        run_dir, wall = train_ours(args, arm, work)
        ours = {**decode_ours(run_dir, bench), "train_wall_s": wall, "summary": run_summary(run_dir)}
        joey = train_joey(args, arm, work, results, bench)
        out[arm] = {"ours": ours, "joey": joey,
                    "ratio_beam5_sent_per_s": ours["beam5"]["sent_per_s"] / joey["beam5"]["sent_per_s"],
                    "ratio_greedy_sent_per_s": ours["greedy"]["sent_per_s"] / joey["greedy"]["sent_per_s"]}
        print(f"{args.minutes:g} min, {arm}: test BLEU (beam 5) ours {ours['beam5']['bleu']:.2f} "
              f"vs JoeyNMT {joey['beam5']['bleu']:.2f} ({joey['train']['updates']} updates, "
              f"{joey['train']['wall_s']:.0f} s wall); trained-model decoding ours/joey: beam5 "
              f"x{out[arm]['ratio_beam5_sent_per_s']:.2f}, greedy x{out[arm]['ratio_greedy_sent_per_s']:.2f}",
              flush=True)
    return out
