"""Rounds 2..N of scripts/benchmark.py: training speed measured again, ours and the peers'
arm by arm, and the ratios of every round."""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

import bench_joey
import bench_onmt
import bench_ours
import bench_peers


def _timed_series(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Every training measurement that later rounds repeat: our rows, JoeyNMT's and its +ftz,
    OpenNMT-py's."""
    joey = results.get("joey", {}).get("arms", {})
    onmt = results.get("onmt", {}).get("arms", {})
    return ([row["train"] for row in results["ours"].values()]
            + [row[key] for row in joey.values() for key in ("train", "train_ftz") if key in row]
            + [row["train"] for row in onmt.values()])


def more_rounds(args: argparse.Namespace, work: Path, results: dict[str, Any],
                variants: list[tuple[str, dict[str, Any]]]) -> None:
    """Rounds 2..N of training speed only, per arm ours (each variant) then JoeyNMT's, then
    OpenNMT-py's, so each pair is measured minutes apart; every tokens/s becomes the median
    over the rounds and ``round_ratios`` (JoeyNMT) and ``onmt.round_ratios`` keep
    ours/theirs of every round."""
    ours, joey = results["ours"], results.get("joey", {}).get("arms", {})
    onmt = results.get("onmt", {}).get("arms", {})
    for train in _timed_series(results):
        train["tgt_tok_per_s_rounds"] = [train["tgt_tok_per_s"]]
    warm = bench_peers.joey_warmup_windows(args)
    for r in range(2, args.rounds + 1):
        for arm in args.arms.split(","):
            line = f"round {r}:"
            for suffix, settings in variants:
                settings = {**settings, "decode": False, "profile": 0}
                row = bench_ours.run_child(arm, settings)
                rate = row["train"]["tgt_tok_per_s"]
                ours[arm + suffix]["train"]["tgt_tok_per_s_rounds"].append(rate)
                ours[arm + suffix].setdefault("bf16_rounds", [ours[arm + suffix]["bf16"]]).append(
                    row["bf16"])
                ours[arm + suffix].setdefault("precision_rounds", [
                    bench_ours.precision_of(ours[arm + suffix])]).append(bench_ours.precision_of(row))
                line += f" ours {arm + suffix} {rate:.0f} ({bench_ours.precision_of(row)}),"
            for key in [k for k in ("train", "train_ftz") if k in joey.get(arm, {})]:
                theirs = bench_joey.train(bench_peers.JOEY_CONFIGS[arm], work,
                                          flush_denormals=key == "train_ftz",
                                          warmup_windows=warm)["tgt_tok_per_s"]
                joey[arm][key]["tgt_tok_per_s_rounds"].append(theirs)
                mine = ours[arm]["train"]["tgt_tok_per_s_rounds"][-1]
                line += (f" JoeyNMT{'+ftz' if key == 'train_ftz' else ''} {theirs:.0f} "
                         f"(x{mine / theirs:.2f}),")
            if arm in onmt:
                theirs = bench_onmt.train(bench_peers.ONMT_CONFIGS[arm], work, args.threads,
                                          warmup_windows=warm)["tgt_tok_per_s"]
                onmt[arm]["train"]["tgt_tok_per_s_rounds"].append(theirs)
                mine = ours[arm]["train"]["tgt_tok_per_s_rounds"][-1]
                line += f" OpenNMT-py {theirs:.0f} (x{mine / theirs:.2f}),"
            print(line.rstrip(",") + " tgt tok/s", flush=True)
    for train in _timed_series(results):
        train["tgt_tok_per_s_round1"] = train["tgt_tok_per_s"]
        train["tgt_tok_per_s"] = statistics.median(train["tgt_tok_per_s_rounds"])
    results["round_ratios"] = {
        arm + ("+ftz" if key == "train_ftz" else ""):
            [o / j for o, j in zip(ours[arm]["train"]["tgt_tok_per_s_rounds"],
                                   joey[arm][key]["tgt_tok_per_s_rounds"], strict=True)]
        for arm in joey if arm in ours for key in ("train", "train_ftz") if key in joey[arm]}
    results["round_ratios"].update({  # our other precisions against the same JoeyNMT rounds
        arm + suffix: [o / j for o, j in zip(ours[arm + suffix]["train"]["tgt_tok_per_s_rounds"],
                                             joey[arm]["train"]["tgt_tok_per_s_rounds"], strict=True)]
        for arm in joey for suffix in ("+fp32", "+bf16", "+bf16grid", "+dnnloss", "+mkl")
        if arm + suffix in ours})
    if onmt:
        results["onmt"]["round_ratios"] = {
            arm: [o / t for o, t in zip(ours[arm]["train"]["tgt_tok_per_s_rounds"],
                                        onmt[arm]["train"]["tgt_tok_per_s_rounds"], strict=True)]
            for arm in onmt if arm in ours}
