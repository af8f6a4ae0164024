"""TensorBoard event files of a training run: tags, attention images, resume without duplicates."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from conftest import train_in_process

from seq2seq.runs.tensorboard import BOARD_DIR, Board

pytest.importorskip("tensorboard")  # a dependency; the skip only guards a broken install
from tensorboard.backend.event_processing.event_accumulator import (  # noqa: E402
    EventAccumulator,
)


def _train(overrides: list[str], run_dir: Path, *extra: str) -> Path:
    return train_in_process([*overrides, "train.tensorboard=true",
                             "train.valid_at_epoch_end=false", f"run_dir={run_dir}", *extra])


def _events(run_dir: Path) -> EventAccumulator:
    acc = EventAccumulator(str(run_dir / BOARD_DIR), size_guidance={"scalars": 0, "images": 0})
    acc.Reload()
    return acc


def _steps(acc: EventAccumulator, tag: str) -> list[int]:
    return [e.step for e in acc.Scalars(tag)]


@pytest.fixture(scope="module")
def board_run(tiny_train_overrides: list[str], tmp_path_factory) -> Path:
    return _train(tiny_train_overrides, tmp_path_factory.mktemp("board") / "run",
                  "train.max_steps=10", "model/attention=bahdanau")


def test_event_files_hold_the_training_and_dev_numbers(board_run: Path) -> None:
    acc = _events(board_run)
    scalars = set(acc.Tags()["scalars"])
    assert {"train/loss", "train/lr", "train/tgt_tok_per_s", "dev/loss", "dev/ppl",
            "dev/bleu", "dev_bleu_by_source_words/all", "dev_chrf_by_source_words/all",
            "dev_bleu_by_source_words/1-10"} <= scalars
    assert _steps(acc, "train/loss") == [2, 4, 6, 8, 10]  # log_every=2
    assert _steps(acc, "dev/loss") == [5, 10]  # valid_every=5
    metrics = (board_run / "metrics.csv").read_text().splitlines()
    first_dev = next(r for r in metrics[1:] if r.split(",")[0] == "5" and r.split(",")[6])
    assert acc.Scalars("dev/loss")[0].value == pytest.approx(float(first_dev.split(",")[6]),
                                                              rel=1e-4)


def test_attention_images_of_fixed_dev_sentences_at_every_validation(board_run: Path) -> None:
    acc = _events(board_run)
    images = set(acc.Tags()["images"])
    assert {"attention/short", "attention/medium", "attention/long"} == images
    for tag in images:
        shots = acc.Images(tag)
        assert [s.step for s in shots] == [5, 10]
        assert shots[0].encoded_image_string[:4] == b"\x89PNG"


def test_a_model_without_attention_gets_no_images(tiny_train_overrides, tmp_path) -> None:
    run = _train(tiny_train_overrides, tmp_path / "none", "train.max_steps=5",
                 "model/attention=none")
    acc = _events(run)
    assert acc.Tags()["images"] == [] and "dev/loss" in acc.Tags()["scalars"]


def test_a_resumed_run_does_not_log_a_step_twice(tiny_train_overrides, tmp_path) -> None:
    from torch.utils.tensorboard import SummaryWriter

    run = _train(tiny_train_overrides, tmp_path / "run", "train.max_steps=10")
    time.sleep(1.1)  # event file names carry the second they were opened
    # what a killed run logged after its last checkpoint (step 10): a step the resume redoes
    lost = SummaryWriter(log_dir=str(run / BOARD_DIR))
    lost.add_scalar("train/loss", 999.0, 12)
    lost.close()
    time.sleep(1.1)
    _train(tiny_train_overrides, run, "train.max_steps=14", "train.resume=true")
    acc = _events(run)
    steps = _steps(acc, "train/loss")
    assert steps == [2, 4, 6, 8, 10, 12, 14]
    assert all(e.value != 999.0 for e in acc.Scalars("train/loss"))


def test_tensorboard_missing_is_one_warning_and_no_files(tmp_path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails
    warnings: list[str] = []
    board = Board(tmp_path, None, True, warnings.append)
    board.scalars({"step": 1, "train_loss": 1.0})
    board.close()
    assert not board.enabled and not (tmp_path / BOARD_DIR).exists()
    assert len(warnings) == 1 and "pip install tensorboard" in warnings[0]
    off = Board(tmp_path, None, False, warnings.append)
    assert not off.enabled and len(warnings) == 1
