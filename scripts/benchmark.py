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

import bench_joey
import bench_onmt
import bench_ours
import bench_paired
import bench_peers
import bench_rounds
import torch

from seq2seq import contention
from seq2seq.errors import ConfigError, Seq2SeqError
from seq2seq.model import gemm
from seq2seq.runtime import cpu_description


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arms", default="none,bahdanau,luong", help="our attention arms, comma-separated")
    p.add_argument("--joey-arms", default="bahdanau,luong",
                   help="JoeyNMT attentions to run ('' = none); skipped when .venv-joey is missing")
    p.add_argument("--no-joey", action="store_true", help="skip JoeyNMT")
    p.add_argument("--onmt-arms", default="",
                   help="OpenNMT-py 3.5.1 attentions to run, e.g. bahdanau,luong (mlp, general); "
                        "'' = none (default); skipped when .venv-onmt is missing")
    p.add_argument("--precision", default="fp32", choices=("fp32", "auto", "bf16_loss", "bf16_gemm"),
                   help="our main rows' train.precision: auto times fp32, bf16_loss, bf16_gemm and bf16 "
                        "passes on the first batch and keeps what is clearly faster, as "
                        "seq2seq-train does (each row records the choice; ratios are of the "
                        "chosen precision)")
    p.add_argument("--bf16", action="store_true", help="also run our arms under CPU bf16 autocast")
    p.add_argument("--bf16-loss", action="store_true",
                   help="also time our training with only the output layer and loss in bf16 "
                        "(train.precision=bf16_loss; rows ARM+bf16loss, training only, every round)")
    p.add_argument("--fp32-gemm", default="auto", choices=gemm.ROUTES,
                   help="our main rows' route for fp32 GEMMs (seq2seq.model.gemm): auto measures "
                        "MKL against oneDNN (and its grid) as seq2seq-train does; grid, onednn "
                        "or default forces one")
    p.add_argument("--dnn-loss", action="store_true",
                   help="also time our training with only the fused loss's fp32 GEMMs through "
                        "oneDNN (route onednn; rows ARM+dnnloss, training only, every round)")
    p.add_argument("--bf16-grid", action="store_true",
                   help="also time our training in bf16 with its products on the grid "
                        "(SEQ2SEQ_BF16_GEMM=grid; rows ARM+bf16grid, training only, every round)")
    p.add_argument("--mkl", action="store_true",
                   help="also time our training with fp32 GEMMs on the default route (MKL; rows "
                        "'ARM+mkl', training only), in every round")
    p.add_argument("--with-denormals", action="store_true",
                   help="also time our training with train.flush_denormals=false (rows "
                        "'ARM-denormals', training only)")
    p.add_argument("--joey-flush-denormals", action="store_true",
                   help="also time JoeyNMT's training with denormals flushed in every thread "
                        "(what the same CPU setting gives it; rows 'ARM+ftz'), in every round")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                   help="where both toolkits train and decode (cuda: JoeyNMT with use_cuda, in fp32)")
    p.add_argument("--threads", type=int, default=2, help="torch threads for every process")
    p.add_argument("--batch-tokens", type=int, default=None,
                   help="real target tokens per batch (default 3000, or --model-profile's)")
    p.add_argument("--model-profile", default=None, metavar="NAME",
                   help="our model at configs/profile/NAME.yaml's sizes (e.g. paper: 620/1000, "
                        "maxout) and its train.batch_tokens; ours only (use with --no-joey)")
    p.add_argument("--warmup", type=int, default=3,
                   help="untimed warm-up batches (ours; JoeyNMT's untimed updates are this, "
                        "rounded up to whole --per-repeat windows, at least one window). The "
                        "first ~30 steps of training are the slowest (denormal gradients): "
                        "--warmup 100 times the steady state")
    p.add_argument("--repeats", type=int, default=5, help="timed repeats; the median is reported")
    p.add_argument("--per-repeat", type=int, default=20, help="batches per repeat")
    p.add_argument("--rounds", type=int, default=1,
                   help="measure training speed this many times, ours and JoeyNMT's alternating "
                        "arm by arm; tokens/s and ratios are the medians over rounds (on a "
                        "shared machine the speed drifts by tens of percent within minutes)")
    p.add_argument("--paired-rounds", type=int, default=0, metavar="N",
                   help="after the rounds, N more of training speed where our main row and "
                        "JoeyNMT run together, taking turns group by group (bench_paired.py): "
                        "each pair measured seconds apart")
    p.add_argument("--decode-sentences", type=int, default=500,
                   help="test sentences decoded (every k-th of the split); 0 = the whole split")
    p.add_argument("--matmul-size", type=int, default=2048, help="n of the n x n x n ceiling matmul")
    p.add_argument("--minutes", type=float, default=0.0,
                   help="also train both toolkits this many minutes per JoeyNMT arm, then "
                        "compare test BLEU (beam 5) and decoding speed of the trained models")
    p.add_argument("--mark-minutes", type=float, default=None, metavar="K",
                   help="with --minutes M: read test BLEU and decoding speed at K, 2K, ... "
                        "minutes up to M (default 5; 0 = at M only)")
    p.add_argument("--mark-sentences", type=int, default=None, metavar="N",
                   help="test sentences decoded at each mark (every k-th of the split; 0 = the "
                        "whole split; default --decode-sentences)")
    p.add_argument("--full-test-at-end", action="store_true",
                   help="with --minutes: also decode the whole test split at the last mark")
    p.add_argument("--ours-run", action="append", default=[], metavar="ARM=DIR",
                   help="a trained run folder of ours for ARM: used for decoding speed and, "
                        "with --minutes, instead of training ours")
    p.add_argument("--data", action="append", default=[], metavar="OVERRIDE",
                   help="Hydra data overrides (default: the Bible corpus, data=bible_es_en)")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="after timing, profile N training batches per arm with torch.profiler "
                        "and print the top ops by self CPU time")
    p.add_argument("--work", default="runs/benchmark", help="folder for JoeyNMT files and our runs")
    p.add_argument("--json", default=None, help="write all results to this JSON file")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: 1 warm-up, 2 repeats of 1 batch, 10 sentences, 1024 matmul")
    if p.parse_known_args(argv)[0].quick:  # quick changes the defaults; explicit options win
        p.set_defaults(warmup=1, repeats=2, per_repeat=1, decode_sentences=10, matmul_size=1024)
    args = p.parse_args(argv)
    apply_model_profile(args)
    check_args(args)
    return args


