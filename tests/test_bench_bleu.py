"""scripts/bench_bleu.py (`benchmark.py --minutes M --mark-minutes K`) and
scripts/plot_bleu_minutes.py: the mark schedule, JoeyNMT's checkpoint steps and times,
the results JSON as marks come in, and the plot. None of it needs JoeyNMT."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

import bench_bleu  # noqa: E402
import bench_bleu_joey  # noqa: E402
import bench_joey  # noqa: E402
import benchmark  # noqa: E402
import plot_bleu_minutes  # noqa: E402

from seq2seq.errors import ConfigError, Seq2SeqError  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_mark_schedule():
    assert bench_bleu.mark_schedule(30, 5) == [5, 10, 15, 20, 25, 30]
    assert bench_bleu.mark_schedule(16, 5) == [5, 10, 15, 16]  # M itself is always a mark
    assert bench_bleu.mark_schedule(1, 0.5) == [0.5, 1]
    assert bench_bleu.mark_schedule(0.3, 0.1) == [0.1, 0.2, 0.3]  # no float drift past M
    assert bench_bleu.mark_schedule(10, 0) == [10]  # 0: at M only
    assert bench_bleu.mark_schedule(3, 5) == [3]
    with pytest.raises(ConfigError, match="--mark-minutes"):
        bench_bleu.mark_schedule(10, -1)
    with pytest.raises(ConfigError, match="--minutes"):
        bench_bleu.mark_schedule(0, 5)


def test_mark_options_and_defaults():
    args = benchmark.parse_args(["--minutes", "30"])
    assert bench_bleu.mark_settings(args) == (5.0, 500)  # every 5 min, --decode-sentences
    args = benchmark.parse_args(["--quick", "--minutes", "1", "--mark-minutes", "0.5",
                                 "--mark-sentences", "40", "--full-test-at-end"])
    assert bench_bleu.mark_settings(args) == (0.5, 40) and args.full_test_at_end
    assert bench_bleu.mark_settings(benchmark.parse_args(["--quick"]))[1] == 10
    with pytest.raises(ConfigError, match="--mark-minutes"):
        benchmark.parse_args(["--minutes", "30", "--mark-minutes", "-5"])


@pytest.mark.parametrize(("every", "last", "rate", "freq"), [
    (5, 30, 28.3, 28), (5, 15, 10, 10), (0, 10, 37.4, 75), (0.5, 1, 0.3, 1), (5, 10, 1e-3, 1)])
def test_joey_checkpoints_come_about_every_fifth_of_a_mark(every, last, rate, freq):
    got = bench_bleu_joey.joey_checkpoint_every(every, last, rate)
    assert got == freq
    cap = bench_bleu_joey.joey_update_cap(last, rate, got)
    assert cap % got == 0 and cap >= 2 * got  # JoeyNMT saves a checkpoint at its last update
    assert cap >= bench_bleu_joey.UPDATE_CAP_FACTOR * last * rate - 1  # far past the last mark
    assert 1 <= bench_bleu_joey.joey_log_every(got) <= 100 and got % bench_bleu_joey.joey_log_every(got) == 0


def test_joey_log_every_divides_its_validation_freq():
    assert bench_bleu_joey.joey_log_every(840) == 84
    assert bench_bleu_joey.joey_log_every(97) == 97 and bench_bleu_joey.joey_log_every(101) == 1


def test_each_mark_takes_the_first_checkpoint_that_reached_it():
    times = {u: {"train_s": s, "train_wall_s": s + 5} for u, s in
             ((28, 58.0), (56, 121.0), (84, 179.9), (112, 240.0), (140, 301.0), (168, 362.0))}
    assert bench_bleu_joey.pick_mark_checkpoints([1, 2, 3, 4, 5], times) == [56, 56, 112, 112, 140]
    assert bench_bleu_joey.pick_mark_checkpoints([6], times) == [168]
    with pytest.raises(Seq2SeqError, match="before the 7-minute mark.*6.03 min at update 168"):
        bench_bleu_joey.pick_mark_checkpoints([5, 7], times)
    with pytest.raises(Seq2SeqError, match="its last checkpoint: none"):
        bench_bleu_joey.pick_mark_checkpoints([1], {})


# A stand-in for `python -m joeynmt train` (run by PEAK_WRAPPER): it logs a checkpoint
# every 0.05 s whose timestamp is one more minute of training, up to 400 (20 s), and on
# Ctrl-C logs that and exits 1 as JoeyNMT would.
FAKE_JOEY = """\
import sys, time
stamp = lambda m: f"2026-12-01 10:{m:02d}:00,000"
print(stamp(0) + " - INFO - joeynmt.training - EPOCH 1", flush=True)
try:
    for m in range(1, 401):
        time.sleep(0.05)
        print(f"2026-12-01 {10 + m // 60:02d}:{m % 60:02d}:00,000 - INFO - joeynmt.training - "
              f"Epoch 1, Step: {10 * m}, Batch Loss: 5.0, Tokens per Sec: 1000, Lr: 0.001", flush=True)
        print(f"2026-12-01 {10 + m // 60:02d}:{m % 60:02d}:00,000 - INFO - joeynmt.training - "
              f"Checkpoint saved in /w/{10 * m}.ckpt.", flush=True)
