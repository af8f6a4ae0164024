"""Speed on the Bible corpus, ours vs JoeyNMT 2.3.0 (and OpenNMT-py 3.5.1) side by side (issue 6).

    PYTHONPATH=. .venv/bin/python scripts/benchmark.py --json runs/benchmark/results.json
    ... --quick                      # a 1-2 minute smoke run (few batches, 10 sentences)
    ... --precision auto             # our rows in the precision seq2seq-train's auto picks
    ... --bf16                       # also our arms under CPU bf16 autocast (train.precision=bf16)
    ... --bf16-loss                  # also our training with only the output layer + loss in
                                     # bf16 (train.precision=bf16_loss)
    ... --minutes 16                 # also: test BLEU along 16 minutes of training each,
                                     # read every --mark-minutes (5); plot it with
                                     # scripts/plot_bleu_minutes.py
    ... --onmt-arms bahdanau,luong   # also OpenNMT-py 3.5.1 (`make onmt-env`), round by round
    ... --paired-rounds 3            # also 3 rounds with ours and JoeyNMT taking turns
                                     # group by group (scripts/bench_paired.py)

Configuration (both toolkits): GRU, embeddings 256, hidden 256, bidirectional encoder,
one layer, dropout 0.2, our 8k SentencePiece models per side, our length-filtered
training pairs, Adam 1e-3 constant, clip 1.0, ~3,000 real target tokens per batch.

Ours, per arm, each in a child process (its peak RSS is its own): train.py's
train_step over real training batches, warm-up batches excluded, the median of
`--repeats` groups of `--per-repeat` batches; greedy and beam-5 sentences/s on a
fixed subset of the test split (every k-th sentence); FLOPs per target token of one
training step (FlopCounterMode, fwd+bwd) and the achieved fraction of a large
matmul's FLOP/s measured in this run. JoeyNMT (`make joeynmt-env`): `joeynmt train`
for (w + repeats) x per-repeat updates logging every per-repeat updates (its
"Tokens per Sec" lines, the first w dropped: w windows cover our --warmup batches, at
least one), then `joeynmt test` with beam 5 and 1
(its "Generation took" time: search only, no model/data loading). Decoding speeds of
barely trained models are not comparable (their outputs run to each toolkit's length
cap); `--minutes` (or `--ours-run`) gives both sides trained models. OpenNMT-py
(`make onmt-env`, `--onmt-arms`): `onmt_train` on the same pieces for the same updates,
its "tok/s" report lines the same way, then `onmt_translate` with beam 5 and 1 (its
"Average translation time"); see scripts/bench_onmt.py for what differs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import bench_args
import bench_joey
import bench_onmt
import bench_ours
import bench_paired
import bench_peers
import bench_rounds
import torch
from bench_args import ours_runs

from seq2seq import contention
from seq2seq.errors import Seq2SeqError
from seq2seq.model import gemm
from seq2seq.runtime import cpu_description


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The options (scripts/bench_args.py), checked."""
    return bench_args.parse_args(argv, __doc__)


def settings_of(args: argparse.Namespace, precision: str, flush_denormals: bool = True
                ) -> dict[str, Any]:
    return {"data_overrides": args.data, "batch_tokens": args.batch_tokens, "precision": precision,
            "flush_denormals": flush_denormals,
            "threads": args.threads, "warmup": args.warmup, "repeats": args.repeats,
            "per_repeat": args.per_repeat, "decode_sentences": args.decode_sentences,
            "decode": True, "decode_runs": ours_runs(args.ours_run), "profile": args.profile,
            "fp32_gemm": args.fp32_gemm, "device": args.device}


