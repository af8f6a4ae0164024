"""Batched file translation: order, count, n-best TSV, alignment JSON lines, failures, CLI."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from fixtures_translate import trained_run, trained_word_translator, word_translator

from seq2seq.inference.command import run_filter
from seq2seq.inference.translate_file import Writers, hard_alignment, translate_lines
from seq2seq.inference.translator import Translator

LINES = ["los cielos", "", "la tierra", "dios", "creó dios los cielos y la tierra",
         "en el principio", "y la tierra y los cielos", "dios"]


def _raw(lines: list[str]) -> io.BytesIO:
    return io.BytesIO("".join(f"{line}\n" for line in lines).encode())


def _run(translator: Translator, lines: list[str], nbest: int = 1, hard: bool = False,
         block_lines: int = 3, beam: int = 3) -> tuple[str, str, str]:
    out, err, align = io.StringIO(), io.StringIO(), io.StringIO()
    n = translate_lines(translator, _raw(lines), Writers(out, nbest, align, hard, flush=False),
                        err, beam=beam, nbest=nbest, batch_tokens=6, block_lines=block_lines)
    assert n == len(lines)
    return out.getvalue(), err.getvalue(), align.getvalue()


def test_batched_output_is_in_input_order_and_equals_one_by_one() -> None:
    t = trained_word_translator()
    out, err, _ = _run(t, LINES)
    one_by_one = [t.translate([line], beam=3)[0].text for line in LINES]
    assert out.split("\n") == [*one_by_one, ""]
    assert err == ""
    assert out.split("\n")[1] == "" and out.split("\n")[2] == "the earth"
    filtered = io.StringIO()
    run_filter(t, _raw(LINES), filtered, io.StringIO(), beam=3)
    assert filtered.getvalue() == out  # the streaming filter writes the same lines


def test_nbest_tsv_parses_with_ranks_and_sorted_scores() -> None:
    t = trained_word_translator()
    out, _, _ = _run(t, LINES, nbest=3)
    rows = [line.split("\t") for line in out.splitlines()]
    assert all(len(r) == 4 for r in rows)
    by_line: dict[int, list[tuple[int, float, str]]] = {}
    for line, rank, score, text in rows:
        by_line.setdefault(int(line), []).append((int(rank), float(score), text))
    assert sorted(by_line) == list(range(1, len(LINES) + 1))
    for line, hyps in by_line.items():
        assert [r for r, _, _ in hyps] == list(range(1, len(hyps) + 1))
        assert [s for _, s, _ in hyps] == sorted((s for _, s, _ in hyps), reverse=True)
        expected = 1 if not LINES[line - 1] else 3
        assert len(hyps) == expected
        alone = t.translate([LINES[line - 1]], beam=3, nbest=3)[0]
        assert [h[2] for h in hyps] == [a.text for a in [alone, *alone.alternatives]]
        assert hyps[0][1] == pytest.approx(alone.score, abs=1e-4)


def test_soft_alignments_are_one_json_line_per_input_line() -> None:
    t = trained_word_translator()
    out, _, align = _run(t, LINES)
    records = [json.loads(line) for line in align.splitlines()]
    assert [r["line"] for r in records] == list(range(1, len(LINES) + 1))
    for record, line, text in zip(records, LINES, out.splitlines(), strict=True):
        assert record["source"] == line and record["translation"] == text
        if not line:
            assert record["attention"] is None and record["src_tokens"] == []
            continue
        weights = np.array(record["attention"])
        assert weights.shape == (len(record["tgt_tokens"]), len(record["src_tokens"]))
        assert np.allclose(weights.sum(axis=1), 1.0, atol=1e-3)  # each row a distribution


def test_hard_alignments_are_pharaoh_pairs_of_the_argmax() -> None:
    attention = np.array([[0.1, 0.9, 0.0], [0.7, 0.2, 0.1]])
    assert hard_alignment(attention) == "1-0 0-1"
    t = trained_word_translator()
    _, _, align = _run(t, LINES, hard=True)
    for record in map(json.loads, align.splitlines()):
        if not record["source"]:
            assert record["alignment"] is None
            continue
        pairs = [tuple(map(int, p.split("-"))) for p in record["alignment"].split()]
        assert [i for _, i in pairs] == list(range(len(record["tgt_tokens"])))
        assert all(0 <= j < len(record["src_tokens"]) for j, _ in pairs)


def test_a_model_without_attention_writes_null_alignments() -> None:
    _, _, align = _run(word_translator("none"), ["dios", "la tierra"])
    assert [json.loads(line)["attention"] for line in align.splitlines()] == [None, None]


class _Flaky:
    """A translator that fails on one sentence, the way an unforeseen bug would."""

    def __init__(self, inner: Translator, bad: str) -> None:
        self.inner, self.bad = inner, bad
        self.max_src_tokens = inner.max_src_tokens

    def translate(self, sentences, **kwargs):
        if self.bad in sentences:
            raise RuntimeError("boom")
        return self.inner.translate(sentences, **kwargs)


def test_a_failing_line_comes_back_empty_and_the_rest_is_translated() -> None:
    t = trained_word_translator()
    out, err, _ = _run(_Flaky(t, "la tierra"), LINES)
    lines = out.split("\n")[:-1]
    assert len(lines) == len(LINES) and lines[2] == ""
    assert lines[0] == "the heaven" and lines[3] == "god"
    assert err == "warning: line 3: translation failed unexpectedly; writing an empty line\n"


def test_invalid_utf8_and_cut_inputs_warn_with_the_line_number() -> None:
    t = word_translator(max_src_tokens=2)
    out, err = io.StringIO(), io.StringIO()
    translate_lines(t, io.BytesIO(b"dios\n\xff la\nlos cielos y la tierra\n"),
                    Writers(out, 1, None, False, flush=False), err, beam=2)
    assert len(out.getvalue().splitlines()) == 3
    assert "line 2: invalid UTF-8" in err.getvalue() and "line 3: input cut" in err.getvalue()


# ---------------------------------------------------------------- the command line

REPO = Path(__file__).resolve().parent.parent
CLI = "from seq2seq.cli import translate_main; translate_main()"


def cli(*args: str, stdin=subprocess.DEVNULL) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "LC_ALL": "C", "LANG": "C"}
    return subprocess.run([sys.executable, "-c", CLI, *args], stdin=stdin, capture_output=True,
                          env=env, cwd=REPO, timeout=120)


@pytest.fixture(scope="module")
def run_dir(tiny_train_overrides: list[str]) -> Path:
    return trained_run(tuple(tiny_train_overrides))


def test_file_mode_end_to_end(run_dir: Path, tmp_path: Path) -> None:
    lines = ["el perro rojo ve la casa", "", "la niña bebe el agua", "el gato come pan hoy"]
    src = tmp_path / "in.es"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    proc = cli(f"run={run_dir}", f"input={src}", f"output={tmp_path / 'out.en'}", "beam=3",
               "nbest=2", f"alignments={tmp_path / 'align.jsonl'}")
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout == b"" and proc.stderr == b""  # no progress bar when stderr is no terminal
    rows = [r.split("\t") for r in (tmp_path / "out.en").read_text("utf-8").splitlines()]
    expected = Translator.from_run(run_dir).translate(lines, beam=3, nbest=2)
    assert [r[3] for r in rows if r[1] == "1"] == [e.text for e in expected]
    records = [json.loads(x) for x in (tmp_path / "align.jsonl").read_text("utf-8").splitlines()]
    assert [r["source"] for r in records] == lines
    assert not list(tmp_path.glob(".*.tmp"))  # written atomically, nothing left behind
    # a file on standard input is translated the same way, in the C locale too (UTF-8 out)
    with src.open("rb") as fh:
        piped = cli(f"run={run_dir}", "beam=3", stdin=fh)
    assert piped.returncode == 0, piped.stderr.decode()
    best = Translator.from_run(run_dir).translate(lines, beam=3)
    assert piped.stdout.decode("utf-8").split("\n") == [e.text for e in best] + [""]


def test_file_mode_errors_are_one_line(run_dir: Path, tmp_path: Path) -> None:
    proc = cli(f"run={run_dir}", f"input={tmp_path / 'missing.es'}")
    err = proc.stderr.decode()
    assert proc.returncode == 2 and err.count("\n") == 1 and "cannot read input=" in err
    proc = cli(f"run={run_dir}", f"input={run_dir / 'config.yaml'}", "alignment=fuzzy")
    err = proc.stderr.decode()  # refused by Hydra while composing: its short report
    assert proc.returncode == 1 and "expected one of [soft, hard]" in err and "Traceback" not in err


def test_batches_side_by_side_equal_one_at_a_time() -> None:
    """workers=2: the same translations, scores, n-best lists and alignments, in input order,
    as one batch at a time; torch's thread count is back afterwards."""
    import torch

    t = trained_word_translator()
    before = torch.get_num_threads()
    serial = _run(t, LINES * 3, nbest=2, block_lines=100)
    t.workers = 2
    try:
        parallel = _run(t, LINES * 3, nbest=2, block_lines=100)
    finally:
        t.workers = 1
    assert parallel == serial
    assert torch.get_num_threads() == before


