"""The one validation layer of every command's config: range checks a type cannot
express, each failing with a ConfigError that names the key and the fix. Types and
fixed choices are checked by OmegaConf against :mod:`seq2seq.config.schema`."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from seq2seq.config.schema import CONFIG_DIR
from seq2seq.constants import MAX_BEAM
from seq2seq.errors import ConfigError


def check(cond: bool, message: str) -> None:
    if not cond:
        raise ConfigError(message)


def validate_model(m: Any) -> None:
    """Range checks of a ModelConfig (names and types are OmegaConf's): the one check that
    both the training command and :func:`seq2seq.model.build_model` run."""
    for key in ("emb_size", "hidden_size", "enc_layers", "dec_layers"):
        check(m[key] > 0, f"model.{key}={m[key]} must be a positive integer")
    check(0.0 <= m.dropout < 1.0, f"model.dropout={m.dropout} must be in [0, 1)")
    check(m.attention.attn_size >= 0, f"model.attention.attn_size={m.attention.attn_size} must be >= 0")


def validate(cfg: Any) -> None:
    """Range checks that a type alone cannot express; raises ConfigError with the fix."""
    t, tok, d = cfg.train, cfg.tokenizer, cfg.data
    validate_model(cfg.model)
    check(tok.vocab_size >= 16, f"tokenizer.vocab_size={tok.vocab_size} is too small (>= 16)")
    check(t.batch_tokens > 0, f"train.batch_tokens={t.batch_tokens} must be positive")
    check(t.lr > 0, f"train.lr={t.lr} must be positive")
    check(0.0 < t.lr_decay < 1.0, f"train.lr_decay={t.lr_decay} must be in (0, 1): the factor "
           "the plateau schedule multiplies the learning rate by")
    check(t.threads >= 0, f"train.threads={t.threads} must be >= 0 (0 = all cores)")
    check(not (t.deterministic and t.precision == "auto"), "train.deterministic=true needs a "
          "fixed train.precision: auto times the machine and another run may pick another one "
          "(set train.precision=fp32, bf16, bf16_loss or bf16_gemm)")
    check(t.save_every_minutes >= 0, f"train.save_every_minutes={t.save_every_minutes} must "
           "be >= 0 (0 = at validations only)")
    check(0.0 <= t.label_smoothing < 1.0, f"train.label_smoothing={t.label_smoothing} must be in [0, 1)")
    check(0.0 < t.teacher_forcing <= 1.0, f"train.teacher_forcing={t.teacher_forcing} must be in (0, 1]")
    check(t.max_src_words > 0, f"train.max_src_words={t.max_src_words} must be positive")
    check_device(t.device, "train.device")
    check(d.max_len_ratio >= 1.0, f"data.max_len_ratio={d.max_len_ratio} must be >= 1")
    check(0 < d.min_words <= d.max_words, "data.min_words must be positive and <= data.max_words")


def check_search(cfg: Any) -> None:
    """The search settings every decoding command has: alpha, max_len_ratio, max_len_extra."""
    check(cfg.alpha >= 0, f"alpha={cfg.alpha} must be >= 0 (0 = no length penalty)")
    check(cfg.max_len_ratio > 0, f"max_len_ratio={cfg.max_len_ratio} must be positive")
    check(cfg.max_len_extra >= 0, f"max_len_extra={cfg.max_len_extra} must be >= 0")


def validate_eval(ev: Any) -> None:
    """Range checks of the decoding and scoring settings (EvalConfig)."""
    check_beam(ev.beam)
    check_search(ev)
    check(ev.batch_tokens > 0, f"batch_tokens={ev.batch_tokens} must be positive")
    check(ev.n_boot >= 1, f"n_boot={ev.n_boot} must be >= 1 (1000 is the default)")
    check_device(ev.device)
    check_workers(ev.workers)


def check_workers(workers: int) -> None:
    """``workers``: -1 (auto, seq2seq.inference.workers) or a positive number of batches."""
    check(workers == -1 or workers >= 1,
          f"workers={workers} must be -1 (auto) or a number of batches decoded at once")


def validate_evaluate(cfg: Any) -> None:
    """`seq2seq-evaluate`: exactly one of run= / runs=, and valid decoding settings."""
    validate_eval(cfg)
    check((cfg.run is None) != (len(cfg.runs) == 0),
           "pass one run folder as run=<folder>, or several as runs=[<folder>,<folder>]")
    check_run_value(cfg.run)
    check(not cfg.names or len(cfg.names) == max(len(cfg.runs), 1),
           f"names={list(cfg.names)} must give one name per run")


def validate_reproduce(cfg: Any) -> None:
    """`seq2seq-reproduce`: the base training config, the eval settings and the arms."""
    validate(cfg)
    validate_eval(cfg.eval)
    arms = cfg.reproduce.arms
    check(len(arms) > 0, "reproduce.arms is empty: choose a profile (profile=quick) or add arms")
    for name, arm in arms.items():
        check(arm.max_src_words >= 0, f"reproduce.arms.{name}.max_src_words must be >= 0")
        check(not arm.baseline or arm.baseline in arms,
               f"reproduce.arms.{name}.baseline={arm.baseline!r} is not an arm; "
               f"use one of {list(arms)} or ''")
    check(len(cfg.reproduce.splits) > 0, "reproduce.splits is empty: evaluate on at least test")
    longer = cfg.reproduce.longer_profile
    profiles = group_options("profile")
    check(not longer or longer in profiles,
           f"reproduce.longer_profile={longer!r} is not a profile: use one of {profiles} or ''")


def group_options(group: str) -> list[str]:
    """The options of config group ``group`` (e.g. "profile", "model/attention"): the names
    of its configs/<group>/*.yaml files, sorted."""
    return sorted(p.stem for p in (Path(CONFIG_DIR) / group).glob("*.yaml"))


def validate_translate(cfg: Any) -> None:
    """`seq2seq-translate`: a run to load and valid decoding settings (TranslateConfig)."""
    check(bool(cfg.run), "no model given: pass run=<run folder or checkpoint>, e.g. "
           "seq2seq-translate run=runs/short_bahdanau")
    check_beam(cfg.beam, cfg.nbest)
    check_search(cfg)
    check(cfg.max_src_tokens >= 0,
           f"max_src_tokens={cfg.max_src_tokens} must be >= 0 (0 = from the run's training length)")
    check(cfg.threads >= -1, f"threads={cfg.threads} must be >= -1 (-1 = auto, 0 = all cores)")
    check_workers(cfg.workers)
    check_device(cfg.device)
    check(cfg.batch_tokens > 0, f"batch_tokens={cfg.batch_tokens} must be positive")
    check_run_value(cfg.run)


def check_device(name: str, key: str = "device") -> None:
    """A device setting names auto, cpu, cuda or cuda:N (seq2seq.runtime.resolve_device
    turns it into a torch device)."""
    check(name in ("auto", "cpu", "cuda") or name.startswith("cuda:"),
           f"{key}={name!r}: use auto, cpu or cuda")


def check_beam(beam: int, nbest: int = 1) -> None:
    """The one beam/nbest check of every command, the prompt and the Python API:
    ConfigError unless 1 <= nbest <= beam <= MAX_BEAM (beam 1 is greedy search)."""
    check(1 <= beam <= MAX_BEAM, f"beam={beam}: the beam size must be between 1 (greedy) "
           f"and {MAX_BEAM}")
    check(1 <= nbest <= beam, f"nbest={nbest} with beam={beam}: nbest must be between 1 and "
           "the beam size; raise the beam or lower nbest")


def check_run_value(run: Any) -> None:
    """``run=``: one path, or a non-empty list of paths (an ensemble)."""
    if run is None or isinstance(run, str):
        return
    members = list(run) if isinstance(run, Sequence) else [run]
    check(len(members) > 0 and all(isinstance(m, str) and m for m in members),
           f"run={members}: give a run folder, or a list of run folders for an ensemble "
           "(run=[runs/a,runs/b])")


def validate_average(cfg: Any) -> None:
    """`seq2seq-average`: a run with ``last`` >= 1, or explicit checkpoint files."""
    check(bool(cfg.run) or len(cfg.checkpoints) > 0,
           "pass run=<run folder> (with last=N) or checkpoints=[a.pt,b.pt]")
    check(cfg.last >= 1, f"last={cfg.last} must be at least 1")


def validate_serve(cfg: Any) -> None:
    """Exactly one of runs= / reproduction=, and sane ports, settings and limits;
    ConfigError naming the key and the fix."""
    check(bool(cfg.runs) != bool(cfg.reproduction),
           "no model given: pass runs=[<run folder>,...] or reproduction=<seq2seq-reproduce "
           "folder>, e.g. seq2seq-serve reproduction=runs/reproduce_quick"
           if not cfg.runs else "pass runs=[...] or reproduction=<folder>, not both")
    check(not cfg.names or len(cfg.names) == len(cfg.runs),
           f"names={list(cfg.names)} must give one name per run")
    check(0 <= cfg.port <= 65535, f"port={cfg.port} must be between 0 (any free port) and 65535")
    check(cfg.seed >= 0, f"seed={cfg.seed} must be >= 0 (0 = the lowest seed found)")
    check_search(cfg)
    check(cfg.max_src_tokens >= 0, f"max_src_tokens={cfg.max_src_tokens} must be >= 0")
    check(cfg.batch_tokens > 0, f"batch_tokens={cfg.batch_tokens} must be positive")
    check(cfg.threads >= 0, f"threads={cfg.threads} must be >= 0 (0 = all cores)")
    check_device(cfg.device)
    lim = cfg.limits
    for key in ("max_chars", "max_sentences", "max_beam", "max_nbest", "max_queue"):
        check(lim[key] >= 1, f"limits.{key}={lim[key]} must be at least 1")
    check(lim.max_beam <= MAX_BEAM, f"limits.max_beam={lim.max_beam} must be <= {MAX_BEAM}")
    check(lim.max_nbest <= lim.max_beam, f"limits.max_nbest={lim.max_nbest} must be <= "
           f"limits.max_beam={lim.max_beam}")
    check(lim.timeout_s > 0, f"limits.timeout_s={lim.timeout_s} must be positive")
    check(1 <= cfg.beam <= lim.max_beam, f"beam={cfg.beam} must be between 1 and "
           f"limits.max_beam={lim.max_beam}")