def ceiling(args: argparse.Namespace) -> dict[str, float]:
    torch.set_num_threads(args.threads)
    sizes: dict[str, int] = {}
    rates = {"fp32_flops_per_s": bench_ours.matmul_rate(args.matmul_size, torch.float32, sizes=sizes,
                                                        device=args.device),
             "bf16_flops_per_s": bench_ours.matmul_rate(args.matmul_size, torch.bfloat16, sizes=sizes,
                                                        device=args.device),
             "n": args.matmul_size, "sizes": sizes, "threads": args.threads, "device": args.device}
    if gemm.available() and args.device == "cpu":  # the fp32 ceiling of rows whose GEMMs went through oneDNN
        with gemm.using(gemm.Choice(True, "")), gemm.recurring():  # using() alone routes nothing
            onednn_size: dict[str, int] = {}
            rates["fp32_onednn_flops_per_s"] = bench_ours.matmul_rate(args.matmul_size, torch.float32,
                                                                      sizes=onednn_size)
            sizes["float32_onednn"] = onednn_size["float32"]
    return rates


ONEDNN_ROUTES = ("onednn", "grid")  # fp32 routes whose GEMMs (all or most) run in oneDNN


def ceiling_of(row: dict[str, Any], rates: dict[str, float]) -> float:
    """The matmul rate of the precision and GEMM route ``row`` trained in (bf16_loss and
    bf16_gemm: the fp32 route's, though their large products run at bf16's)."""
    if row["bf16"]:
        return rates["bf16_flops_per_s"]
    if row.get("fp32_gemm") in ONEDNN_ROUTES and "fp32_onednn_flops_per_s" in rates:
        return rates["fp32_onednn_flops_per_s"]
    return rates["fp32_flops_per_s"]


def rates_line(args: argparse.Namespace, rates: dict[str, Any]) -> str:
    """The matmul rates as printed, naming any dtype measured at a smaller size than asked."""
    def shrunk(dtype: str) -> str:
        n = rates.get("sizes", {}).get(dtype, args.matmul_size)
        return f" (at {n}^3: slow here)" if n != args.matmul_size else ""
    return (f"matmul {args.matmul_size}^3: fp32 {rates['fp32_flops_per_s'] / 1e9:.1f} GFLOP/s"
            + shrunk("float32")
            + (f" (through oneDNN {rates['fp32_onednn_flops_per_s'] / 1e9:.1f}"
               + shrunk("float32_onednn") + ")" if "fp32_onednn_flops_per_s" in rates else "")
            + ", "
            f"bf16 {rates['bf16_flops_per_s'] / 1e9:.1f} GFLOP/s" + shrunk("bfloat16")
            + (" (GPU)" if args.device == "cuda" else f" ({args.threads} threads)"))


def variants(args: argparse.Namespace) -> list[tuple[str, dict[str, Any]]]:
    """(row-name suffix, settings) of each configuration of ours to measure per arm."""
    out = [("", settings_of(args, args.precision))]
    if args.precision == "auto":  # what fp32 gives in the same run, training only
        out.append(("+fp32", {**settings_of(args, "fp32"), "decode": False, "profile": 0}))
    if args.bf16:
        out.append(("+bf16", settings_of(args, "bf16")))
    if args.bf16_loss:
        out.append(("+bf16loss", {**settings_of(args, "bf16_loss"), "decode": False, "profile": 0}))
    if args.dnn_loss:
        out.append(("+dnnloss", {**settings_of(args, "fp32"), "fp32_gemm": "onednn",
                                 "decode": False, "profile": 0}))
    if args.bf16_grid:
        out.append(("+bf16grid", {**settings_of(args, "bf16"), "bf16_gemm": "grid",
                                  "decode": False, "profile": 0}))
    if args.mkl:
        out.append(("+mkl", {**settings_of(args, "fp32"), "fp32_gemm": "default", "decode": False,
                             "profile": 0}))
    if args.with_denormals:
        out.append(("-denormals", {**settings_of(args, "fp32", flush_denormals=False),
                                   "decode": False, "profile": 0}))
    return out


