"""Nothing lost: signals, kills, locks, resume from the folder, full disks (real subprocesses)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from test_train import run_cli

from seq2seq.errors import ConfigError
from seq2seq.runs import checkpoint
from seq2seq.runs.folder import folder_config
from seq2seq.runs.log import read_metrics

REPO = Path(__file__).resolve().parent.parent
CODE = "from seq2seq.cli import train_main; train_main()"
# dropout and scheduled sampling on: a resume must restore every random stream
NOISY = ["train.batch_tokens=400", "train.valid_every=8", "train.teacher_forcing=0.7",
         "model.dropout=0.3", "train.log_every=1",
         # only train.max_steps ends these runs: the tiny corpus's 20 epochs can pass
         # before a signal is sent on a fast machine
         "train.max_epochs=100000", "train.patience=0"]


def start(*overrides: str, prefix: str = "") -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-c", CODE, *overrides]
    if prefix:  # e.g. a ulimit: run through the shell
        cmd = ["bash", "-c", prefix + ' && exec "$@"', "train", *cmd]
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def wait_for_step(run_dir: Path, step: int, proc: subprocess.Popen, timeout: float = 120) -> int:
    """Poll metrics.csv until the run logged ``step`` (it logs every step); the last step seen."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        try:
            steps = [int(r["step"]) for r in read_metrics(run_dir) if r["step"]]
        except (OSError, ValueError, KeyError):
            steps = []
        if steps and steps[-1] >= step:
            return steps[-1]
        time.sleep(0.05)
    raise AssertionError(f"no step {step} in {timeout} s")


def params_and_optimizer(path: Path) -> tuple[dict, dict]:
    ckpt = checkpoint.load_checkpoint(path)
    return ckpt["model"], ckpt["optimizer"]


def assert_bit_identical(a: Path, b: Path) -> None:
    (ma, oa), (mb, ob) = params_and_optimizer(a), params_and_optimizer(b)
    assert ma.keys() == mb.keys()
    for name in ma:
        assert torch.equal(ma[name], mb[name]), name
    for key, state in ob["state"].items():
        for field, value in state.items():
            assert torch.equal(torch.as_tensor(oa["state"][key][field]), torch.as_tensor(value)), field


