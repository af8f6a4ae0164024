"""JoeyNMT's side of `scripts/benchmark.py --minutes M` (scripts/bench_bleu.py): one
training run, stopped by wall clock, that saves a checkpoint about every K/5 minutes; each
mark takes the first checkpoint whose training time (from its log) reaches the mark, and
that checkpoint is decoded on the marks' test sets.

JoeyNMT has no time limit of its own, and an update count fixed from its speed measured
earlier missed the marks by 20-50% either way (its rate drifts with the machine): the run
is watched instead, and stopped once a checkpoint's training time passes the last mark."""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import bench_joey
from bench_bleu import MarkLog, TestSet, bleu, full_test_fields, mark_record

from seq2seq.errors import Seq2SeqError

# checkpoints per mark interval: a mark's checkpoint is at most about K/5 minutes past it
GRANULES = 5
# the update cap, as a multiple of the updates the measured rate predicts for the last
# mark: the run is stopped by time long before it unless JoeyNMT speeds up this much
UPDATE_CAP_FACTOR = 4
# seconds JoeyNMT gets to end after Ctrl-C before its process group is killed
STOP_GRACE_S = 60.0


def joey_checkpoint_every(every: float, last_mark: float, updates_per_minute: float,
                          granules: int = GRANULES) -> int:
    """Updates between JoeyNMT's checkpoints: about ``every``/``granules`` minutes (the
    last mark's minutes when there is one mark) at the measured rate; at least 1."""
    span = every if 0 < every < last_mark else last_mark
    return max(1, round(span / granules * updates_per_minute))


