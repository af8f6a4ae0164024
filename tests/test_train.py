"""Checkpoints (atomic, corrupt, RNG), the training loop end to end, and exact resume."""

from __future__ import annotations

import json
import math
import os
import platform
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from seq2seq.errors import CheckpointError, ConfigError
from seq2seq.runs import checkpoint
from seq2seq.runs.log import read_metrics

# ---------------------------------------------------------------- checkpoint files


def test_atomic_save_round_trip(tmp_path: Path) -> None:
    checkpoint.atomic_save({"x": torch.arange(3)}, tmp_path / "a.pt")
    assert torch.load(tmp_path / "a.pt")["x"].tolist() == [0, 1, 2]
    assert [p.name for p in tmp_path.iterdir()] == ["a.pt"]


def test_failing_write_leaves_the_old_file_intact(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "last.pt"
    checkpoint.atomic_save({"version": 1}, path)

    def broken_save(obj, fh):
        fh.write(b"half a checkpoint")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint.torch, "save", broken_save)
    with pytest.raises(OSError):
        checkpoint.atomic_save({"version": 2}, path)
    monkeypatch.undo()
    assert torch.load(path)["version"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]  # the temp file is gone


def fake_checkpoint() -> dict:
    model = torch.nn.Linear(3, 2)
    cfg = OmegaConf.create({"model": {"a": 1}})
    return checkpoint.make_checkpoint(model, None, None, {"step": 7}, cfg, {"src": 10, "tgt": 12})


def test_checkpoint_loads_with_weights_only(tmp_path: Path) -> None:
    checkpoint.atomic_save(fake_checkpoint(), tmp_path / "c.pt")
    ckpt = checkpoint.load_checkpoint(tmp_path / "c.pt")
    assert ckpt["progress"] == {"step": 7} and ckpt["vocab"] == {"src": 10, "tgt": 12}
    assert ckpt["config"] == {"model": {"a": 1}}


def test_truncated_checkpoint_is_a_checkpoint_error(tmp_path: Path) -> None:
    path = tmp_path / "last.pt"
    checkpoint.atomic_save(fake_checkpoint(), path)
    path.write_bytes(path.read_bytes()[:300])
    with pytest.raises(CheckpointError, match="is corrupt or truncated"):
        checkpoint.load_checkpoint(path)


def test_garbage_and_foreign_files_are_checkpoint_errors(tmp_path: Path) -> None:
    (tmp_path / "junk.pt").write_bytes(b"\x00not a zip at all")
    with pytest.raises(CheckpointError, match="corrupt"):
        checkpoint.load_checkpoint(tmp_path / "junk.pt")
    torch.save({"state_dict": {}}, tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match="is not a seq2seq checkpoint"):
        checkpoint.load_checkpoint(tmp_path / "other.pt")


def test_missing_checkpoint_and_empty_run_folder(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="not found"):
        checkpoint.load_checkpoint(tmp_path / "nope.pt")
    with pytest.raises(CheckpointError, match="holds no best.pt or last.pt"):
        checkpoint.load_model(tmp_path)
    with pytest.raises(CheckpointError, match="does not exist"):
        checkpoint.load_model(tmp_path / "missing_run")


def test_rng_state_round_trip() -> None:
    state = checkpoint.capture_rng_state()
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    checkpoint.restore_rng_state(state)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


def test_resume_checkpoint_rules(tmp_path: Path) -> None:
    from seq2seq.runs import folder as runfolder

    assert runfolder.resume_checkpoint(tmp_path, resume=False) is None
    with pytest.raises(CheckpointError, match="train.resume=true but"):
        runfolder.resume_checkpoint(tmp_path, resume=True)
    (tmp_path / "best.pt").write_bytes(b"x")
    with pytest.raises(CheckpointError, match="train.resume_from=best"):
        runfolder.resume_checkpoint(tmp_path, resume=True)
    assert runfolder.resume_checkpoint(tmp_path, True, "best") == tmp_path / "best.pt"
    (tmp_path / "last.pt").write_bytes(b"x")
    assert runfolder.resume_checkpoint(tmp_path, resume=True) == tmp_path / "last.pt"
    fresh = OmegaConf.create({"resume": False, "overwrite": False})
    with pytest.raises(ConfigError, match=r"already holds a run \(last.pt, best.pt\)"):
        runfolder.claim(tmp_path, fresh)
    (tmp_path / ".last.pt.abc.tmp").write_bytes(b"half")
    lock = runfolder.claim(tmp_path, OmegaConf.create({"resume": True, "overwrite": False}))
    assert not (tmp_path / ".last.pt.abc.tmp").exists()  # a killed writer's leftover
    with pytest.raises(ConfigError, match=f"in use by another trainer \\(pid {os.getpid()}\\)"):
        runfolder.FolderLock(tmp_path).acquire()
    lock.release()
    runfolder.claim(tmp_path, OmegaConf.create({"resume": False, "overwrite": True})).release()
    assert runfolder.run_files(tmp_path) == []  # overwrite removed the old run's files