def uninterrupted(overrides: list[str], run_dir: Path, steps: int) -> Path:
    proc = run_cli(*overrides, f"run_dir={run_dir}", f"train.max_steps={steps}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return run_dir / "last.pt"


def test_sigterm_saves_resumes_from_the_folder_and_matches_an_uninterrupted_run(
        tiny_train_overrides, tmp_path: Path) -> None:
    base = [*tiny_train_overrides, *NOISY]
    run_dir = tmp_path / "run"
    proc = start(*base, f"run_dir={run_dir}", "train.max_steps=100000")
    wait_for_step(run_dir, 13, proc)
    # a second trainer into the same folder is refused while the first holds it
    other = run_cli(*base, f"run_dir={run_dir}", "train.resume=true")
    assert other.returncode == 2
    assert other.stderr.strip().splitlines() == [
        f"error: run folder {run_dir} is in use by another trainer (pid {proc.pid}): wait for "
        "it to finish, stop it, or choose another run_dir"]
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    last_line = err.strip().splitlines()[-1]
    assert last_line.startswith("stopped: SIGTERM at step ") and "train.resume=true" in last_line
    stopped_at = checkpoint.load_checkpoint(run_dir / "last.pt")["progress"]["step"]
    assert f"at step {stopped_at}:" in last_line and stopped_at >= 13
    assert not (run_dir / "summary.json").exists() and not list(run_dir.glob(".*.tmp"))
    # resume with nothing but the folder, the flag and a new budget
    end = stopped_at + 7
    resumed = run_cli(f"run_dir={run_dir}", "train.resume=true", f"train.max_steps={end}")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert_bit_identical(run_dir / "last.pt", uninterrupted(base, tmp_path / "whole", end))
    steps = [int(r["step"]) for r in read_metrics(run_dir) if r["train_loss"]]
    assert steps == list(range(1, end + 1))  # metrics.csv: no step lost, none twice


def test_sigkill_at_random_moments_loses_at_most_the_save_interval(
        tiny_train_overrides, tmp_path: Path) -> None:
    base = [*tiny_train_overrides, *NOISY, "train.save_every_minutes=0.0001"]  # ~every step
    run_dir = tmp_path / "run"
    rng = random.Random(7)
    end = 40
    for _ in range(2):
        resume = ["train.resume=true"] if (run_dir / "last.pt").exists() else []
        proc = start(*base, f"run_dir={run_dir}", "train.max_steps=100000", *resume)
        seen = wait_for_step(run_dir, 6 if not resume else 1, proc)
        time.sleep(rng.uniform(0.0, 0.3))
        proc.kill()
        proc.communicate()
        saved = checkpoint.load_checkpoint(run_dir / "last.pt")["progress"]["step"]
        assert saved >= seen - 2  # a save every step, so a kill loses at most the step running
    final = run_cli(f"run_dir={run_dir}", "train.resume=true", f"train.max_steps={end}")
    assert final.returncode == 0, final.stderr[-2000:]
    assert_bit_identical(run_dir / "last.pt",
                         uninterrupted(base, tmp_path / "whole", end))


def test_resume_refuses_a_changed_setting_naming_it(tmp_path: Path) -> None:
    from seq2seq.config import Config

    saved = OmegaConf.structured(Config)
    saved.data.name, saved.data.kind, saved.run_dir = "tiny", "local", str(tmp_path)
    (tmp_path / "config.yaml").write_text(OmegaConf.to_yaml(saved))
    now = OmegaConf.structured(Config)
    now.data.name, now.data.kind, now.run_dir = "tiny", "local", str(tmp_path)
    now.train.resume, now.train.max_minutes = True, 30.0
    cfg = folder_config(now, [f"run_dir={tmp_path}", "train.resume=true", "train.max_minutes=30"])
    assert cfg.train.max_minutes == 30.0 and cfg.train.resume
    now.model.hidden_size = 24
    with pytest.raises(ConfigError, match=r"cannot resume with model.hidden_size=24: the run in .* "
                                          r"has model.hidden_size=256"):
        folder_config(now, ["train.resume=true", "model.hidden_size=24"])
    with pytest.raises(ConfigError, match="a config group would change"):
        folder_config(now, ["train.resume=true", "experiment=debug"])


def test_a_full_disk_is_one_line_and_leaves_no_temp_files(tiny_train_overrides, tmp_path) -> None:
    run_dir = tmp_path / "run"
    proc = start(*tiny_train_overrides, f"run_dir={run_dir}", "train.max_steps=6",
                 prefix="ulimit -f 40")  # 40 KiB per file: the first checkpoint does not fit
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 2, err[-2000:]
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err
    assert "free disk space (or raise the file size limit)" in lines[0]
    assert not list(run_dir.glob(".*.tmp")) and not (run_dir / "last.pt").exists()


def test_an_empty_split_names_the_settings_that_fill_it(monkeypatch) -> None:
    import datasets

    import seq2seq.corpus
    from seq2seq.errors import DataError
    from seq2seq.evaluation.command import load_split

    empty = datasets.Dataset.from_dict({"translation": []})
    monkeypatch.setattr(seq2seq.corpus, "load_corpus", lambda cfg: {"test": empty})
    cfg = OmegaConf.create({"name": "tiny", "src_lang": "es", "tgt_lang": "en"})
    with pytest.raises(DataError, match=r"split 'test' of corpus 'tiny' is empty: .*"
                                        r"data.test_per_bucket.*rebuild it with seq2seq-data"):
        load_split(cfg, "test")


def test_resume_refuses_another_tokenizer_corpus_build_or_an_averaged_checkpoint() -> None:
    from seq2seq.errors import CheckpointError
    from seq2seq.runs.checkpoint import check_identity

    now = {"tokenizer": "tok-a", "corpus": "build-1"}
    ckpt = {"optimizer": {"state": {}}, "identity": dict(now)}
    check_identity(ckpt, now, Path("last.pt"))
    check_identity({"optimizer": {}, "identity": {}}, now, Path("old.pt"))  # from before identities
    with pytest.raises(CheckpointError, match="tokenizer/ is not the one it was trained with"):
        check_identity(ckpt, {**now, "tokenizer": "tok-b"}, Path("last.pt"))
    with pytest.raises(CheckpointError, match="corpus was rebuilt since .build key build-1 -> build-2"):
        check_identity(ckpt, {**now, "corpus": "build-2"}, Path("last.pt"))
    with pytest.raises(CheckpointError, match="holds no optimizer state"):
        check_identity({**ckpt, "optimizer": None}, now, Path("averaged.pt"))
