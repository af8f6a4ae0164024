"""`seq2seq-serve` on the command line: which runs it serves, and bad input as one line."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from seq2seq.config import ServeConfig, validate_serve
from seq2seq.serve.models import CheckpointError, ConfigError, arm_runs, model_specs

REPO = Path(__file__).resolve().parent.parent
CLI = "from seq2seq.cli import serve_main; serve_main()"


def serve_cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", CLI, *args], capture_output=True, env=env,
                          cwd=REPO, timeout=120, text=True)


def one_line_error(proc: subprocess.CompletedProcess, message: str) -> None:
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: "), proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr


def test_no_runs_is_one_line() -> None:
    one_line_error(serve_cli(), "no model given: pass runs=[<run folder>,...] or reproduction=")


def test_missing_run_folder_is_one_line(tmp_path: Path) -> None:
    one_line_error(serve_cli(f"runs=[{tmp_path / 'nope'}]"), f"{tmp_path / 'nope'} does not exist")
    one_line_error(serve_cli(f"reproduction={tmp_path / 'gone'}"), "does not exist: pass the out_dir")


def test_port_in_use_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "best.pt").write_bytes(b"")  # never loaded: the port is refused first
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        one_line_error(serve_cli(f"runs=[{tmp_path}]", f"port={port}"),
                       f"port {port} on 127.0.0.1 is in use: stop the other server or pass another port=")


def cfg(**overrides) -> ServeConfig:
    return OmegaConf.merge(OmegaConf.structured(ServeConfig), overrides)


@pytest.mark.parametrize(("overrides", "message"), [
    ({"runs": ["a"], "reproduction": "b"}, "not both"),
    ({"runs": ["a", "b"], "names": ["x"]}, "one name per run"),
    ({"runs": ["a"], "port": 70000}, "port=70000"),
    ({"runs": ["a"], "limits": {"max_nbest": 11}}, "limits.max_nbest=11 must be <= limits.max_beam=10"),
    ({"runs": ["a"], "limits": {"max_beam": 65, "max_nbest": 1}}, "limits.max_beam=65 must be <= 64"),
    ({"runs": ["a"], "limits": {"max_sentences": 0}}, "limits.max_sentences=0 must be at least 1"),
    ({"runs": ["a"], "limits": {"timeout_s": 0}}, "limits.timeout_s=0"),
    ({"runs": ["a"], "beam": 11}, "beam=11 must be between 1 and limits.max_beam=10"),
    ({"runs": ["a"], "device": "tpu"}, "device='tpu'"),
])
def test_bad_settings_are_config_errors(overrides: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(")):
        validate_serve(cfg(**overrides))


def test_log_level_outside_its_choices_is_refused() -> None:
    from omegaconf.errors import ValidationError

    with pytest.raises(ValidationError, match=r"expected one of \[critical, error, warning, info, debug\]"):
        cfg(runs=["a"], log_level="loud")


def test_default_config_composes_and_binds_loopback() -> None:
    from hydra import compose, initialize_config_dir

    from seq2seq.cli import CONFIG_DIR

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        c = compose("serve", overrides=["reproduction=runs/x", "limits.max_chars=200"])
    assert c.host == "127.0.0.1" and c.limits.max_chars == 200
    validate_serve(c)


def _run(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "best.pt").write_bytes(b"")
    return folder


def test_reproduction_arms_none_first_and_seed_folders(tmp_path: Path) -> None:
    for arm in ("luong", "bahdanau", "none"):
        for seed in (3, 2):
            _run(tmp_path / "arms" / arm / f"seed{seed}")
    (tmp_path / "arms" / "untrained").mkdir()  # no checkpoint: not served
    runs = arm_runs(tmp_path)
    assert [name for name, _ in runs] == ["none", "bahdanau", "luong"]
    assert all(path.endswith("seed2") for _, path in runs)  # the lowest seed by default
    assert all(path.endswith("seed3") for _, path in arm_runs(tmp_path, seed=3))
    with pytest.raises(CheckpointError, match=r"arm none .* has no trained seed7 \(it has \[2, 3\]\)"):
        arm_runs(tmp_path, seed=7)


def test_reproduction_with_one_run_per_arm(tmp_path: Path) -> None:
    _run(tmp_path / "arms" / "none")
    _run(tmp_path / "arms" / "luong")
    assert arm_runs(tmp_path) == [("none", str(tmp_path / "arms" / "none")),
                                  ("luong", str(tmp_path / "arms" / "luong"))]
    (tmp_path / "empty" / "arms" / "luong").mkdir(parents=True)
    with pytest.raises(CheckpointError, match="holds no trained arm"):
        arm_runs(tmp_path / "empty")
    with pytest.raises(CheckpointError, match="holds no arms/ folder"):
        arm_runs(tmp_path / "arms")


def test_run_names_default_to_folders_and_must_differ(tmp_path: Path) -> None:
    a, b = _run(tmp_path / "a" / "seed1"), _run(tmp_path / "b" / "seed1")
    ens = [str(_run(tmp_path / "s1")), str(_run(tmp_path / "s2"))]
    specs = model_specs(cfg(runs=[str(a), str(b), ens]))
    assert [n for n, _ in specs] == ["a/seed1", "b/seed1", f"{tmp_path.name}/s1+{tmp_path.name}/s2"]
    assert specs[2][1] == ens  # an ensemble: one model, two members
    assert [n for n, _ in model_specs(cfg(runs=[str(a)]))] == ["seed1"]
    with pytest.raises(ConfigError, match="same name"):
        model_specs(cfg(runs=[str(a), str(a)]))
    assert [n for n, _ in model_specs(cfg(runs=[str(a), str(a)], names=["x", "y"]))] == ["x", "y"]
