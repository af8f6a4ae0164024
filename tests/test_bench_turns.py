"""scripts/bench_turns.py: two processes taking turns, JoeyNMT's windows kept free of waits."""

from __future__ import annotations

import json
import os
import sys
import types
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

import bench_turns  # noqa: E402
import benchmark  # noqa: E402

from seq2seq.errors import ConfigError  # noqa: E402

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"

# our side, as bench_ours.measure_arm + time_training take turns: start-up and warm-up in
# the first turn, one turn per timed group, then the release
OURS = """
import json, os, sys, time
sys.path.insert(0, {scripts!r})
from bench_turns import ENV, Turns
turns, log = Turns(os.environ[ENV]), []
for _ in range({warm}):  # start-up and warm-up groups
    turns.take()
    time.sleep(0.05)
    turns.give()
for _ in range({repeats}):
    turns.take()
    start = time.time(); time.sleep(0.2); log.append([start, time.time()])
    turns.give()
turns.take()
json.dump(log, open({out!r}, "w"))
"""

# JoeyNMT's side: hook_joey (first turn at start-up) and a TrainManager whose
# train_and_validate restarts each window's clock right after _log_scores, as JoeyNMT 2.3.0's
JOEY = """
import importlib.util, json, os, sys, time, types
sys.path.insert(0, {scripts!r})
import bench_turns
class TrainManager:
    def train_and_validate(self):
        self.windows, start = [], time.time()
        for _ in range({windows}):
            t0 = time.time(); time.sleep(0.05); t1 = time.time()
            self._log_scores(t1 - start, t0, t1)
            start = time.time()
    def _log_scores(self, elapsed, t0, t1):
        self.windows.append([elapsed, t0, t1])
class Finder:  # records whether "joeynmt.training" is imported before the first turn came
    def find_spec(self, name, path=None, target=None):
        if name != "joeynmt.training":
            return None
        go0 = os.path.exists(os.path.join(os.environ["BENCH_TURNS"], "go.0"))
        json.dump(go0, open({imported!r}, "w"))
        return importlib.util.spec_from_loader(name, self)
    def create_module(self, spec):
        return None
    def exec_module(self, module):
        module.TrainManager = TrainManager
package = types.ModuleType("joeynmt")
package.__path__ = []
sys.modules["joeynmt"] = package
sys.meta_path.insert(0, Finder())
bench_turns.hook_joey()
tm = TrainManager(); tm.train_and_validate()
json.dump(tm.windows, open({out!r}, "w"))
"""


def _child(tmp_path: Path, name: str, code: str) -> bench_turns.Child:
    script = tmp_path / f"{name}.py"
    script.write_text(code, encoding="utf-8")
    return bench_turns.start(name, [sys.executable, str(script)], tmp_path / f"{name}_turns",
                             dict(os.environ), tmp_path / f"{name}.log")


def test_children_take_turns_and_joey_windows_exclude_the_waits(tmp_path):
    warm, repeats = 3, 4
    ours = _child(tmp_path, "ours", OURS.format(scripts=str(SCRIPTS), warm=warm, repeats=repeats,
                                                out=str(tmp_path / "ours.json")))
    joey = _child(tmp_path, "joey", JOEY.format(scripts=str(SCRIPTS), windows=warm + repeats,
                                                out=str(tmp_path / "joey.json"),
                                                imported=str(tmp_path / "imported.json")))
    order = []
    bench_turns.conduct(ours, joey, warm + repeats, on_turn=lambda n, t, s: order.append((n, t)))
    assert order == [x for t in range(warm + repeats) for x in (("ours", t), ("joey", t))]
    # JoeyNMT is imported in its own first turn, not beside our start-up
    assert json.loads((tmp_path / "imported.json").read_text()) is True
    groups = json.loads((tmp_path / "ours.json").read_text())
    windows = json.loads((tmp_path / "joey.json").read_text())
    assert len(groups) == repeats and len(windows) == warm + repeats
    # each timed window ran between our groups, never during one
    for (_, g1), (_, w0, w1) in zip(groups, windows[warm:], strict=True):
        assert g1 <= w0 and w1 > w0
    for (_, _, w1), (g0, _) in zip(windows[warm:-1], groups[1:], strict=True):
        assert w1 <= g0
    # JoeyNMT's clock covers its own work (0.05 s), not our 0.2-s groups in between
    assert all(elapsed < 0.15 for elapsed, _, _ in windows)


