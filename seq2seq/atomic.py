"""Atomic file writes: a reader sees the old file or the complete new one, never half.

Everything a run or a reproduction writes goes through here: the data goes to a temp
file in the same folder (``.<name>.<random>.tmp``), is flushed to disk, then renamed
over the target, and the folder entry is synced so the rename survives a power cut.
A process killed mid-write leaves at most a temp file, which the next run in that
folder removes (:func:`remove_temp_files`).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

TEMP_GLOB = ".*.tmp"


@contextmanager
def atomic_open(path: str | Path, mode: str = "w", encoding: str | None = "utf-8"
                ) -> Iterator[IO[Any]]:
    """Open a temp file for writing (``mode`` "w" or "wb"); on a clean exit it replaces
    ``path``; on an exception it is deleted and ``path`` is untouched."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as err:
        raise OSError(err.errno, err.strerror, str(path)) from None
    try:
        os.chmod(tmp, 0o644)  # mkstemp makes it private; keep the usual mode of a new file
        binary = "b" in mode
        with os.fdopen(fd, mode, encoding=None if binary else encoding,
                       newline=None if binary else "\n") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as err:  # a full disk or a size limit: name the file the user knows
        if err.filename is None:
            raise OSError(err.errno, err.strerror, str(path)) from None
        raise
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    _sync_folder(path.parent)


@contextmanager
def atomic_folder(path: str | Path, keep_existing: bool = False) -> Iterator[Path]:
    """A temp folder beside ``path`` to fill; on a clean exit it replaces ``path`` whole
    (a reader sees the old folder or the complete new one). With ``keep_existing`` a
    ``path`` that appeared meanwhile (another process finished first) is kept and the new
    one dropped. On an exception the temp folder is deleted and ``path`` is untouched."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it private; keep the usual mode of a new folder
        yield tmp
        if path.exists():
            if keep_existing:
                return
            shutil.rmtree(path)
        os.replace(tmp, path)
        _sync_folder(path.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _sync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # some file systems do not open folders; the rename is done anyway
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_text(path: str | Path, text: str) -> None:
    with atomic_open(path) as fh:
        fh.write(text)


def write_bytes(path: str | Path, data: bytes) -> None:
    with atomic_open(path, "wb") as fh:
        fh.write(data)


def write_json(path: str | Path, obj: Any, **kwargs: Any) -> None:
    """``obj`` as JSON (``kwargs`` go to ``json.dumps``), ending in a newline."""
    write_text(path, json.dumps(obj, **kwargs) + "\n")


def remove_temp_files(folder: str | Path) -> list[Path]:
    """Delete the temp files a killed writer left in ``folder`` (not below it); returns them.
    Call it only while no other process writes there (a run holds its folder's lock)."""
    found = sorted(Path(folder).glob(TEMP_GLOB)) if Path(folder).is_dir() else []
    for path in found:
        path.unlink(missing_ok=True)
    return found


def read_json(path: str | Path) -> Any | None:
    """The JSON in ``path``, or None when it is missing or unreadable (a truncated file from
    before writes were atomic, a damaged disk): the caller redoes what it recorded."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def save_figure(fig: Any, path: str | Path, **kwargs: Any) -> None:
    """A matplotlib figure written atomically, in the format its suffix names."""
    path = Path(path)
    with atomic_open(path, "wb") as fh:
        fig.savefig(fh, format=path.suffix.lstrip(".") or "png", **kwargs)
