"""Hydra sweeps: `seq2seq-train -m ...` gives every job its own run folder; Slurm composes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf

from seq2seq.config import CONFIG_DIR

REPO = Path(__file__).resolve().parent.parent


def _hydra_cfg(*overrides: str):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose("config", overrides=list(overrides), return_hydra_config=True)


def test_local_multirun_trains_each_job_into_its_own_folder(tiny_train_overrides, tmp_path
                                                            ) -> None:
    sweep = tmp_path / "sweep"
    cmd = [sys.executable, "-c", "from seq2seq.cli import train_main; train_main()", "-m",
           "model/attention=none,luong", *tiny_train_overrides, "train.max_steps=2",
           "train.valid_every=2", "train.valid_bleu_sentences=4", f"hydra.sweep.dir={sweep}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, check=False,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = sorted(p.parent for p in sweep.rglob("summary.json"))
    assert len(runs) == 2
    for run, attention in zip(runs, ("luong", "none"), strict=True):
        # named after the job's overrides; file paths and run_dir are left out of the name
        assert run.relative_to(sweep).as_posix().startswith("data.name=tiny,data=local,")
        assert f"model/attention={attention}," in run.relative_to(sweep).as_posix()
        assert "data.root" not in str(run.relative_to(sweep)) and "run_dir" not in str(run)
        saved = OmegaConf.load(run / "config.yaml")
        assert saved.run_dir == str(run)  # the trainer wrote into the job's folder
        assert saved.model.attention.name == attention
        assert (run / "best.pt").is_file() and (run / ".hydra" / "overrides.yaml").is_file()
    assert not (tmp_path / "runs").exists()  # nothing went to run_dir's shared default


def test_single_run_keeps_its_run_dir() -> None:
    cfg = _hydra_cfg("run_dir=runs/mine")
    assert cfg.run_dir == "runs/mine" and cfg.hydra.run.dir == "runs/mine"
    assert OmegaConf.to_container(_hydra_cfg(), resolve=False)["run_dir"].startswith("runs/${now:")


@pytest.mark.parametrize("launcher", ["submitit_slurm", "slurm"])
def test_slurm_launcher_composes_without_a_cluster(launcher: str) -> None:
    cfg = _hydra_cfg(f"hydra/launcher={launcher}", "hydra.launcher.partition=gpu",
                     "model/attention=none")
    lc = cfg.hydra.launcher
    assert lc._target_.endswith("submitit_launcher.SlurmLauncher")
    assert lc.partition == "gpu" and lc.timeout_min > 0
    if launcher == "slurm":  # the project's defaults on top of the plugin's
        assert (lc.gpus_per_node, lc.tasks_per_node, lc.cpus_per_task) == (1, 1, 8)
    slurm = instantiate(lc)  # builds the launcher; submitting would need sbatch
    assert type(slurm).__name__ == "SlurmLauncher"
    assert slurm.params["gpus_per_node"] == lc.gpus_per_node


def test_joblib_launcher_composes() -> None:
    cfg = _hydra_cfg("hydra/launcher=joblib", "hydra.launcher.n_jobs=2")
    assert cfg.hydra.launcher._target_.endswith("JoblibLauncher")
    assert cfg.hydra.launcher.n_jobs == 2
