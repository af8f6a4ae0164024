"""DDP under torchrun (gloo, CPU): 2 ranks give one process's parameters; rank 0 writes; resume."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from seq2seq.errors import ConfigError
from seq2seq.runs import checkpoint
from seq2seq.runs.log import read_metrics
from seq2seq.training import distributed

REPO = Path(__file__).resolve().parent.parent
# dropout 0 and full teacher forcing: no RNG draw differs between 1 and 2 processes. Batches
# of 25 target tokens include one-pair batches, where rank 1 has no pair of its own.
EXACT = ["model.dropout=0.0", "train.teacher_forcing=1.0", "train.lr_schedule=plateau",
         "train.lr_patience=0", "train.batch_tokens=25"]
TORCH_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def torchrun(tmp_path: Path, nproc: int, *overrides: str) -> subprocess.CompletedProcess:
    """``torchrun --nproc_per_node=nproc seq2seq-train overrides`` (the console script's code)."""
    script = tmp_path / "seq2seq_train.py"
    script.write_text("from seq2seq.cli import train_main\n\ntrain_main()\n")
    env = {k: v for k, v in os.environ.items() if k not in TORCH_ENV}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           str(script), "train.distributed=true", *overrides]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=240,
                          env={**env, "PYTHONPATH": str(REPO)})


def train_here(overrides: list[str], *extra: str) -> Path:
    """One process, in this one, composed like the CLI does."""
    from conftest import compose_config

    from seq2seq.config import validate
    from seq2seq.training.loop import train_main

    cfg = compose_config([*overrides, *extra])
    validate(cfg)
    return train_main(cfg)


def single_pair_steps(overrides: list[str], steps: int) -> list[int]:
    """Which of the first ``steps`` steps train on a global batch of one pair."""
    from conftest import compose_config

    from seq2seq.corpus import batching, corpus_dir, load_corpus
    from seq2seq.corpus.tokenizer import load_or_train

    cfg = compose_config(overrides)
    tok = load_or_train(corpus_dir(cfg.data), cfg.tokenizer, cfg.data.src_lang, cfg.data.tgt_lang)
    d = batching.training_data(load_corpus(cfg.data), tok, cfg.data.src_lang, cfg.data.tgt_lang,
                               cfg.train.max_src_words)
    batches = batching.train_batches(d.train, d.train_idx, cfg.train.batch_tokens, cfg.train.seed, 0)
    return [i + 1 for i, b in enumerate(batches[:steps]) if len(b) == 1]


def assert_same_model(a: Path, b: Path) -> dict:
    ca, cb = checkpoint.load_checkpoint(a / "last.pt"), checkpoint.load_checkpoint(b / "last.pt")
    assert ca["progress"]["step"] == cb["progress"]["step"]
    assert ca["progress"]["batch_index"] == cb["progress"]["batch_index"]
    for name, tensor in cb["model"].items():
        torch.testing.assert_close(ca["model"][name], tensor, rtol=0, atol=1e-5, msg=name)
    return ca


@pytest.fixture(scope="module")
def six_steps(tiny_train_overrides, tmp_path_factory) -> tuple[list[str], Path, Path]:
    """(overrides, run folder of 2 ranks, run folder of 1 process), both after 6 steps."""
    tmp = tmp_path_factory.mktemp("ddp")
    base = [*tiny_train_overrides, *EXACT]
    assert single_pair_steps(base, 12) == [3, 6, 7, 9, 10]  # the idle-rank path is exercised
    ddp, single = tmp / "ddp", tmp / "single"
    # 6 steps cross a validation (step 5) that rank 0 runs for both ranks
    proc = torchrun(tmp, 2, *base, f"run_dir={ddp}", "train.max_steps=6")
    assert proc.returncode == 0, proc.stderr[-4000:]
    train_here(base, f"run_dir={single}", "train.max_steps=6")
    return base, ddp, single


def test_two_ranks_match_one_process_and_only_rank0_writes(six_steps) -> None:
    _, ddp, single = six_steps
    assert_same_model(ddp, single)
    # one writer: one header, each metrics step once, each log line once
    log = (ddp / "train.log").read_text()
    assert log.count("training pairs:") == 1 and log.count("effective batch: 25 target") == 1
    steps = [(int(r["step"]), bool(r["dev_loss"])) for r in read_metrics(ddp)]
    assert steps == [(2, False), (4, False), (5, True), (6, False), (6, True)]
    for name in ("params.json", "summary.json"):
        record = json.loads((ddp / name).read_text())
        assert record["world_size"] == 2 and record["global_batch_tokens"] == 25, name
    single_summary = json.loads((single / "summary.json").read_text())
    assert single_summary["world_size"] == 1
    # rank 0's dev BLEU drove best.pt exactly as in one process
    ddp_summary = json.loads((ddp / "summary.json").read_text())
    assert ddp_summary["best_dev_bleu"] == pytest.approx(single_summary["best_dev_bleu"], abs=1e-6)
    assert ddp_summary["best_step"] == single_summary["best_step"]


