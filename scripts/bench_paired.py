"""Paired rounds of scripts/benchmark.py (``--paired-rounds N``): our training and JoeyNMT's
started together and run turn by turn (scripts/bench_turns.py), so each of our timed groups
and JoeyNMT's matching logging window are measured seconds apart, not minutes.

Per round and arm: our main row (the precision and GEMM route ``--precision`` gives) and
JoeyNMT at the configuration of the first round; warm-up as in the other rounds (our
``--warmup`` batches, JoeyNMT's whole logging windows covering them), in as many turns
on both sides. The round's ratio is
our median over ``--repeats`` groups divided by JoeyNMT's median over as many windows,
as in the other rounds; ``pair_ratios`` are the ratios of each group to its window.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import bench_joey
import bench_ours
import bench_peers
import bench_turns

from seq2seq.errors import Seq2SeqError


def pair(arm: str, settings: dict[str, Any], jcfg: dict[str, Any], work: Path, warm: int,
         repeats: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """One paired measurement of ``arm``: (our child's row, JoeyNMT's train_result)."""
    folder = Path(tempfile.mkdtemp(prefix=f"paired_{arm}_", dir=work))
    ours_json = folder / "ours.json"
    cmd, env = bench_ours.child_command(arm, {**settings, "decode": False, "profile": 0,
                                              "warm_turns": warm}, ours_json)
    ours = bench_turns.start(f"ours {arm}", cmd, folder / "ours", env, folder / "ours.log")
    config = bench_joey.write_config(jcfg, folder / f"{jcfg['name']}.yaml")
    joey_log = folder / "joey.log"
    start = time.perf_counter()
    joey = bench_turns.start(f"JoeyNMT {arm}", bench_joey.joey_command(
        ["train", str(config), "--skip-test"]), folder / "joey", bench_joey.joey_env(), joey_log,
        cwd=bench_joey.ROOT)
    try:
        bench_turns.conduct(ours, joey, warm + repeats)
    except bench_turns.ChildFailed as err:
        raise Seq2SeqError(f"paired timing of {arm} failed: {err}") from err
    wall = time.perf_counter() - start
    text = joey_log.read_text(encoding="utf-8")
    theirs = bench_joey.train_result(jcfg, text, wall, config, joey_log, warm)
    if len(theirs["tgt_tok_per_s_repeats"]) != repeats:
        raise Seq2SeqError(f"JoeyNMT logged {len(theirs['tgt_tok_per_s_repeats'])} timed windows "
                           f"for {arm}, expected {repeats}; see {joey_log}")
    return json.loads(ours_json.read_text(encoding="utf-8")), theirs


def measure_paired(args: argparse.Namespace, work: Path, settings: dict[str, Any]
                   ) -> dict[str, Any]:
    """``args.paired_rounds`` paired rounds for every arm both sides have; JoeyNMT's configs
    come from the first round (bench_peers.JOEY_CONFIGS)."""
    warm = bench_peers.joey_warmup_windows(args)
    arms = [a for a in args.arms.split(",") if a in bench_peers.JOEY_CONFIGS]
    out: dict[str, Any] = {"rounds": args.paired_rounds, "arms": {
        arm: {"ours": [], "joey": [], "ratios": [], "pair_ratios": [], "ours_groups": [],
              "joey_windows": [], "bf16": [], "precision": []} for arm in arms}}
    for r in range(1, args.paired_rounds + 1):
        for arm in arms:
            row, theirs = pair(arm, settings, bench_peers.JOEY_CONFIGS[arm], work, warm,
                               args.repeats)
            rec = out["arms"][arm]
            groups, windows = row["train"]["tgt_tok_per_s_repeats"], theirs["tgt_tok_per_s_repeats"]
            rec["ours"].append(row["train"]["tgt_tok_per_s"])
            rec["joey"].append(theirs["tgt_tok_per_s"])
            rec["ratios"].append(rec["ours"][-1] / rec["joey"][-1])
            rec["pair_ratios"].append([o / j for o, j in zip(groups, windows, strict=True)])
            rec["ours_groups"].append(groups)
            rec["joey_windows"].append(windows)
            rec["bf16"].append(row["bf16"])
            rec["precision"].append(row["precision"])  # with auto's probe, so a pick can be read
            print(f"paired round {r}: {arm} ours {rec['ours'][-1]:.0f} "
                  f"({bench_ours.precision_of(row)}), JoeyNMT {rec['joey'][-1]:.0f}: "
                  f"x{rec['ratios'][-1]:.2f}; pairs " + ", ".join(
                      f"x{x:.2f}" for x in rec["pair_ratios"][-1]), flush=True)
    for rec in out["arms"].values():
        rec["median_ratio"] = statistics.median(rec["ratios"])
    return out