def test_a_child_that_dies_is_a_clear_error_and_the_other_is_stopped(tmp_path):
    ours = _child(tmp_path, "ours", "import sys; sys.exit(3)\n")
    joey = _child(tmp_path, "joey", "import time; time.sleep(60)\n")
    with pytest.raises(bench_turns.ChildFailed, match=r"ours exited \(status 3\) during turn 0"):
        bench_turns.conduct(ours, joey, 1)
    assert joey.proc.poll() is not None  # killed, not left running


def test_a_child_that_never_ends_its_turn_times_out(tmp_path):
    ours = _child(tmp_path, "ours", "import time; time.sleep(60)\n")  # ignores its turns
    joey = _child(tmp_path, "joey", "import time; time.sleep(60)\n")
    with pytest.raises(bench_turns.ChildFailed, match="did not end turn 0 within 1 s"):
        bench_turns.conduct(ours, joey, 1, timeout=1)
    assert ours.proc.poll() is not None and joey.proc.poll() is not None


def test_without_a_folder_turns_do_nothing():
    turns = bench_turns.Turns(None)
    turns.take()
    turns.give()
    assert turns.taken == turns.given == 0


def test_paired_rounds_need_joeynmt():
    with pytest.raises(ConfigError, match="--paired-rounds"):
        benchmark.parse_args(["--paired-rounds", "1", "--no-joey"])
    with pytest.raises(ConfigError, match="--paired-rounds"):
        benchmark.parse_args(["--paired-rounds", "-1"])


@pytest.mark.slow
@pytest.mark.skipif(not benchmark.bench_joey.joey_available(), reason="no .venv-joey (make joeynmt-env)")
def test_paired_rounds_with_joeynmt_on_the_tiny_corpus(tiny_corpus, tmp_path):
    data = [arg for o in tiny_corpus for arg in ("--data", o)]
    res = benchmark.main(["--quick", "--arms", "bahdanau", "--joey-arms", "bahdanau",
                          "--batch-tokens", "200", "--matmul-size", "256", "--repeats", "3",
                          "--paired-rounds", "2", "--work", str(tmp_path), *data])
    rec = res["paired"]["arms"]["bahdanau"]
    assert len(rec["ratios"]) == 2 and all(r > 0 for r in rec["ratios"])
    assert [len(p) for p in rec["pair_ratios"]] == [3, 3]  # one per timed group and window
    assert len(rec["precision"]) == 2 and all(p.startswith("fp32") for p in rec["precision"])
    for ours, joey, ratio in zip(rec["ours"], rec["joey"], rec["ratios"], strict=True):
        assert ratio == pytest.approx(ours / joey)
    assert rec["median_ratio"] == pytest.approx(sum(rec["ratios"]) / 2)


def test_our_warm_up_is_split_over_its_turns(monkeypatch):
    import bench_ours
    import torch

    events: list = []

    class Recorded(bench_turns.Turns):
        def take(self) -> None:
            events.append("take")

        def give(self) -> None:
            events.append("give")

    monkeypatch.setattr(bench_ours, "train_step", lambda run, b: events.append(b.i) or torch.tensor(0.0))
    batches = [types.SimpleNamespace(i=i, n_tgt_tokens=10, n_src_tokens=10) for i in range(9)]
    run = types.SimpleNamespace(device=torch.device("cpu"))
    res = bench_ours.time_training(run, batches, warmup=5, repeats=2, per_repeat=2,
                                   turns=Recorded(None), warm_turns=2)
    # the first turn is taken by measure_arm; 5 warm-up batches in 2 turns, 2 timed groups
    assert events == [0, 1, "give", "take", 2, 3, 4, "give", "take", 5, 6, "give",
                      "take", 7, 8, "give", "take"]
    assert len(res["tgt_tok_per_s_repeats"]) == 2