def apply_model_profile(args: argparse.Namespace) -> None:
    """--model-profile NAME: the profile's ``model`` keys become data overrides (before the
    user's own --data), and its train.batch_tokens the batch size unless --batch-tokens is
    given; without it the batch is 3,000 target tokens."""
    from omegaconf import OmegaConf

    from seq2seq.config import CONFIG_DIR

    batch_tokens = 3000
    if args.model_profile:
        path = Path(CONFIG_DIR) / "profile" / f"{args.model_profile}.yaml"
        if not path.is_file():
            names = sorted(f.stem for f in path.parent.glob("*.yaml"))
            raise ConfigError(f"--model-profile {args.model_profile!r}: no {path}; use one of "
                              f"{', '.join(names)}")
        profile = OmegaConf.load(path)
        model = OmegaConf.to_container(profile.get("model", {}))
        args.data = [*(f"model.{k}={str(v).lower() if isinstance(v, bool) else v}"
                       for k, v in model.items()), *args.data]
        batch_tokens = int(profile.get("train", {}).get("batch_tokens", batch_tokens))
    if args.batch_tokens is None:
        args.batch_tokens = batch_tokens


def check_args(args: argparse.Namespace) -> None:
    """Bad options fail here, in one line, before anything slow runs."""
    for arm in args.arms.split(","):
        if arm not in bench_ours.ARMS:
            raise ConfigError(f"--arms: unknown arm {arm!r}; choose from {','.join(bench_ours.ARMS)}")
    for arm in filter(None, args.joey_arms.split(",")):
        if arm not in ("bahdanau", "luong"):
            raise ConfigError(f"--joey-arms: JoeyNMT has no {arm!r} attention; use bahdanau,luong")
    for arm in filter(None, args.onmt_arms.split(",")):
        if arm not in bench_onmt.ATTENTIONS:
            raise ConfigError(f"--onmt-arms: no OpenNMT-py arm {arm!r}; use bahdanau,luong")
    for name in ("threads", "batch_tokens", "repeats", "per_repeat", "matmul_size", "rounds"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be a positive integer")
    if min(args.warmup, args.decode_sentences, args.minutes, args.profile, args.paired_rounds) < 0:
        raise ConfigError("--warmup, --decode-sentences, --minutes, --profile and --paired-rounds "
                          "must be >= 0")
    if args.paired_rounds and (args.no_joey or not args.joey_arms):
        raise ConfigError("--paired-rounds pairs our rows with JoeyNMT's: drop --no-joey and give "
                          "--joey-arms")
    if min(args.mark_minutes or 0, args.mark_sentences or 0) < 0:
        raise ConfigError("--mark-minutes and --mark-sentences must be >= 0")
    ours_runs(args.ours_run)
    if args.device == "cuda" and (args.minutes or args.onmt_arms):  # their runs are CPU-only
        raise ConfigError("--minutes and --onmt-arms run on the CPU only: drop --device cuda")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA device is visible to torch "
                          f"{torch.__version__}; run on a GPU machine or drop --device")


def ours_runs(specs: list[str]) -> dict[str, str]:
    runs = {}
    for spec in specs:
        arm, sep, folder = spec.partition("=")
        if not sep or arm not in bench_ours.ARMS or not Path(folder).is_dir():
            raise ConfigError(f"--ours-run {spec!r}: give ARM=DIR with ARM in {bench_ours.ARMS} "
                              "and DIR an existing run folder")
        runs[arm] = folder
    return runs


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
            rates["fp32_onednn_flops_per_s"] = bench_ours.matmul_rate(args.matmul_size, torch.float32)
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
    bf16_n = rates.get("sizes", {}).get("bfloat16", args.matmul_size)
    print(f"matmul {args.matmul_size}^3: fp32 {rates['fp32_flops_per_s'] / 1e9:.1f} GFLOP/s"
          + (f" (through oneDNN {rates['fp32_onednn_flops_per_s'] / 1e9:.1f})"
             if "fp32_onednn_flops_per_s" in rates else "") + ", "
          f"bf16 {rates['bf16_flops_per_s'] / 1e9:.1f} GFLOP/s"
          + (f" (at {bf16_n}^3: slow here)" if bf16_n != args.matmul_size else "")
          + (" (GPU)" if args.device == "cuda" else f" ({args.threads} threads)"))
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
