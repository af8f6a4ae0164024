"""apertium.py with a fake `apertium` on PATH: alignment, re-splitting, missing binary."""

from __future__ import annotations

import logging
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from seq2seq.evaluation import apertium

# A stand-in for the apertium script: upper-cases each paragraph (markers, already upper
# case, come back unchanged as with the real one); a paragraph holding "glue" is merged
# with the next one and one holding "split" comes back as two, as a document translator
# is free to do. Every call is logged to $FAKE_APERTIUM_LOG.
FAKE = r'''#!{python}
import os, sys
args = sys.argv[1:]
if args == ["-V"]:
    print("Apertium 0.0-fake"); sys.exit(0)
with open(os.environ["FAKE_APERTIUM_LOG"], "a") as log:
    log.write(" ".join(args) + "\n")
if args != ["-u", "spa-eng"]:
    print(f"Error: Mode {{args[-1]}} does not exist. Try one of:"); sys.exit(1)
paras = sys.stdin.read().rstrip("\n").split("\n\n")
out = ""
for i, p in enumerate(paras):
    p = p.upper().replace("SPLIT", "SPLIT\n\nTAIL")
    last = i == len(paras) - 1
    out += p + ("" if last else (" " if "GLUE" in p else "\n\n"))
sys.stdout.write(out + "\n")
'''


@pytest.fixture()
def fake_apertium(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "apertium"
    exe.write_text(FAKE.format(python=sys.executable))
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    log = tmp_path / "calls.log"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_APERTIUM_LOG", str(log))
    return log


def _calls(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def test_one_call_keeps_every_line_in_place(fake_apertium: Path) -> None:
    sentences = ["en el principio", "", "creó  dios\nlos cielos", "y la tierra"]
    out = apertium.translate(sentences)
    assert out == ["EN EL PRINCIPIO", "", "CREÓ DIOS LOS CIELOS", "Y LA TIERRA"]
    assert _calls(fake_apertium) == 1  # one batched process for the whole list


def test_merged_and_split_paragraphs_are_realigned(fake_apertium: Path, caplog) -> None:
    sentences = [f"frase {i}" for i in range(9)]
    sentences[3] = "esta glue se pega"
    sentences[6] = "esta split se parte"
    with caplog.at_level(logging.INFO, logger="seq2seq.evaluation.apertium"):
        out = apertium.translate(sentences)
    assert out is not None and len(out) == len(sentences)
    for i in (0, 1, 2, 4, 5, 7, 8):
        assert out[i] == f"FRASE {i}"
    assert out[3] == "ESTA GLUE SE PEGA"
    assert out[6] == "ESTA SPLIT TAIL SE PARTE"  # both halves kept, on one line
    assert _calls(fake_apertium) > 1
    assert "re-split" in caplog.text


def test_missing_apertium_returns_none_with_a_note(tmp_path: Path, monkeypatch, caplog) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing called apertium there
    with caplog.at_level(logging.WARNING, logger="seq2seq.evaluation.apertium"):
        assert apertium.translate(["hola"]) is None
    assert "apt-get install apertium apertium-eng-spa" in caplog.text
    assert apertium.version() is None


def test_missing_pair_returns_none(fake_apertium: Path, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="seq2seq.evaluation.apertium"):
        assert apertium.translate(["hola"], pair="xxx-yyy") is None
    assert "Mode xxx-yyy does not exist" in caplog.text


def test_version_names_apertium(fake_apertium: Path) -> None:
    assert apertium.version().startswith("Apertium 0.0-fake")


def _real_pair_installed() -> bool:
    exe = shutil.which("apertium")
    if exe is None:
        return False
    listed = subprocess.run([exe, "-l"], capture_output=True, text=True, check=False).stdout
    return "spa-eng" in listed.split()


@pytest.mark.skipif(not _real_pair_installed(), reason="apertium spa-eng is not installed")
def test_real_apertium_translates_line_by_line() -> None:
    sentences = ["Y dijo Dios: Sea la luz: y fué la luz.", "En el principio creó Dios",
                 "los cielos y la tierra"]
    out = apertium.translate(sentences)
    assert out is not None and len(out) == 3
    assert "light" in out[0] and "God" in out[1] and "earth" in out[2]
