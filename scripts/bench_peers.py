"""The peers' side of scripts/benchmark.py: JoeyNMT 2.3.0 and OpenNMT-py 3.5.1 measured per
arm (training tokens/s, greedy and beam-5 decoding) on the files we give both, and our
speed divided by theirs."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import bench_joey
import bench_onmt
import bench_ours


def measure_joey(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """JoeyNMT training and decoding speed per arm, plus the shared files and batch sizing."""
    from seq2seq.corpus import load_corpus

    cfg = bench_ours.bench_config(args.data, "bahdanau", args.batch_tokens, "fp32", args.threads,
                                  device=args.device)
    bench = bench_ours.load_bench_data(cfg, args.decode_sentences)
    files = bench_joey.export_data(bench, load_corpus(cfg.data), cfg.data.src_lang,
                                   cfg.data.tgt_lang, work / "joey_data")
    d = bench.data
    batch = bench_joey.match_batch_size(d.train.src_lens[d.train_idx], d.train.tgt_lens[d.train_idx],
                                        args.batch_tokens)
    out: dict[str, Any] = {"batch": batch, "files": files, "arms": {}, "mismatches": bench_joey.MISMATCHES}
    warm = joey_warmup_windows(args)
    updates = (warm + args.repeats) * args.per_repeat
    for arm in filter(None, args.joey_arms.split(",")):
        jcfg = bench_joey.joey_config(arm, files, (cfg.data.src_lang, cfg.data.tgt_lang),
                                      work / f"joey_{arm}", batch["batch_size"], updates, args.per_repeat,
                                      use_cuda=args.device == "cuda")
        JOEY_CONFIGS[arm] = jcfg
        row = {"train": bench_joey.train(jcfg, work, warmup_windows=warm)}
        if args.joey_flush_denormals:
            row["train_ftz"] = bench_joey.train(jcfg, work, flush_denormals=True, warmup_windows=warm)
            print(f"joey  {arm + '+ftz':14s} {row['train_ftz']['tgt_tok_per_s']:9.0f}", flush=True)
        for beam, key in ((1, "greedy"), (5, "beam5")):
            res = bench_joey.test(jcfg, work, beam)
            res.pop("hypotheses")
            row[key] = res
        row["peak_rss_mib"] = max(row["train"]["peak_rss_mib"], row["beam5"]["peak_rss_mib"])
        out["arms"][arm] = row
        t = row["train"]
        print(f"joey  {arm:14s} {t['tgt_tok_per_s']:9.0f} {'-':>9s} {row['greedy']['sent_per_s']:8.1f} "
              f"{row['beam5']['sent_per_s']:8.1f} {row['peak_rss_mib']:8.0f}", flush=True)
    return out


def joey_warmup_windows(args: argparse.Namespace) -> int:
    """JoeyNMT's untimed logging windows: our --warmup batches in whole windows, at least one."""
    return max(1, -(-args.warmup // args.per_repeat))


# JoeyNMT's config per arm from measure_joey, reused by later rounds
JOEY_CONFIGS: dict[str, dict[str, Any]] = {}


def measure_onmt(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """OpenNMT-py training and decoding speed per arm, plus the shared files and batch sizing."""
    cfg = bench_ours.bench_config(args.data, "bahdanau", args.batch_tokens, "fp32", args.threads)
    bench = bench_ours.load_bench_data(cfg, args.decode_sentences)
    files = bench_onmt.export_data(bench, work / "onmt_data")
    d = bench.data
    keys = [d.train.src(int(i)).tobytes() for i in d.train_idx]  # it skips repeated sources
    batch = bench_onmt.match_batch_size(d.train.src_lens[d.train_idx], d.train.tgt_lens[d.train_idx],
                                        args.batch_tokens, keys)
    out: dict[str, Any] = {"batch": batch, "files": files, "arms": {},
                           "mismatches": bench_onmt.MISMATCHES}
    warm = joey_warmup_windows(args)  # the same rule: whole logging windows, at least one
    updates = (warm + args.repeats) * args.per_repeat
    for arm in filter(None, args.onmt_arms.split(",")):
        ocfg = bench_onmt.onmt_config(arm, files, work / f"onmt_{arm}", batch["batch_size"],
                                      updates, args.per_repeat)
        ONMT_CONFIGS[arm] = ocfg
        row = {"train": bench_onmt.train(ocfg, work, args.threads, warmup_windows=warm)}
        for beam, key in ((1, "greedy"), (5, "beam5")):
            res = bench_onmt.test(ocfg, files, work, beam, args.threads)
            res.pop("hypotheses")
            row[key] = res
        row["params"] = row["train"]["params"]
        row["peak_rss_mib"] = max(row["train"]["peak_rss_mib"], row["beam5"]["peak_rss_mib"])
        out["arms"][arm] = row
        t = row["train"]
        print(f"onmt  {arm:14s} {t['tgt_tok_per_s']:9.0f} {t['src_tok_per_s']:9.0f} "
              f"{row['greedy']['sent_per_s']:8.1f} {row['beam5']['sent_per_s']:8.1f} "
              f"{row['peak_rss_mib']:8.0f}", flush=True)
    return out


# OpenNMT-py's config per arm from measure_onmt, reused by later rounds
ONMT_CONFIGS: dict[str, dict[str, Any]] = {}


def ratios(ours: dict[str, Any], joey: dict[str, Any]) -> dict[str, dict[str, float]]:
    """ours / JoeyNMT (or OpenNMT-py: the same shape) per arm for training tokens/s and
    decoding sentences/s."""
    out = {}
    for arm, j in joey.get("arms", {}).items():
        o = ours.get(arm)
        if o is None:
            continue
        out[arm] = {"train_tgt_tok_per_s": o["train"]["tgt_tok_per_s"] / j["train"]["tgt_tok_per_s"]}
        for suffix in ("+fp32", "+bf16"):  # our other precisions' rows, when measured
            if arm + suffix in ours:
                out[arm][f"train_tgt_tok_per_s{suffix}"] = (
                    ours[arm + suffix]["train"]["tgt_tok_per_s"] / j["train"]["tgt_tok_per_s"])
        if "train_ftz" in j:  # against JoeyNMT with denormals flushed too
            out[arm]["train_tgt_tok_per_s_vs_ftz"] = (o["train"]["tgt_tok_per_s"]
                                                      / j["train_ftz"]["tgt_tok_per_s"])
        for key in ("greedy", "beam5"):
            if key in o:
                out[arm][f"{key}_sent_per_s"] = o[key]["sent_per_s"] / j[key]["sent_per_s"]
    return out


def print_ratios(title: str, table: dict[str, dict[str, float]]) -> None:
    for arm, r in table.items():
        print(f"{title} {arm}: " + ", ".join(f"{k} x{v:.2f}" for k, v in r.items()))
