"""Set-up: everything a training run does before its first step.

:func:`setup` claims the run folder (:mod:`seq2seq.runs.folder`), checks the config,
loads the corpus and the tokenizers, builds the model and the optimizer, and on a
resume restores them (and the RNG and the loop counters) from the checkpoint after
checking it fits: same model, data and tokenizer settings, same tokenizer files and
corpus build. It fails in the first seconds on a bad config, a missing corpus or a
mismatched checkpoint, before anything slow happens. The loop is :mod:`seq2seq.training.loop`.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from seq2seq import native, precision, runtime
from seq2seq.corpus import batching, corpus_dir, load_corpus
from seq2seq.corpus.tokenizer import Tokenizers, load_or_train
from seq2seq.errors import ConfigError
from seq2seq.model import build_model, count_parameters
from seq2seq.runs import folder as runfolder
from seq2seq.runs.checkpoint import (
    TOKENIZER_DIR,
    check_identity,
    check_same_setup,
    drop_kept,
    load_checkpoint,
    restore_rng_state,
    run_identity,
)
from seq2seq.runs.log import RunLog
from seq2seq.runtime import resolve_device, seed_everything
from seq2seq.training import distributed
from seq2seq.training.optim import build_optimizer


@dataclass
class Progress:
    """Loop counters; saved in every checkpoint so a resumed run continues exactly."""

    step: int = 0
    epoch: int = 0
    batch_index: int = 0  # batches of `epoch` already trained on
    best_score: float = -math.inf  # dev BLEU, or minus dev loss when BLEU is off
    best_step: int = 0
    best_bleu: float = math.nan
    bad_validations: int = 0
    last_valid_step: int = -1
    elapsed_s: float = 0.0  # wall time over all restarts
    train_s: float = 0.0  # time inside training steps only (for tokens/s)
    tgt_tokens: int = 0
    src_tokens: int = 0
    stop_reason: str = ""
    precision: str = ""  # fp32 | bf16 | bf16_loss | bf16_gemm as resolved at the start (auto measures)
    fp32_gemm: str = ""  # grid | onednn | default: the route for fp32 GEMMs (seq2seq.model.gemm), kept on resume
    bf16_gemm: str = ""  # grid | as_is in bf16 training, else "": the same for bf16 products
    # the C kernels' timed paths (seq2seq.native.choices): they round differently from
    # torch's ops, so a resumed run takes its start's paths, not a new timing's
    native_choices: dict[str, str] = field(default_factory=dict)


@dataclass
class Run:
    """Everything the loop works with, built once by :func:`setup`."""

    cfg: DictConfig
    log: RunLog
    device: torch.device
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    tokenizers: Any
    data: batching.TrainingData
    progress: Progress = field(default_factory=Progress)
    net: torch.nn.Module | None = None  # what train_step calls: the DDP wrapper under torchrun
    identity: dict[str, Any] = field(default_factory=dict)  # tokenizers + corpus (checkpoint.run_identity)
    lock: Any = None  # rank 0: the run folder's runfolder.FolderLock
    stop: Any = None  # preempt.StopSignals while the loop runs
    saved_at: float = field(default_factory=time.perf_counter)  # last checkpoint write (clock)
    rank_rng_restored: bool = False  # a resume gave this rank its own saved RNG state
    bf16: bool = False  # bf16 autocast, from train.precision (resolved once, kept on resume)
    loss_bf16: bool = False  # train.precision=bf16_loss: only the fused loss's products in bf16
    gemm_bf16: bool = False  # train.precision=bf16_gemm: those and the other large products
    native_logged: bool = False  # the C kernels' choices went to the log (after a validation)
    busy_cores: bool = False  # the last log window ran on cores another process took (warned)


def check_train_config(t: DictConfig) -> None:
    """Loop settings that :func:`seq2seq.config.validate` leaves to the loop."""
    for key in ("valid_every", "log_every", "max_epochs"):
        if t[key] < 1:
            raise ConfigError(f"train.{key}={t[key]} must be a positive integer")
    precision.check(t.precision)
    for key in ("max_steps", "max_minutes", "patience", "warmup_steps", "clip_norm", "valid_bleu_sentences",
                "overfit_batches", "keep_checkpoints"):
        if t[key] < 0:
            raise ConfigError(f"train.{key}={t[key]} must be >= 0 (0 turns it off)")


def setup(cfg: DictConfig) -> Run:
    """Everything before the first step; fails fast on config, corpus and checkpoint problems.
    Rank 0 holds the run folder's lock from here until :func:`train_main` ends."""
    device = distributed.init(cfg, resolve_device(cfg.train.device))  # no-op unless distributed
    check_train_config(cfg.train)
    lock = runfolder.claim(cfg.run_dir, cfg.train) if distributed.is_main() else None
    try:
        run = _setup_claimed(cfg, device)
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    run.lock = lock
    return run


