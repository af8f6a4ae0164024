"""The one atomic-write helper: a reader sees the old file (or folder) or the complete new
one; a failure mid-write leaves the old one and no temp behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from seq2seq import atomic


def _entries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_a_failed_file_write_keeps_the_old_file(tmp_path: Path) -> None:
    target = tmp_path / "summary.json"
    atomic.write_json(target, {"steps": 1})
    with pytest.raises(RuntimeError), atomic.atomic_open(target) as fh:
        fh.write('{"steps": ')
        raise RuntimeError("killed mid-write")
    assert atomic.read_json(target) == {"steps": 1}
    assert _entries(tmp_path) == ["summary.json"]


def test_a_folder_is_replaced_whole(tmp_path: Path) -> None:
    target = tmp_path / "dataset"
    with atomic.atomic_folder(target) as tmp:
        (tmp / "old.arrow").write_text("old")
    with atomic.atomic_folder(target) as tmp:
        assert not (tmp / "old.arrow").exists() and tmp.parent == tmp_path
        (tmp / "new.arrow").write_text("new")
    assert _entries(target) == ["new.arrow"]
    assert _entries(tmp_path) == ["dataset"]


def test_a_failed_folder_write_keeps_the_old_folder(tmp_path: Path) -> None:
    target = tmp_path / "spm"
    with atomic.atomic_folder(target) as tmp:
        (tmp / "a.model").write_text("a")
    with pytest.raises(RuntimeError), atomic.atomic_folder(target) as tmp:
        (tmp / "b.model").write_text("half")
        raise RuntimeError("killed mid-write")
    assert _entries(target) == ["a.model"]
    assert _entries(tmp_path) == ["spm"]


def test_keep_existing_keeps_the_folder_another_process_finished(tmp_path: Path) -> None:
    target = tmp_path / "spm"
    with atomic.atomic_folder(target, keep_existing=True) as tmp:
        (tmp / "mine.model").write_text("mine")
        target.mkdir()  # another process got there first
        (target / "theirs.model").write_text("theirs")
    assert _entries(target) == ["theirs.model"]
    assert _entries(tmp_path) == ["spm"]