def measure_ours(args: argparse.Namespace, rates: dict[str, float]) -> dict[str, Any]:
    rows = {}
    for suffix, settings in variants(args):
        for arm in args.arms.split(","):
            row = bench_ours.run_child(arm, settings)
            rate = ceiling_of(row, rates)
            row["achieved_flops_per_s"] = row["flops_per_tgt_token"] * row["train"]["tgt_tok_per_s"]
            row["fraction_of_matmul"] = row["achieved_flops_per_s"] / rate
            rows[arm + suffix] = row
            print_row(arm + suffix, row)
    return rows


def print_row(name: str, row: dict[str, Any]) -> None:
    t = row["train"]
    dec = (f"{row['greedy']['sent_per_s']:8.1f} {row['beam5']['sent_per_s']:8.1f}"
           if "greedy" in row else f"{'-':>8s} {'-':>8s}")
    print(f"ours  {name:14s} {t['tgt_tok_per_s']:9.0f} {t['src_tok_per_s']:9.0f} {dec} "
          f"{row['peak_rss_mib']:8.0f} {row['flops_per_tgt_token'] / 1e6:9.1f} "
          f"{100 * row['fraction_of_matmul']:6.1f}% {precision_label(row):>9s}",
          flush=True)
    shares = t.get("cpu_share_repeats", [])
    if "device" not in row and any(s < contention.BUSY_BELOW for s in shares):  # a GPU row has one
        print(f"      ^ timed on busy cores: CPU share per repeat "
              f"{', '.join(f'{s:.2f}' for s in shares)} (another process took a core)", flush=True)


HEADER = (f"{'':5s} {'arm':14s} {'tgt tok/s':>9s} {'src tok/s':>9s} {'greedy/s':>8s} "
          f"{'beam5/s':>8s} {'peak MiB':>8s} {'MFLOP/tok':>9s} {'of mm':>7s} {'prec':>9s}")


