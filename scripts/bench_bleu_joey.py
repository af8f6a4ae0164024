"""JoeyNMT's side of `scripts/benchmark.py --minutes M` (scripts/bench_bleu.py): one
training run to the last mark that saves a checkpoint at every mark, its training time
per checkpoint read from its log, and each checkpoint decoded on the marks' test sets."""

from __future__ import annotations

import argparse
import re
from datetime import datetime
from pathlib import Path
from typing import Any

import bench_joey
from bench_bleu import MarkLog, TestSet, bleu, full_test_fields, mark_record

from seq2seq.errors import Seq2SeqError


def joey_mark_updates(marks: list[float], every: float, updates_per_minute: float) -> list[int]:
    """JoeyNMT's update count at each mark: i x (updates in ``every`` minutes) at the i-th
    regular mark, so that one validation_freq hits them all; a last mark off that grid gets
    its own minutes x rate. Strictly increasing, at least 1."""
    per_mark = max(1, round(every * updates_per_minute)) if len(marks) > 1 else 0
    out: list[int] = []
    for i, minutes in enumerate(marks, 1):
        on_grid = per_mark and abs(minutes - i * every) < 1e-6
        updates = i * per_mark if on_grid else round(minutes * updates_per_minute)
        out.append(max(updates, out[-1] + 1 if out else 1))
    return out


def joey_validation_freq(updates: list[int]) -> int:
    """Validate (and save a checkpoint) every first-mark updates; one mark: at its end."""
    return updates[0] if len(updates) > 1 else updates[-1]


def joey_log_every(validation_freq: int, most: int = 100) -> int:
    """JoeyNMT's logging_freq: the largest divisor of validation_freq up to ``most`` (it
    requires validation_freq % logging_freq == 0)."""
    return max(d for d in range(1, min(most, validation_freq) + 1) if validation_freq % d == 0)


# "2026-12-01 22:18:11,678 - INFO - joeynmt.training - EPOCH 1"
JOEY_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) - \w+ - ([\w.]+) - (.*)$")
JOEY_SAVED = re.compile(r"Checkpoint saved in .*?(\d+)\.ckpt\.?$")


def joey_mark_times(log_text: str) -> dict[int, dict[str, float]]:
    """Per checkpoint step in a `joeynmt train` log: seconds from its first epoch's start to
    the checkpoint's save (``train_wall_s``, its validations included) and the same less the
    validations up to then (``train_s``: from each validation's "Predicting" line to the
    checkpoint it saves). A step saved twice (the last one) keeps its first time."""
    start = pending = None
    valid_s = 0.0
    out: dict[int, dict[str, float]] = {}
    for line in log_text.splitlines():
        m = JOEY_LINE.match(line)
        if not m:
            continue
        t = datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        name, msg = m[2], m[3].strip()
        if start is None:
            if name == "joeynmt.training" and msg == "EPOCH 1":
                start = t
            continue
        if name == "joeynmt.prediction" and msg.startswith("Predicting"):
            pending = t if pending is None else pending
        elif name == "joeynmt.training" and (saved := JOEY_SAVED.search(msg)):
            if pending is not None:
                valid_s += t - pending
                pending = None
            step = int(saved[1])
            if step not in out:
                out[step] = {"train_wall_s": t - start, "train_s": t - start - valid_s}
    return out


def joey_test_files(files: dict[str, str], langs: tuple[str, str], test: TestSet) -> str:
    """``<prefix>/test_<name>.<lang>`` for JoeyNMT (data.test is that path without the language)."""
    prefix = Path(files["prefix"]) / f"test_{test.name}"
    bench_joey.write_lines(prefix.with_name(f"{prefix.name}.{langs[0]}"), test.sources)
    bench_joey.write_lines(prefix.with_name(f"{prefix.name}.{langs[1]}"), test.refs)
    return str(prefix)


def decode_joey(cfg: dict[str, Any], work: Path, ckpt: Path, test: TestSet, test_prefix: str
                ) -> dict[str, dict[str, Any]]:
    out = {}
    for beam, key in ((1, "greedy"), (5, "beam5")):
        res = bench_joey.test(cfg, work, beam, ckpt=ckpt, test_prefix=test_prefix,
                              tag=f"{ckpt.stem}_{test.name}")
        out[key] = {"sent_per_s": res["sent_per_s"], "seconds": res["seconds"],
                    "sentences": len(res["hypotheses"]), "wall_s": res["wall_s"],
                    **bleu(res["hypotheses"], test.refs)}
    return out


def train_joey_marks(args: argparse.Namespace, arm: str, work: Path, marks: list[float],
                     every: float, results: dict[str, Any], subset: TestSet,
                     whole: TestSet | None, log: MarkLog) -> None:
    """JoeyNMT trained once to the last mark, saving a checkpoint at each; then each decoded."""
    joey = results["joey"]
    speed = joey["arms"][arm]["train"]["tgt_tok_per_s"]
    per_minute = 60 * speed / joey["batch"]["tgt_tokens"]
    updates = joey_mark_updates(marks, every, per_minute)
    vfreq = joey_validation_freq(updates)
    langs = (args.langs[0], args.langs[1])
    model_dir = work / f"joey_{arm}_{args.minutes:g}min"
    cfg = bench_joey.joey_config(arm, joey["files"], langs, model_dir, joey["batch"]["batch_size"],
                                 updates[-1], joey_log_every(vfreq))
    cfg["name"] = f"bench_{arm}_{args.minutes:g}min"
    cfg["training"]["validation_freq"] = vfreq
    cfg["training"]["keep_best_ckpts"] = -1  # keep every checkpoint, whatever its dev score
    side = log.toolkit(arm, "joey")
    side.update(updates_per_minute=per_minute, mark_updates=updates, validation_freq=vfreq)
    log.write()
    train = bench_joey.train(cfg, work, timeout=max(3600.0, 180 * marks[-1] + 600))
    times = joey_mark_times(Path(train["log"]).read_text(encoding="utf-8"))
    side["train"] = {k: v for k, v in train.items() if k != "tgt_tok_per_s_repeats"}
    prefixes = {t.name: joey_test_files(joey["files"], langs, t) for t in (subset, whole) if t}
    for i, (minutes, steps) in enumerate(zip(marks, updates, strict=True)):
        ckpt = model_dir / f"{steps}.ckpt"
        if steps not in times or not ckpt.is_file():
            raise Seq2SeqError(f"JoeyNMT saved no checkpoint at update {steps} (mark {minutes:g} "
                               f"min); see {train['log']}")
        extra = ({"full_test": full_test_fields(decode_joey(cfg, work, ckpt, whole, prefixes[whole.name]))}
                 if whole and i == len(marks) - 1 else {})
        log.add(arm, "joey", mark_record(
            minutes, steps, times[steps]["train_wall_s"], times[steps]["train_s"],
            decode_joey(cfg, work, ckpt, subset, prefixes[subset.name]), checkpoint=str(ckpt),
            **extra))