def test_workers_keep_order_autocast_and_errors() -> None:
    """in_workers: results in item order, the caller's autocast inside every worker (it is
    thread-local), one torch thread each while they run, and a worker's error raised."""
    import torch

    from seq2seq.inference.workers import in_workers

    def job(i: int) -> tuple[int, bool, int]:
        return i, torch.is_autocast_enabled("cpu"), torch.get_num_threads()

    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = list(in_workers(job, range(7), 3))
    assert got == [(i, True, 1) for i in range(7)]
    assert [x[1] for x in in_workers(job, range(3), 2)] == [False] * 3

    def fail(i: int) -> int:
        if i == 4:
            raise ValueError("batch 4")
        return i

    with pytest.raises(ValueError, match="batch 4"):
        list(in_workers(fail, range(6), 2))


def test_auto_workers_follow_the_timings(monkeypatch: pytest.MonkeyPatch) -> None:
    """workers=-1 takes one batch per thread only when the probe timed them side by side
    clearly faster; workers=N is taken as given; the filter and the prompt use 1."""
    from types import SimpleNamespace

    import torch

    from seq2seq.inference import command, workers

    t = trained_word_translator()
    cfg = SimpleNamespace(workers=-1, batch_tokens=60, beam=2)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        margin = workers.MIN_SPEEDUP  # 2 s one after another against side by side:
        for side_by_side_s, expected in ((1.0, 2), (2.0 / margin / 1.01, 2), (2.0 / margin / 0.99, 1)):
            def timed(fn, device, s=side_by_side_s):  # one batch alone 1 s: 2 s one after another
                return s if fn.__name__ == "side_by_side" else 1.0
            monkeypatch.setattr(workers, "timed", timed)
            assert command.choose_workers(cfg, t, batched=True) == expected
        assert command.choose_workers(cfg, t, batched=False) == 1
        assert command.choose_workers(SimpleNamespace(workers=3, batch_tokens=60, beam=2), t,
                                      batched=True) == 3
        torch.set_num_threads(1)
        assert command.choose_workers(cfg, t, batched=True) == 1  # one thread: nothing to split
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("bf16", [False, True])
def test_auto_workers_are_timed_again_in_bf16(monkeypatch: pytest.MonkeyPatch, bf16: bool) -> None:
    """The first workers probe runs in fp32; when the precision probe then picks bf16,
    file mode times the workers again under bf16 autocast and keeps that answer."""
    from types import SimpleNamespace

    import torch

    from seq2seq import precision, runtime
    from seq2seq.inference import command, workers

    t = trained_word_translator()
    seen: list[bool] = []

    def fake_workers(n, model, batch_tokens, beam):
        seen.append(torch.is_autocast_enabled("cpu"))
        return (2 if seen[-1] else 1), "fake"

    monkeypatch.setattr(workers, "choose_workers", fake_workers)
    monkeypatch.setattr(runtime, "bf16_supported", lambda device: True)
    monkeypatch.setattr(command, "choose_precision",
                        lambda cfg, tr, batched: precision.of_name("bf16" if bf16 else "fp32"))
    cfg = SimpleNamespace(workers=-1, batch_tokens=60, beam=2, precision="auto")
    choice = command.choose_speed(cfg, t, batched=True)
    assert choice.bf16 is bf16 and t.bf16 is bf16
    assert seen == ([False, True] if bf16 else [False])
    assert t.workers == (2 if bf16 else 1)
    seen.clear()
    command.choose_speed(cfg, t, batched=False)  # the filter: one sentence at a time, no probe
    assert seen == [] and t.workers == 1
    cfg.workers = 3  # given, not timed: asked once, not again under bf16
    command.choose_speed(cfg, t, batched=True)
    assert len(seen) == 1