# ---------------------------------------------------------------- training end to end

REPO = Path(__file__).resolve().parent.parent


def train(overrides: list[str], *extra: str) -> Path:
    """Compose the config like the CLI does and train in this process."""
    from conftest import compose_config

    from seq2seq.config import validate
    from seq2seq.training.loop import train_main

    cfg = compose_config([*overrides, *extra])
    validate(cfg)
    return train_main(cfg)


def run_cli(*overrides: str) -> subprocess.CompletedProcess:
    code = "from seq2seq.cli import train_main; train_main()"
    return subprocess.run([sys.executable, "-c", code, *overrides], cwd=REPO, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})


def test_cli_trains_into_a_self_contained_run_folder(tiny_train_overrides, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = run_cli(*tiny_train_overrides, f"run_dir={run_dir}", "train.max_steps=6",
                   "model/attention=luong")
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in ("config.yaml", "metrics.csv", "train.log", "params.json", "summary.json",
                 "best.pt", "last.pt", "tokenizer/tokenizers.json"):
        assert (run_dir / name).is_file(), name
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 6 and summary["stop_reason"] == "max_steps=6"
    assert summary["mean_tgt_tok_per_s"] > 0 and summary["attention"] == "luong"
    # the timed kernel paths this process took (none where the kernels are not built)
    assert set(summary["native_choices"].values()) <= {"kernel", "torch"}
    saved = OmegaConf.load(run_dir / "config.yaml")
    assert saved.model.attention.name == "luong" and saved.run_dir == str(run_dir)
    rows = read_metrics(run_dir)
    assert [int(r["step"]) for r in rows if r["train_loss"]] == [2, 4, 6]
    assert [int(r["step"]) for r in rows if r["dev_loss"]] == [5, 6]
    for r in (r for r in rows if r["dev_ppl"]):  # perplexity is exp of the per-token dev loss
        assert math.isclose(float(r["dev_ppl"]), math.exp(float(r["dev_loss"])), rel_tol=1e-3)
    assert "dev loss" in (run_dir / "train.log").read_text()
    if platform.machine() in ("x86_64", "AMD64"):  # train.flush_denormals=true by default
        assert "denormals flushed" in (run_dir / "train.log").read_text()
    params = json.loads((run_dir / "params.json").read_text())["parameters"]

    # the run folder alone rebuilds the model for decoding
    from seq2seq.inference.search import greedy

    model, tokenizers, cfg = checkpoint.load_model(run_dir)
    assert not model.training and cfg.model.attention.name == "luong"
    assert sum(p.numel() for p in model.parameters()) == params
    ids = torch.tensor([tokenizers.src.encode("el perro come pan")])
    hyp = greedy(model, ids, torch.tensor([ids.size(1)]))[0]
    assert isinstance(tokenizers.tgt.decode(hyp.tokens), str)

    # a second run into the same folder is refused unless it resumes
    with pytest.raises(ConfigError, match="already holds a run .*pass train.resume=true"):
        train(tiny_train_overrides, f"run_dir={run_dir}", "model/attention=luong")
    train(tiny_train_overrides, f"run_dir={run_dir}", "train.max_steps=8", "model/attention=luong",
          "train.resume=true")
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 8
    assert [int(r["step"]) for r in read_metrics(run_dir) if r["train_loss"]] == [2, 4, 6, 8]


RESUME = ["train.batch_tokens=400", "train.valid_every=8", "train.lr_schedule=plateau",
          "train.lr_patience=0", "train.teacher_forcing=0.7", "model.dropout=0.3"]


@pytest.mark.parametrize("attention", ["bahdanau", "luong"])
def test_resume_gives_the_same_parameters_as_an_uninterrupted_run(
        tiny_train_overrides, tmp_path: Path, attention: str) -> None:
    base = [*tiny_train_overrides, *RESUME, f"model/attention={attention}"]
    split = train(base, f"run_dir={tmp_path / 'split'}", "train.max_steps=8")
    train(base, f"run_dir={split}", "train.max_steps=16", "train.resume=true")
    whole = train(base, f"run_dir={tmp_path / 'whole'}", "train.max_steps=16")
    a = checkpoint.load_checkpoint(split / "last.pt")
    b = checkpoint.load_checkpoint(whole / "last.pt")
    assert a["progress"]["epoch"] >= 1  # the second half crossed an epoch boundary
    assert a["progress"]["step"] == b["progress"]["step"] == 16
    assert a["progress"]["batch_index"] == b["progress"]["batch_index"]
    for name, tensor in b["model"].items():
        torch.testing.assert_close(a["model"][name], tensor, rtol=0, atol=1e-6, msg=name)
    assert a["scheduler"] == b["scheduler"]
    steps = [s["step"] for s in a["optimizer"]["state"].values()]
    assert all(float(s) == 16 for s in steps)
    assert [r["train_loss"] for r in read_metrics(split)] == [r["train_loss"] for r in read_metrics(whole)]


def test_wall_clock_budget_and_length_filter(tiny_train_overrides, tmp_path: Path) -> None:
    from conftest import toy_pairs

    # a budget far shorter than one step (6 ms was not: a warm tiny step can be faster)
    run_dir = train(tiny_train_overrides, f"run_dir={tmp_path / 'run'}", "train.max_minutes=1e-9",
                    "train.max_src_words=5")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stop_reason"] == "max_minutes=1e-09" and summary["steps"] == 1
    too_long = sum(len(src.split()) > 5 for src, _ in toy_pairs(600, 1))
    assert summary["dropped_pairs"] == too_long > 0
    assert summary["train_pairs"] == 600 - too_long


def test_early_stopping_on_dev_bleu(tiny_train_overrides, tmp_path: Path) -> None:
    run_dir = train(tiny_train_overrides, f"run_dir={tmp_path / 'run'}", "train.lr=1e-9",
                    "train.patience=2", "train.valid_every=2", "train.max_steps=50")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stop_reason"].startswith("early stop") and summary["steps"] == 6
    assert summary["best_step"] == 2


def test_overfit_experiment_memorises_two_batches(tiny_train_overrides, tmp_path: Path) -> None:
    run_dir = train(tiny_train_overrides, "experiment=overfit", f"run_dir={tmp_path / 'run'}",
                    "model.emb_size=32", "model.hidden_size=32", "train.batch_tokens=100",
                    "train.max_steps=150", "train.valid_every=150", "train.lr=0.01")
    losses = [float(r["train_loss"]) for r in read_metrics(run_dir) if r["train_loss"]]
    assert losses[0] > 2.5 and losses[-1] < 0.15  # bound for 150 steps on 2 batches of ~100 tokens


def test_resume_errors(tiny_train_overrides, tmp_path: Path) -> None:
    run_dir = train(tiny_train_overrides, f"run_dir={tmp_path / 'run'}", "train.max_steps=2")
    with pytest.raises(CheckpointError, match="model.hidden_size differ"):
        train(tiny_train_overrides, f"run_dir={run_dir}", "train.resume=true", "model.hidden_size=24")
    (run_dir / "last.pt").write_bytes((run_dir / "last.pt").read_bytes()[:1000])
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        train(tiny_train_overrides, f"run_dir={run_dir}", "train.resume=true", "train.max_steps=4")
    with pytest.raises(CheckpointError, match="does not exist"):
        train(tiny_train_overrides, f"run_dir={tmp_path / 'other'}", "train.resume=true")


def test_lr_schedules() -> None:
    from seq2seq.training.optim import build_optimizer

    def lrs(schedule: str, warmup: int, steps: int = 8) -> list[float]:
        t = OmegaConf.create({"lr": 1.0, "lr_schedule": schedule, "warmup_steps": warmup,
                              "min_lr": 0.1, "lr_decay": 0.5, "lr_patience": 0})
        optimizer, scheduler = build_optimizer(torch.nn.Linear(1, 1), t)
        out = []
        for _ in range(steps):
            out.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            scheduler.step()
        return out

    assert lrs("constant", 0) == [1.0] * 8
    assert lrs("constant", 4)[:5] == [0.25, 0.5, 0.75, 1.0, 1.0]
    inv = lrs("inverse_sqrt", 4)
    assert inv[:4] == [0.25, 0.5, 0.75, 1.0]
    assert inv[4:] == pytest.approx([(4 / s) ** 0.5 for s in (5, 6, 7, 8)])
    assert min(lrs("inverse_sqrt", 0, steps=200)) == pytest.approx(0.1)  # min_lr floor


def test_bleu_off_early_stops_on_dev_loss(tiny_train_overrides, tmp_path: Path) -> None:
    run_dir = train(tiny_train_overrides, f"run_dir={tmp_path / 'run'}", "train.valid_bleu_sentences=0",
                    "train.lr=0.05", "train.label_smoothing=0.1", "train.valid_every=3",
                    "train.patience=1", "train.max_steps=200")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["best_dev_bleu"] is None
    dev = [float(r["dev_loss"]) for r in read_metrics(run_dir) if r["dev_loss"]]
    assert summary["stop_reason"].startswith("early stop") and dev[-1] >= min(dev[:-1])
    assert checkpoint.load_checkpoint(run_dir / "best.pt")["progress"]["step"] == summary["best_step"]


def test_resume_check_treats_keys_added_later_as_their_default() -> None:
    from seq2seq.config import Config

    cfg = OmegaConf.structured(Config)
    cfg.data.name, cfg.data.kind, cfg.run_dir = "tiny", "local", "runs/x"
    saved = OmegaConf.to_container(cfg, resolve=True)
    del saved["data"]["valid_per_bucket"]  # a checkpoint from before the key existed
    assert checkpoint.check_same_setup(saved, cfg) == []
    cfg.data.valid_per_bucket = 100  # not the default: the corpus differs, refused
    with pytest.raises(CheckpointError, match="data.valid_per_bucket"):
        checkpoint.check_same_setup(saved, cfg)


def test_library_training_leaves_the_process_settings_alone(tiny_train_overrides, tmp_path) -> None:
    """train_main through the library: torch's threads and the denormal mode stay as the
    caller set them; only the command line applies train.threads / flush_denormals."""
    import torch
    from conftest import train_in_process

    from seq2seq import runtime

    before_threads = torch.get_num_threads()
    torch.set_flush_denormal(False)
    try:
        other = 1 if before_threads != 1 else 2
        run_dir = train_in_process([*tiny_train_overrides, f"run_dir={tmp_path / 'run'}",
                                    "train.max_steps=2", f"train.threads={other}",
                                    "train.flush_denormals=true"])
        assert torch.get_num_threads() == before_threads
        assert not runtime.denormals_flushed()
        log = (run_dir / "train.log").read_text()
        assert f"{before_threads} threads" in log and "denormals are not flushed" in log
    finally:
        torch.set_num_threads(before_threads)


def test_the_training_command_applies_the_process_settings(monkeypatch) -> None:
    """seq2seq-train's entry point applies train.threads, malloc and denormals before training."""
    from omegaconf import OmegaConf

    from seq2seq import cli, runtime

    calls = []
    monkeypatch.setattr(runtime, "set_threads", lambda n: calls.append(("threads", n)) or n)
    monkeypatch.setattr(runtime, "keep_freed_memory", lambda: calls.append(("malloc",)) or True)
    monkeypatch.setattr(runtime, "flush_denormals", lambda: calls.append(("denormals",)) or True)
    cfg = OmegaConf.create({"train": {"threads": 3, "flush_denormals": True}})
    assert cli._train_process(cfg, lambda c: calls.append(("train",)) or "done") == "done"
    assert calls == [("threads", 3), ("malloc",), ("denormals",), ("train",)]