def precision_label(row: dict[str, Any]) -> str:
    """bf16 (bf16+grid: its products on the grid), fp32 (MKL GEMMs), fp32+dnn (the loss
    chunks' GEMMs through oneDNN) or fp32+grid (those and the rest on oneDNN's grid,
    seq2seq.model.gemm_grid)."""
    if row["bf16"]:
        return "bf16+grid" if row.get("bf16_gemm") == "grid" else "bf16"
    if row.get("loss_bf16"):  # bf16_loss or bf16_gemm
        return bench_ours.precision_of(row).replace("_", "")
    return {"onednn": "fp32+dnn", "grid": "fp32+grid"}.get(row.get("fp32_gemm", ""), "fp32")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark with command-line ``argv``; returns (and optionally writes) the results."""
    args = parse_args(argv)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"args": vars(args), "torch": torch.__version__,
                               "cpu": cpu_description(), "load_average": os.getloadavg()}
    cpu = results["cpu"]
    print(f"CPU {cpu['model']} (family {cpu.get('family', '?')} model {cpu.get('model_number', '?')}), "
          f"{' '.join(cpu['flags'])}; torch kernels {cpu['kernels']}"
          + (f"; instruction-set caps: {cpu['isa_caps']}" if cpu["isa_caps"] else "")
          + (f"; library settings: {cpu['library_settings']}" if cpu["library_settings"] else ""))
    if args.device == "cuda":
        results["gpu"] = gpu = bench_ours.gpu_description(torch.device("cuda"))
        print(f"GPU {gpu['name']} (capability {gpu['capability']}, {gpu['memory_gib']} GiB, "
              f"{gpu['multiprocessors']} SMs), CUDA {gpu['cuda']}, cuDNN {gpu['cudnn']}, "
              f"torch {gpu['torch']}")
    results["matmul"] = rates = ceiling(args)
    print(rates_line(args, rates))
    print(HEADER)
    results["ours"] = measure_ours(args, rates)
    for name, row in results["ours"].items():
        if "profile" in row:
            print(f"\nprofile of {args.profile} training batches, {name}:\n{row['profile']}")
    use_joey = not args.no_joey and args.joey_arms
    if use_joey and not bench_joey.joey_available():
        print("JoeyNMT skipped: .venv-joey is missing (run `make joeynmt-env`)"
              + ("; so is the --minutes comparison" if args.minutes else ""))
        use_joey = False
    if use_joey:
        results["joey"] = bench_peers.measure_joey(args, work)
    use_onmt = bool(args.onmt_arms)
    if use_onmt and not bench_onmt.onmt_available():
        print("OpenNMT-py skipped: .venv-onmt is missing (run `make onmt-env`)")
        use_onmt = False
    if use_onmt:
        results["onmt"] = bench_peers.measure_onmt(args, work)
    if args.rounds > 1:
        bench_rounds.more_rounds(args, work, results, variants(args))
        print(f"training tgt tok/s, median of {args.rounds} rounds: " + ", ".join(
            f"{side} {arm} {row['train']['tgt_tok_per_s']:.0f}"
            for side, rows in (("ours", results["ours"]),
                               ("JoeyNMT", results.get("joey", {}).get("arms", {})),
                               ("OpenNMT-py", results.get("onmt", {}).get("arms", {})))
            for arm, row in rows.items())
            + "".join(f", JoeyNMT {arm}+ftz {row['train_ftz']['tgt_tok_per_s']:.0f}"
                      for arm, row in results.get("joey", {}).get("arms", {}).items()
                      if "train_ftz" in row))
        for arm, rs in results.get("round_ratios", {}).items():
            print(f"ours/joey {arm} training, per round: " + ", ".join(f"x{r:.2f}" for r in rs))
        for arm, rs in results.get("onmt", {}).get("round_ratios", {}).items():
            print(f"ours/onmt {arm} training, per round: " + ", ".join(f"x{r:.2f}" for r in rs))
    if use_joey and args.paired_rounds:
        results["paired"] = bench_paired.measure_paired(args, work, settings_of(args, args.precision))
        for arm, rec in results["paired"]["arms"].items():
            print(f"ours/joey {arm} training, paired rounds: "
                  + ", ".join(f"x{r:.2f}" for r in rec["ratios"]))
    if use_joey:
        results["ratios"] = bench_peers.ratios(results["ours"], results["joey"])
        bench_peers.print_ratios("ours/joey", results["ratios"])
        if not args.ours_run:
            print("(decoding ratios above: barely trained models on both sides, whose outputs "
                  "run to different length caps; --minutes compares trained models)")
        b = results["joey"]["batch"]
        print(f"JoeyNMT batch_size {b['batch_size']} (padded positions): {b['tgt_tokens']:.0f} real "
              f"target tokens per batch, padding {100 * b['padding_fraction']:.0f}%")
        if args.minutes:
            from bench_bleu import equal_time_bleu

            results["equal_time"] = equal_time_bleu(args, work, results)
        print("Not matched exactly:\n" + "\n".join(f"- {m}" for m in bench_joey.MISMATCHES))
    if use_onmt:
        results["onmt"]["ratios"] = bench_peers.ratios(results["ours"], results["onmt"])
        bench_peers.print_ratios("ours/onmt", results["onmt"]["ratios"])
        b = results["onmt"]["batch"]
        print(f"OpenNMT-py batch_size {b['batch_size']} (sentences x longest of max(src, tgt+2)): "
              f"{b['tgt_tokens']:.0f} real target tokens per batch (simulated), padding "
              f"{100 * b['padding_fraction']:.0f}%")
        print("OpenNMT-py, not matched exactly:\n"
              + "\n".join(f"- {m}" for m in bench_onmt.MISMATCHES))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(results, indent=2), encoding="utf-8")
        print(f"wrote {args.json}")
    return results


if __name__ == "__main__":
    try:
        main()
    except Seq2SeqError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