def _setup_claimed(cfg: DictConfig, device: torch.device) -> Run:
    t = cfg.train
    run_dir = Path(cfg.run_dir)
    resume_from = runfolder.resume_checkpoint(run_dir, t.resume, t.resume_from)
    # the command line applied the process-wide settings (runtime.apply_training_settings)
    threads = torch.get_num_threads()
    flushed = t.flush_denormals and runtime.denormals_flushed()
    with distributed.rank0_first():  # only one rank trains a missing tokenizer or fills caches
        corpus = load_corpus(cfg.data)
        ckpt = load_checkpoint(resume_from) if resume_from else None
        changed = check_same_setup(ckpt["config"], cfg) if ckpt is not None else []
        if ckpt is not None:
            tokenizers = Tokenizers.load(run_dir / TOKENIZER_DIR)
        else:
            tokenizers = load_or_train(corpus_dir(cfg.data), cfg.tokenizer, cfg.data.src_lang, cfg.data.tgt_lang)
        identity = run_identity(cfg, tokenizers)
        if ckpt is not None:
            check_identity(ckpt, identity, resume_from)  # also: an averaged one cannot resume
        data = batching.training_data(corpus, tokenizers, cfg.data.src_lang, cfg.data.tgt_lang,
                                      cfg.train.max_src_words, cache_dir=corpus_dir(cfg.data) / "cache")

    seed_everything(t.seed)
    model = build_model(cfg.model, tokenizers.src.vocab_size, tokenizers.tgt.vocab_size).to(device)
    optimizer, scheduler = build_optimizer(model, t)
    resume_step = ckpt["progress"]["step"] if ckpt else None
    log = (RunLog(run_dir, resume_step, t.tensorboard) if distributed.is_main()
           else distributed.SilentLog(run_dir))
    run = Run(cfg, log, device, model, optimizer, scheduler, tokenizers, data, identity=identity)
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        scheduler.load_state_dict(ckpt["scheduler"])
        run.progress = Progress(**{**ckpt["progress"], "stop_reason": ""})
        native.keep(run.progress.native_choices)
        per_rank = ckpt.get("rng_per_rank") or []
        run.rank_rng_restored = len(per_rank) == distributed.world_size()
        # another number of processes (or an older checkpoint): rank 0's stream
        restore_rng_state(per_rank[distributed.rank()] if run.rank_rng_restored else ckpt["rng"])
        drop_kept(run_dir, lambda step, _: step > run.progress.step)  # a future that was lost
        log.info("resumed from %s at step %d (epoch %d, batch %d)", resume_from,
                 run.progress.step, run.progress.epoch, run.progress.batch_index)
        for change in changed:
            log.warning("resuming with a changed setting: %s", change)
    elif distributed.is_main():
        tokenizers.save(run_dir / TOKENIZER_DIR)
    write_run_info(run, threads, flushed)
    return run


def write_run_info(run: Run, threads: int, flushed: bool) -> None:
    n_params = count_parameters(run.model)
    run.log.write_config(run.cfg)
    run.log.write_json("params.json", {"parameters": n_params, "attention": run.cfg.model.attention.name})
    d = run.data
    run.log.info("device %s, %d threads%s; %s attention, %d parameters", run.device, threads,
                 ", denormals flushed" if flushed else "", run.cfg.model.attention.name, n_params)
    if run.cfg.train.flush_denormals and not flushed:
        run.log.warning("train.flush_denormals=true but denormals are not flushed (seq2seq-train "
                        "sets it; this CPU/build may not allow it): training runs with denormal "
                        "arithmetic (slower on x86)")
    run.log.info("training pairs: %d kept, %d dropped (longer than %d source words or empty); "
                 "dev pairs: %d", len(d.train_idx), d.dropped, run.cfg.train.max_src_words,
                 len(d.valid_idx))
