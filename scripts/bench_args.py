"""The options of scripts/benchmark.py: parsed, a --model-profile applied, and checked
before anything slow runs (one line per bad option)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

import bench_onmt
import bench_ours
import torch

from seq2seq.errors import ConfigError
from seq2seq.model import gemm

if TYPE_CHECKING:
    from omegaconf import DictConfig


def parse_args(argv: list[str] | None = None, doc: str = "") -> argparse.Namespace:
    """benchmark.py's options from ``argv``; ``doc`` (its docstring) gives the description."""
    p = argparse.ArgumentParser(description=(doc or __doc__).splitlines()[0],
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

    batch_tokens = 3000
    if args.model_profile:
        profile = load_profile(args.model_profile, "--model-profile")
        model = OmegaConf.to_container(profile.get("model", {}))
        args.data = [*(f"model.{k}={str(v).lower() if isinstance(v, bool) else v}"
                       for k, v in model.items()), *args.data]
        batch_tokens = int(profile.get("train", {}).get("batch_tokens", batch_tokens))
    if args.batch_tokens is None:
        args.batch_tokens = batch_tokens


def load_profile(name: str, option: str) -> DictConfig:
    """configs/profile/<name>.yaml with the profiles its defaults list names merged under it
    (configs/profile/long.yaml is quick's with its own keys on top), as Hydra composes it."""
    from omegaconf import OmegaConf

    from seq2seq.config import CONFIG_DIR, group_options

    path = Path(CONFIG_DIR) / "profile" / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(f"{option} {name!r}: no {path}; use one of "
                          f"{', '.join(group_options('profile'))}")
    profile = OmegaConf.load(path)
    parents = [load_profile(d, f"{path}'s defaults:") for d in profile.pop("defaults", [])
               if d != "_self_"]
    return OmegaConf.merge(*parents, profile)


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