@pytest.mark.slow
def test_resume_under_torchrun_continues_the_run(six_steps, tmp_path: Path) -> None:
    base, ddp6, single6 = six_steps
    ddp, single = tmp_path / "ddp", tmp_path / "single"
    shutil.copytree(ddp6, ddp)
    shutil.copytree(single6, single)
    proc = torchrun(tmp_path, 2, *base, f"run_dir={ddp}", "train.max_steps=12", "train.resume=true")
    assert proc.returncode == 0, proc.stderr[-4000:]
    train_here(base, f"run_dir={single}", "train.max_steps=12", "train.resume=true")
    ckpt = assert_same_model(ddp, single)
    assert ckpt["progress"]["step"] == 12
    assert [int(r["step"]) for r in read_metrics(ddp) if r["train_loss"]] == [2, 4, 6, 8, 10, 12]
    assert json.loads((ddp / "summary.json").read_text())["steps"] == 12
    assert "resumed from" in (ddp / "train.log").read_text()


def test_distributed_without_torchrun_is_a_config_error(tiny_train_overrides, tmp_path: Path,
                                                        monkeypatch) -> None:
    for key in TORCH_ENV:
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(ConfigError, match="launch with `torchrun --nproc_per_node=N"):
        train_here(tiny_train_overrides, f"run_dir={tmp_path / 'a'}", "train.distributed=true")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="add train.distributed=true"):
        train_here(tiny_train_overrides, f"run_dir={tmp_path / 'b'}", "train.max_steps=1")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_shards_cover_the_global_batch_once() -> None:
    idx = np.arange(10, 17)
    parts = [distributed.shard(idx, r, 3) for r in range(3)]
    assert sorted(np.concatenate(parts).tolist()) == idx.tolist()
    assert [len(p) for p in parts] == [3, 2, 2]
    assert [len(distributed.shard(idx[:1], r, 2)) for r in range(2)] == [1, 0]


def test_one_process_helpers_are_no_ops() -> None:
    from seq2seq.corpus.batching import EncodedSplit, collate

    enc = EncodedSplit(np.arange(4, 10, dtype=np.int32), np.array([0, 2, 6]),
                       np.arange(4, 7, dtype=np.int32), np.array([0, 1, 3]), np.array([2, 4]))
    batch, scale = distributed.local_batch(enc, np.array([0, 1]))
    assert scale == 1.0 and batch.n_tgt_tokens == collate(enc, np.array([0, 1])).n_tgt_tokens == 5
    assert distributed.world_size() == 1 and distributed.is_main()
    assert distributed.on_main(lambda: 7) == 7 and distributed.slowest(1.5) == 1.5
    assert distributed.batch_record(300) == {"world_size": 1, "global_batch_tokens": 300,
                                             "rank_batch_tokens": 300}


@pytest.mark.slow  # ~1 min: three torchrun launches
def test_sigterm_under_torchrun_resumes_every_rank_exactly(tiny_train_overrides, tmp_path: Path) -> None:
    """SIGTERM to torchrun: both ranks stop at the same step and save; a resume under torchrun
    (each rank's RNG restored) ends bit-identical to an uninterrupted 2-rank run."""
    import signal
    import time

    noisy = [*tiny_train_overrides, "model.dropout=0.3", "train.teacher_forcing=0.7",
             "train.batch_tokens=60", "train.log_every=1", "train.valid_every=8"]
    script = tmp_path / "seq2seq_train.py"
    script.write_text("from seq2seq.cli import train_main\n\ntrain_main()\n")
    env = {k: v for k, v in os.environ.items() if k not in TORCH_ENV}
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         str(script), "train.distributed=true", *noisy, f"run_dir={run_dir}",
         "train.max_steps=100000"], cwd=REPO, env={**env, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        rows = read_metrics(run_dir) if (run_dir / "metrics.csv").exists() else []
        if rows and rows[-1]["step"] and int(rows[-1]["step"]) >= 10:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert "stopped: SIGTERM at step" in err, err[-3000:]
    ckpt = checkpoint.load_checkpoint(run_dir / "last.pt")
    stopped = ckpt["progress"]["step"]
    assert len(ckpt["rng_per_rank"]) == 2 and not (run_dir / "summary.json").exists()
    end = stopped + 6
    resumed = torchrun(tmp_path, 2, f"run_dir={run_dir}", "train.resume=true", f"train.max_steps={end}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    whole = torchrun(tmp_path, 2, *noisy, f"run_dir={tmp_path / 'whole'}", f"train.max_steps={end}")
    assert whole.returncode == 0, whole.stderr[-3000:]
    a = checkpoint.load_checkpoint(run_dir / "last.pt")
    b = checkpoint.load_checkpoint(tmp_path / "whole" / "last.pt")
    assert a["progress"]["step"] == b["progress"]["step"] == end
    for name, tensor in b["model"].items():
        assert torch.equal(a["model"][name], tensor), name