def joey_update_cap(last_mark: float, updates_per_minute: float, freq: int) -> int:
    """JoeyNMT's `updates`: a whole number of checkpoint intervals well past the last mark."""
    want = UPDATE_CAP_FACTOR * last_mark * updates_per_minute
    return freq * max(2, -(-round(want) // freq))


def pick_mark_checkpoints(marks: list[float], times: dict[int, dict[str, float]]) -> list[int]:
    """Per mark, the first checkpoint whose training time (``train_s``, validations left
    out) reaches the mark, so JoeyNMT has trained at least the mark's minutes. Raises when
    a mark has none (the run ended early)."""
    steps = sorted(times)
    out = []
    for minutes in marks:
        reached = [s for s in steps if times[s]["train_s"] >= 60 * minutes]
        if not reached:
            last = f"{times[steps[-1]]['train_s'] / 60:.2f} min at update {steps[-1]}" if steps else "none"
            raise Seq2SeqError(f"JoeyNMT's training stopped before the {minutes:g}-minute mark "
                               f"(its last checkpoint: {last})")
        out.append(reached[0])
    return out


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


def ctrl_c_default() -> None:
    """In the child before exec: a benchmark started in the background (`cmd &`) passes
    SIGINT on ignored, and Python then never raises KeyboardInterrupt for it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def stop_group(proc: subprocess.Popen, grace_s: float | None = None) -> None:
    """Ctrl-C to the process group (JoeyNMT's checkpoints so far are on disk), then kill
    it if it has not ended within ``grace_s`` (default STOP_GRACE_S)."""
    grace_s = STOP_GRACE_S if grace_s is None else grace_s
    os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def train_until(cfg: dict[str, Any], work: Path, done: Callable[[str], bool], timeout: float,
                poll_s: float = 5.0) -> dict[str, Any]:
    """`joeynmt train` as bench_joey.train, its output streamed to its log, and stopped as
    soon as ``done(log so far)`` holds (checked every ``poll_s`` s); a run that ends by
    itself first is fine too. ``stopped`` in the result says which."""
    config = bench_joey.write_config(cfg, work / f"{cfg['name']}.yaml")
    log = work / f"{cfg['name']}.train.log"
    args = ["train", str(config), "--skip-test"]
    start = time.perf_counter()
    stopped = False
    with log.open("w", encoding="utf-8") as out:
        proc = subprocess.Popen(bench_joey.joey_command(args), stdout=out, stderr=subprocess.STDOUT,
                                cwd=bench_joey.ROOT, env=bench_joey.joey_env(),
                                start_new_session=True, preexec_fn=ctrl_c_default)
        try:
            while proc.poll() is None:
                time.sleep(poll_s)
                if done(log.read_text(encoding="utf-8", errors="replace")):
                    stop_group(proc)
                    stopped = True
                elif time.perf_counter() - start > timeout:
                    stop_group(proc, grace_s=5.0)
                    raise Seq2SeqError(f"joeynmt train ran past {timeout:.0f} s; see {log}")
        except BaseException:
            if proc.poll() is None:
                stop_group(proc, grace_s=5.0)
            raise
    wall = time.perf_counter() - start
    text = log.read_text(encoding="utf-8", errors="replace")
    if proc.returncode != 0 and not stopped:
        raise bench_joey.joey_failed(args, proc.returncode, log, text)
    return {**bench_joey.train_result(cfg, text, wall, config, log), "stopped": stopped}


def passed(minutes: float) -> Callable[[str], bool]:
    """True once a checkpoint in the log has trained at least ``minutes`` (validations out)."""
    return lambda text: any(t["train_s"] >= 60 * minutes for t in joey_mark_times(text).values())


def train_joey_marks(args: argparse.Namespace, arm: str, work: Path, marks: list[float],
                     every: float, results: dict[str, Any], subset: TestSet,
                     whole: TestSet | None, log: MarkLog) -> None:
    """JoeyNMT trained once, by wall clock, past the last mark; each mark's checkpoint decoded."""
    joey = results["joey"]
    speed = joey["arms"][arm]["train"]["tgt_tok_per_s"]
    per_minute = 60 * speed / joey["batch"]["tgt_tokens"]
    vfreq = joey_checkpoint_every(every, marks[-1], per_minute)
    cap = joey_update_cap(marks[-1], per_minute, vfreq)
    langs = (args.langs[0], args.langs[1])
    model_dir = work / f"joey_{arm}_{args.minutes:g}min"
    cfg = bench_joey.joey_config(arm, joey["files"], langs, model_dir, joey["batch"]["batch_size"],
                                 cap, joey_log_every(vfreq))
    cfg["name"] = f"bench_{arm}_{args.minutes:g}min"
    cfg["training"]["validation_freq"] = vfreq
    cfg["training"]["keep_best_ckpts"] = -1  # keep every checkpoint, whatever its dev score
    side = log.toolkit(arm, "joey")
    side.update(updates_per_minute=per_minute, validation_freq=vfreq, update_cap=cap)
    log.write()
    train = train_until(cfg, work, passed(marks[-1]), timeout=max(3600.0, 180 * marks[-1] + 600))
    times = joey_mark_times(Path(train["log"]).read_text(encoding="utf-8"))
    updates = pick_mark_checkpoints(marks, times)
    side["train"] = {k: v for k, v in train.items() if k != "tgt_tok_per_s_repeats"}
    side["mark_updates"] = updates
    log.write()
    prefixes = {t.name: joey_test_files(joey["files"], langs, t) for t in (subset, whole) if t}
    for i, (minutes, steps) in enumerate(zip(marks, updates, strict=True)):
        ckpt = model_dir / f"{steps}.ckpt"
        if not ckpt.is_file():
            raise Seq2SeqError(f"JoeyNMT's checkpoint for the {minutes:g}-minute mark is missing: "
                               f"{ckpt}; see {train['log']}")
        extra = ({"full_test": full_test_fields(decode_joey(cfg, work, ckpt, whole, prefixes[whole.name]))}
                 if whole and i == len(marks) - 1 else {})
        log.add(arm, "joey", mark_record(
            minutes, steps, times[steps]["train_wall_s"], times[steps]["train_s"],
            decode_joey(cfg, work, ckpt, subset, prefixes[subset.name]), checkpoint=str(ckpt),
            **extra))
    for ckpt in model_dir.glob("*.ckpt"):  # between marks; each holds the optimizer state too
        if ckpt.stem.isdigit() and int(ckpt.stem) not in updates:
            ckpt.unlink()
