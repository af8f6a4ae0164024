"""scripts/bf16_parity.py: the runs it asks for, how it reads their dev loss, and its verdict."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

import bf16_parity  # noqa: E402
from conftest import train_in_process  # noqa: E402

HEADER = "step,epoch,train_loss,lr,tgt_tok_per_s,src_tok_per_s,dev_loss,dev_ppl,dev_bleu,elapsed_s\n"


def test_dev_loss_is_read_from_the_validation_row_of_that_step(tmp_path):
    metrics = tmp_path / "metrics.csv"
    assert bf16_parity.dev_loss_at(metrics, 100) is None  # no run yet
    metrics.write_text(HEADER + "100,0,5.5,0.001,6000,5600,,,,48\n"  # a training row only
                       + "100,0,,0.001,,,4.2325,68.9,2.4,91\n" + "200,1,4.4,0.001,6100,5700,,,,95\n")
    assert bf16_parity.dev_loss_at(metrics, 100) == pytest.approx(4.2325)
    assert bf16_parity.dev_loss_at(metrics, 200) is None


@pytest.mark.parametrize(("bf16", "within"), [(3.0299, True), (2.9701, True), (3.0301, False),
                                             (2.9699, False)])
def test_an_arm_passes_within_the_relative_tolerance_either_way(bf16, within):
    r = bf16_parity.compare(3.0, bf16, 0.01)
    assert r["within"] is within
    assert r["relative"] == pytest.approx((bf16 - 3.0) / 3.0)


def test_the_runs_differ_only_in_precision():
    fp32, bf16 = (bf16_parity.train_command("luong", p, 1000, 7, 1, Path("r"), ["x=1"])
                  for p in bf16_parity.PRECISIONS)
    assert [a for a in fp32 if a not in bf16] == ["train.precision=fp32"]
    assert [a for a in bf16 if a not in fp32] == ["train.precision=bf16"]
    assert {"model/attention=luong_deep", "train.seed=7", "train.max_steps=1000",
            "train.valid_every=1000", "train.deterministic=true", "x=1"} <= set(fp32)


def test_its_overrides_train_and_validate_at_the_last_step(tiny_train_overrides, tmp_path):
    """The overrides are a valid seq2seq-train configuration whose run has its dev loss at
    step N (here on the tiny corpus, in fp32, which every CPU has)."""
    cmd = bf16_parity.train_command("bahdanau", "fp32", 4, 1, 1, tmp_path / "run", [])
    # the tiny model and corpus, then the script's schedule again (the tiny one validates every 5)
    run = train_in_process([*tiny_train_overrides, *cmd[1:]])
    assert bf16_parity.dev_loss_at(run / "metrics.csv", 4) is not None


def _fake_training(monkeypatch, losses: dict[str, float], exit_code: int = 0,
                   paths: dict[str, dict[str, str]] | None = None) -> list[str]:
    """seq2seq-train replaced by a script writing metrics.csv with the given dev loss per
    precision (and a summary.json with ``paths[precision]`` as its native choices, on the
    oneDNN route); returns the list of the runs trained (by the log each one writes)."""
    calls: list[str] = []
    run = bf16_parity._run

    def recorded(cmd, log):
        calls.append(log.stem.replace("_", " "))
        return run(cmd, log)

    def command(arm, precision, steps, seed, threads, run_dir, extra):
        code = (f"import pathlib; d = pathlib.Path({str(run_dir)!r}); d.mkdir(exist_ok=True); "
                f"(d / 'metrics.csv').write_text({HEADER!r} + '{steps},0,,0.001,,,"
                f"{losses[precision]},1,1,1\\n'); ")
        if paths is not None:
            summary = json.dumps({"fp32_gemm": "onednn", "native_choices": paths[precision]})
            code += f"(d / 'summary.json').write_text({summary!r}); "
        code += f"raise SystemExit({exit_code})"
        return [sys.executable, "-c", code]

    monkeypatch.setattr(bf16_parity, "train_command", command)
    monkeypatch.setattr(bf16_parity, "_run", recorded)
    monkeypatch.setattr("seq2seq.runtime.bf16_supported", lambda device: True)
    return calls


def test_verdict_json_and_reuse_of_finished_runs(monkeypatch, tmp_path, capsys):
    calls = _fake_training(monkeypatch, {"fp32": 3.0, "bf16": 3.02})
    out = tmp_path / "p"
    assert bf16_parity.main(["--arms", "none,luong", "--steps", "10", "--out", str(out)]) == 0
    record = json.loads((out / "parity.json").read_text())
    assert set(record["arms"]) == {"none", "luong"}
    assert record["arms"]["luong"]["bf16"] == pytest.approx(3.02) and record["arms"]["luong"]["within"]
    assert "cpu" in record and "| luong | 3.0000 | 3.0200 | +0.67% | yes | not recorded |" in capsys.readouterr().out
    assert sorted(calls) == ["luong bf16", "luong fp32", "none bf16", "none fp32"]
    calls.clear()  # a second call finds every run finished and trains nothing
    assert bf16_parity.main(["--arms", "none,luong", "--steps", "10", "--out", str(out)]) == 0
    assert calls == []


def test_an_arm_outside_the_tolerance_fails(monkeypatch, tmp_path, capsys):
    _fake_training(monkeypatch, {"fp32": 3.0, "bf16": 3.1})
    assert bf16_parity.main(["--arms", "none", "--steps", "10", "--out", str(tmp_path)]) == 1
    assert "| none | 3.0000 | 3.1000 | +3.33% | NO | not recorded |" in capsys.readouterr().out


def test_a_failed_training_names_its_log(monkeypatch, tmp_path, capsys):
    _fake_training(monkeypatch, {"fp32": 3.0, "bf16": 3.0}, exit_code=3)
    assert bf16_parity.main(["--arms", "none", "--steps", "10", "--out", str(tmp_path)]) == 2
    assert "training failed: none fp32 (log" in capsys.readouterr().err


def test_a_cpu_without_native_bf16_is_refused(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr("seq2seq.runtime.bf16_supported", lambda device: False)
    assert bf16_parity.main(["--out", str(tmp_path)]) == 2
    assert "no native bf16" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # nothing trained


def test_unknown_arms_are_refused():
    with pytest.raises(SystemExit):
        bf16_parity.parse_args(["--arms", "none,transformer"])


def test_bf16_loss_is_compared_with_the_same_fp32_runs(monkeypatch, tmp_path, capsys):
    """--precision bf16_loss trains only what is missing: the fp32 runs of a bf16
    comparison in the same folder are read again."""
    calls = _fake_training(monkeypatch, {"fp32": 3.0, "bf16": 3.02, "bf16_loss": 2.97})
    out = tmp_path / "p"
    assert bf16_parity.main(["--arms", "none", "--steps", "10", "--out", str(out)]) == 0
    calls.clear()
    assert bf16_parity.main(["--arms", "none", "--steps", "10", "--out", str(out),
                             "--precision", "bf16_loss"]) == 0
    assert calls == ["none bf16 loss"]
    record = json.loads((out / "parity.json").read_text())
    assert record["precision"] == "bf16_loss" and record["arms"]["none"]["bf16_loss"] == 2.97
    assert "| none | 3.0000 | 2.9700 | -1.00% | yes | not recorded |" in capsys.readouterr().out


def test_a_pair_whose_processes_timed_different_paths_is_named(monkeypatch, tmp_path, capsys):
    """Each process times its kernel paths; a pair that took different ones is flagged in
    the table, parity.json and on stderr, with the paths only one run timed left out."""
    loop = "encoder GRU loop 256->256 x2 on 1 thread"
    _fake_training(monkeypatch, {"fp32": 3.0, "bf16": 3.01}, paths={
        "fp32": {loop: "torch", "gru_gates with gradients on 1 thread": "kernel"},
        "bf16": {loop: "kernel", "gru_gates with gradients on 1 thread": "kernel",
                 "cross_entropy_rows/torch.bfloat16 on 1 thread": "kernel"}})
    assert bf16_parity.main(["--arms", "luong", "--steps", "10", "--out", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    said = f"{loop}: torch / kernel"
    assert f"| luong | 3.0000 | 3.0100 | +0.33% | yes | {said} |" in out
    assert "not the precision's alone" in err and said in err
    record = json.loads((tmp_path / "parity.json").read_text())["arms"]["luong"]
    assert record["paths_differ"] == [said]
    assert record["paths"]["fp32"]["fp32 GEMMs"] == "onednn"


def test_a_pair_on_the_same_paths_says_so(monkeypatch, tmp_path, capsys):
    same = {"encoder GRU loop 256->256 x2 on 1 thread": "kernel"}
    _fake_training(monkeypatch, {"fp32": 3.0, "bf16": 2.99}, paths={"fp32": same, "bf16": same})
    assert bf16_parity.main(["--arms", "none", "--steps", "10", "--out", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert "| none | 3.0000 | 2.9900 | -0.33% | yes | the same |" in out and err == ""