except KeyboardInterrupt:
    print("INTERRUPTED", flush=True)
    sys.exit(1)
"""


def test_joey_training_is_stopped_once_a_checkpoint_passes_the_last_mark(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_joey, "JOEY_PYTHON", Path(sys.executable))
    monkeypatch.setattr(bench_joey, "PEAK_WRAPPER", FAKE_JOEY)
    cfg = {"name": "fake", "training": {"updates": 4000}}
    res = bench_bleu_joey.train_until(cfg, tmp_path, bench_bleu_joey.passed(3), timeout=60, poll_s=0.1)
    text = Path(res["log"]).read_text()
    assert res["stopped"] and "INTERRUPTED" in text  # stopped by Ctrl-C, not run to its end
    times = bench_bleu_joey.joey_mark_times(text)
    assert max(t["train_s"] for t in times.values()) >= 180  # the last mark was reached
    assert max(times) < 4000  # and it stopped long before its update cap
    assert bench_bleu_joey.pick_mark_checkpoints([1, 2, 3], times) == [10, 20, 30]
    assert res["tgt_tok_per_s"] == 1000


def test_joey_training_that_ignores_ctrl_c_is_killed(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_joey, "JOEY_PYTHON", Path(sys.executable))
    monkeypatch.setattr(bench_joey, "PEAK_WRAPPER",
                        "import signal; signal.signal(signal.SIGINT, signal.SIG_IGN)\n" + FAKE_JOEY)
    monkeypatch.setattr(bench_bleu_joey, "STOP_GRACE_S", 0.5)
    res = bench_bleu_joey.train_until({"name": "deaf", "training": {"updates": 4000}}, tmp_path,
                                      bench_bleu_joey.passed(2), timeout=60, poll_s=0.1)
    text = Path(res["log"]).read_text()
    assert res["stopped"] and "INTERRUPTED" not in text  # it never saw Ctrl-C, it was killed
    assert max(bench_bleu_joey.joey_mark_times(text)) < 4000  # long before its own end


def test_joey_training_that_ends_early_keeps_its_own_exit_status(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_joey, "JOEY_PYTHON", Path(sys.executable))
    monkeypatch.setattr(bench_joey, "PEAK_WRAPPER", "import sys; print('boom'); sys.exit(3)")
    with pytest.raises(Seq2SeqError, match=r"(?s)joeynmt train failed \(exit 3\).*boom"):
        bench_bleu_joey.train_until({"name": "bad", "training": {}}, tmp_path,
                                    bench_bleu_joey.passed(1), timeout=60, poll_s=0.1)


JOEY_LOG = """\
2026-12-01 22:18:11,678 - INFO - joeynmt.training - Train config:
2026-12-01 22:18:11,678 - INFO - joeynmt.training - EPOCH 1
2026-12-01 22:18:33,471 - INFO - joeynmt.training - Epoch   1, Step:       10, Batch Loss: 7.1
2026-12-01 22:20:11,000 - INFO - joeynmt.prediction - Predicting 20 example(s)... (Greedy)
Predicting...: 100%|##########| 20/20 [00:00<00:00, 46.07it/s]
2026-12-01 22:20:12,500 - INFO - joeynmt.prediction - Generation took 0.4372[sec].
2026-12-01 22:20:13,000 - INFO - joeynmt.training - Checkpoint saved in /w/joey/140.ckpt.
2026-12-01 22:20:13,100 - INFO - joeynmt.training - EPOCH 2
2026-12-01 22:22:11,000 - INFO - joeynmt.prediction - Predicting 20 example(s)... (Greedy)
2026-12-01 22:22:12,000 - INFO - joeynmt.training - Checkpoint saved in /w/joey/280.ckpt.
2026-12-01 22:22:40,000 - INFO - joeynmt.training - Training ended since maximum num. of updates 300 was reached.
2026-12-01 22:22:41,000 - INFO - joeynmt.training - Checkpoint saved in /w/joey/300.ckpt.
2026-12-01 22:22:41,500 - INFO - joeynmt.training - Checkpoint saved in /w/joey/300.ckpt.
"""


def test_joey_mark_times_from_its_log():
    times = bench_bleu_joey.joey_mark_times(JOEY_LOG)
    assert set(times) == {140, 280, 300}
    assert times[140]["train_wall_s"] == pytest.approx(121.322)  # 22:18:11.678 -> 22:20:13.000
    assert times[140]["train_s"] == pytest.approx(121.322 - 2.0)  # its validation took 2 s
    assert times[280]["train_s"] == pytest.approx(240.322 - 3.0)
    assert times[300]["train_wall_s"] == pytest.approx(269.322)  # the first save of step 300
    assert times[300]["train_s"] == pytest.approx(269.322 - 3.0)


def fake_decoded(bleu: float, beam5_rate: float, n: int = 40) -> dict:
    return {"beam5": {"bleu": bleu, "sent_per_s": beam5_rate, "seconds": n / beam5_rate,
                      "sentences": n, "signature": "nrefs:1|case:mixed|..."},
            "greedy": {"bleu": bleu - 1, "sent_per_s": 3 * beam5_rate, "seconds": n / beam5_rate / 3,
                       "sentences": n, "signature": "nrefs:1|case:mixed|..."}}


def fake_results(tmp_path: Path, marks: list[float] = (5, 10, 15)) -> tuple[dict, Path]:
    """The results of a 15-minute run with 5-minute marks, written mark by mark."""
    out = tmp_path / "res.json"
    results = {"cpu": {"model": "Test CPU @ 2.0GHz", "cores": 2, "flags": []},
               "args": {"threads": 2}}
    log = bench_bleu.MarkLog(results, str(out), {"minutes": marks[-1], "mark_minutes": 5,
                                                  "marks": list(marks), "test_sentences": 40,
                                                  "threads": 2})
    assert json.loads(out.read_text())["equal_time"]["arms"] == {}  # written before any mark
    for arm in ("bahdanau", "luong"):
        for i, m in enumerate(marks, 1):
            log.add(arm, "ours", bench_bleu.mark_record(m, 400 * i, 60 * m, 55 * m,
                                                        fake_decoded(5.0 * i, 40.0)))
            on_disk = json.loads(out.read_text())["equal_time"]["arms"][arm]["ours"]["marks"]
            assert len(on_disk) == i  # every mark is on disk as soon as it is measured
        for i, m in enumerate(marks, 1):
            log.add(arm, "joey", bench_bleu.mark_record(m, 140 * i, 61 * m, 58 * m,
                                                        fake_decoded(1.0 * i, 8.0)))
        log.arm(arm).update(bench_bleu.final_ratios(log.arm(arm)))
    log.write()
    return results, out


def test_marks_json_shape(tmp_path, capsys):
    results, out = fake_results(tmp_path)
    lines = [x for x in capsys.readouterr().out.splitlines() if "min mark" in x]
    assert len(lines) == 12  # one line per mark, toolkit and arm
    assert lines[0].startswith("5 min mark, bahdanau, ours: 400 steps")
    saved = json.loads(out.read_text())
    assert saved == json.loads(json.dumps(results))
    arm = saved["equal_time"]["arms"]["bahdanau"]
    for side in ("ours", "joey"):
        marks = arm[side]["marks"]
        assert [m["minutes"] for m in marks] == [5, 10, 15]
        for m in marks:
            assert {"minutes", "train_s", "train_wall_s", "steps", "bleu_beam5", "bleu_greedy",
                    "beam5_sent_per_s", "greedy_sent_per_s", "sentences"} <= set(m)
    assert arm["ratio_beam5_sent_per_s"] == pytest.approx(5.0)
    assert arm["ratio_greedy_sent_per_s"] == pytest.approx(5.0)


def test_plot_writes_a_png(tmp_path):
    _, res = fake_results(tmp_path)
    png = tmp_path / "docs" / "bleu_per_minute.png"
    assert plot_bleu_minutes.main(["--json", str(res), "--out", str(png)]) == png
    data = png.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 5000
    series = plot_bleu_minutes.series(json.loads(res.read_text()))
    assert {(t, a) for t, a, *_ in series} == {(t, a) for t in ("ours", "joey")
                                               for a in ("bahdanau", "luong")}
    assert series[0][2] == [5, 10, 15] and series[0][3] == [5.0, 10.0, 15.0]  # wall minutes
    results = json.loads(res.read_text())
    assert "Test CPU @ 2.0GHz, 2 threads" in plot_bleu_minutes.cpu_title(results)
    assert "capped" not in plot_bleu_minutes.cpu_title(results)


def test_plot_title_names_instruction_set_caps():
    capped = {"cpu": {"model": "Test CPU", "kernels": "AVX2",
                      "isa_caps": {"ATEN_CPU_CAPABILITY": "avx2"}}, "args": {"threads": 2}}
    assert plot_bleu_minutes.cpu_title(capped) == "Test CPU, 2 threads, capped to AVX2 instructions"


def one_arm(results: dict, arm: str) -> dict:
    return {**results, "equal_time": {**results["equal_time"],
                                      "arms": {arm: results["equal_time"]["arms"][arm]}}}


def test_plot_draws_runs_of_different_arms_together(tmp_path):
    results, _ = fake_results(tmp_path)
    a, b = tmp_path / "bahdanau.json", tmp_path / "luong.json"
    a.write_text(json.dumps(one_arm(results, "bahdanau")))
    b.write_text(json.dumps(one_arm(results, "luong")))
    png = plot_bleu_minutes.main(["--json", str(a), "--json", str(b), "--out", str(tmp_path / "both.png")])
    assert png.read_bytes().startswith(PNG_MAGIC)
    merged = plot_bleu_minutes.merge_results([(str(a), json.loads(a.read_text())),
                                              (str(b), json.loads(b.read_text()))])
    assert {(t, arm) for t, arm, *_ in plot_bleu_minutes.series(merged)} == {
        (t, arm) for t in ("ours", "joey") for arm in ("bahdanau", "luong")}
    assert merged["equal_time"]["arms"]["luong"] == results["equal_time"]["arms"]["luong"]


@pytest.mark.parametrize(("change", "message"), [
    (lambda r: r.update(cpu={"model": "Other CPU", "cores": 2, "flags": []}), "another CPU"),
    (lambda r: r["equal_time"].update(test_sentences=300), "300 test sentences"),
    (lambda r: None, "arm 'luong' is in both")])
def test_plot_refuses_runs_that_do_not_belong_together(tmp_path, change, message):
    results, _ = fake_results(tmp_path)
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(results))
    other = one_arm(json.loads(json.dumps(results)), "luong")
    change(other)
    b.write_text(json.dumps(other))
    with pytest.raises(ConfigError, match=message):
        plot_bleu_minutes.main(["--json", str(a), "--json", str(b), "--out", str(tmp_path / "x.png")])
    assert not (tmp_path / "x.png").exists()


def test_plot_without_marks_is_a_clear_error(tmp_path):
    res = tmp_path / "speed_only.json"
    res.write_text(json.dumps({"cpu": {"model": "x"}, "ours": {}}))
    with pytest.raises(ConfigError, match="no BLEU marks in .*speed_only.json.*--minutes"):
        plot_bleu_minutes.main(["--json", str(res), "--out", str(tmp_path / "x.png")])
    with pytest.raises(ConfigError, match="cannot read"):
        plot_bleu_minutes.main(["--json", str(tmp_path / "missing.json"), "--out", str(tmp_path / "x.png")])
    assert not (tmp_path / "x.png").exists()


def test_resume_segments_change_budget_keys_only(tmp_path):
    args = argparse.Namespace(threads=2, batch_tokens=3000, data=["data.root=/d"], precision="auto")
    first = bench_bleu.ours_segment_command(args, "luong", tmp_path / "run", 5, first=True)
    assert "train.precision=auto" in first  # as the speed phase measured ours
    later = bench_bleu.ours_segment_command(args, "luong", tmp_path / "run", 10, first=False)
    assert "train.max_minutes=5" in first and "model/attention=luong" in first
    assert "train.overwrite=true" in first and "data.root=/d" in first
    assert "train.max_minutes=10" in later and "train.resume=true" in later
    # a resume may change only budget and bookkeeping keys (seq2seq.runs.folder)
    keys = {a.split("=", 1)[0] for a in later if "=" in a}
    assert keys <= {"run_dir", "train.max_minutes", "train.threads", "train.resume"}


@pytest.mark.slow
def test_ours_segments_on_the_tiny_corpus(tiny_corpus, tmp_path, capsys):
    """Two 0.05-minute segments: the clock sums over the resume, each mark decoded."""
    args = argparse.Namespace(threads=1, batch_tokens=200, minutes=0.1, ours_run=[],
                              data=[*tiny_corpus, "model.emb_size=16", "model.hidden_size=16",
                                    "train.max_epochs=10000", "train.patience=0"])
    pairs = [("uno dos", "one two"), ("tres", "three")]
    subset = bench_bleu.TestSet("marks2", [s for s, _ in pairs], [t for _, t in pairs])
    log = bench_bleu.MarkLog({}, str(tmp_path / "r.json"), {})
    bench_bleu.train_ours_marks(args, "luong", tmp_path, [0.05, 0.1], subset, None, log)
    marks = log.toolkit("luong", "ours")["marks"]
    assert [m["minutes"] for m in marks] == [0.05, 0.1]
    assert 3 <= marks[0]["train_wall_s"] < marks[1]["train_wall_s"]
    assert marks[1]["train_wall_s"] >= 6 and marks[0]["steps"] < marks[1]["steps"]
    assert all(m["stop_reason"].startswith("max_minutes") for m in marks)
    assert all(Path(m["checkpoint"]).is_file() and m["sentences"] == 2 for m in marks)


@pytest.mark.slow
@pytest.mark.skipif(not bench_joey.joey_available(), reason="no .venv-joey (make joeynmt-env)")
def test_minutes_marks_end_to_end_on_the_tiny_corpus(tiny_corpus, tmp_path):
    """benchmark.py --minutes with marks, both toolkits, then the plot from its JSON."""
    out = tmp_path / "res.json"
    data = [arg for o in [*tiny_corpus, "train.patience=0", "train.max_epochs=10000"]
            for arg in ("--data", o)]
    benchmark.main(["--quick", "--arms", "bahdanau", "--joey-arms", "bahdanau",
                    "--batch-tokens", "200", "--matmul-size", "256", "--minutes", "0.2",
                    "--mark-minutes", "0.1", "--mark-sentences", "8", "--full-test-at-end",
                    "--work", str(tmp_path), "--json", str(out), *data])
    res = json.loads(out.read_text())
    et = res["equal_time"]
    assert et["marks"] == [0.1, 0.2] and et["test_sentences"] == 8
    arm = et["arms"]["bahdanau"]
    for side in ("ours", "joey"):
        marks = arm[side]["marks"]
        assert [m["minutes"] for m in marks] == [0.1, 0.2]
        assert marks[0]["steps"] < marks[1]["steps"]
        assert 0 < marks[0]["train_wall_s"] < marks[1]["train_wall_s"]
        assert all(m["sentences"] == 8 and m["beam5_sent_per_s"] > 0 for m in marks)
        assert marks[-1]["full_test"]["sentences"] == et["test_split_sentences"] == 40
    assert arm["joey"]["mark_updates"] == [m["steps"] for m in arm["joey"]["marks"]]
    # JoeyNMT was stopped by the clock, each mark at a checkpoint that had trained that long
    assert arm["joey"]["train"]["stopped"]
    assert all(m["train_s"] >= 60 * m["minutes"] for m in arm["joey"]["marks"])
    assert arm["joey"]["marks"][-1]["steps"] < arm["joey"]["update_cap"]
    assert arm["ratio_beam5_sent_per_s"] > 0 and arm["ratio_beam5_sent_per_s_full_test"] > 0
    png = plot_bleu_minutes.main(["--json", str(out), "--out", str(tmp_path / "p.png")])
    assert png.read_bytes().startswith(PNG_MAGIC)
