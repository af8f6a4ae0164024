"""seq2seq-reproduce: arm configs, resume logic, criteria and report (fast), end to end (slow)."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from seq2seq.config import CONFIG_DIR, validate_reproduce
from seq2seq.errors import ConfigError
from seq2seq.evaluation import tables as report
from seq2seq.evaluation.command import Split, SystemOutput, compare, score_system
from seq2seq.experiments import arms as arms_mod
from seq2seq.experiments import reproduce
from seq2seq.experiments.report import criteria, render_report
from seq2seq.runs.log import read_dev_buckets


def reproduce_cfg(*overrides: str):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("reproduce", overrides=list(overrides))
    validate_reproduce(cfg)
    return cfg


# ------------------------------------------------------------------ arm configs
@pytest.mark.parametrize("profile", ["quick", "long", "paper"])
def test_arms_share_everything_but_attention_and_length_cap(profile: str, tmp_path) -> None:
    cfg = reproduce_cfg(f"profile={profile}", f"reproduce.out_dir={tmp_path}")
    arms = arms_mod.arm_configs(cfg)
    assert list(arms) == list(cfg.reproduce.arms)
    plain = {n: OmegaConf.to_container(a, resolve=True) for n, a in arms.items()}
    first = next(iter(plain.values()))
    for name, arm in plain.items():
        spec = cfg.reproduce.arms[name]
        group = OmegaConf.load(arms_mod.CONFIG_DIR / "model" / "attention" / f"{spec.attention}.yaml")
        assert arm["model"]["attention"] == {**arm["model"]["attention"], **group}
        assert arm["run_dir"] == str(tmp_path / "arms" / name)
        assert arm["train"]["max_src_words"] == (spec.max_src_words or cfg.train.max_src_words)
        for section in ("data", "tokenizer"):
            assert arm[section] == first[section]
        for key in ("emb_size", "hidden_size", "dropout", "rnn_type"):
            assert arm["model"][key] == cfg.model[key]
        same_train = {k: v for k, v in arm["train"].items() if k != "max_src_words"}
        assert same_train == {k: v for k, v in first["train"].items() if k != "max_src_words"}


def test_profiles_set_the_published_sizes() -> None:
    quick = reproduce_cfg()
    assert quick.reproduce.profile == "quick"
    assert list(quick.reproduce.arms) == ["none", "bahdanau", "luong"]
    paper = reproduce_cfg("profile=paper")
    assert (paper.model.emb_size, paper.model.hidden_size) == (620, 1000)
    caps = {n: a.max_src_words for n, a in paper.reproduce.arms.items()}
    assert caps == {"RNNencdec-30": 30, "RNNsearch-30": 30, "RNNencdec-50": 50,
                    "RNNsearch-50": 50}
    assert paper.reproduce.arms["RNNsearch-30"].baseline == "RNNencdec-30"


def test_long_profile_is_the_quick_recipe_with_twice_the_minutes() -> None:
    quick = OmegaConf.to_container(reproduce_cfg(), resolve=True)
    long = OmegaConf.to_container(reproduce_cfg("profile=long"), resolve=True)
    assert (quick["train"]["max_minutes"], long["train"]["max_minutes"]) == (15, 30)
    assert long["reproduce"]["out_dir"] == long["run_dir"] == "runs/reproduce_long"
    assert (quick["reproduce"]["longer_profile"], long["reproduce"]["longer_profile"]) == ("long", "")
    assert "30 minutes" in long["reproduce"]["budget_note"]
    for cfg in (quick, long):  # everything else is the same recipe, arms and evaluation
        cfg["train"].pop("max_minutes")
        cfg.pop("run_dir")
        for key in ("profile", "out_dir", "budget_note", "longer_profile"):
            cfg["reproduce"].pop(key)
    assert long == quick


def test_bad_arms_are_config_errors(tmp_path) -> None:
    cfg = reproduce_cfg(f"reproduce.out_dir={tmp_path}", "reproduce.arms.luong.attention=lstm")
    with pytest.raises(ConfigError, match="use one of"):
        arms_mod.arm_configs(cfg)
    with pytest.raises(ConfigError, match="is not an arm"):
        reproduce_cfg("reproduce.arms.luong.baseline=nobody")
    with pytest.raises(ConfigError, match=r"longer_profile='longest' is not a profile: use one of "
                                          r"\['long', 'paper', 'quick'\]"):
        reproduce_cfg("reproduce.longer_profile=longest")


# ------------------------------------------------------------------ resume logic
def _fake_trainer(calls: list):
    def train_main(cfg):
        calls.append((Path(cfg.run_dir).name, bool(cfg.train.resume)))
        run = Path(cfg.run_dir)
        run.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(cfg, run / "config.yaml", resolve=True)
        (run / "params.json").write_text(json.dumps({"parameters": 123}))
        (run / "summary.json").write_text(json.dumps({"wall_time_s": 5.0, "steps": 3}))
        return run
    return train_main


def test_finished_arms_are_skipped_and_half_trained_arms_resume(tmp_path, monkeypatch) -> None:
    import seq2seq.training.loop

    calls: list = []
    monkeypatch.setattr(seq2seq.training.loop, "train_main", _fake_trainer(calls))
    cfg = reproduce_cfg(f"reproduce.out_dir={tmp_path}")
    arms = arms_mod.arm_configs(cfg)
    (tmp_path / "arms" / "bahdanau").mkdir(parents=True)
    (tmp_path / "arms" / "bahdanau" / "last.pt").write_bytes(b"interrupted")
    for name, arm_cfg in arms.items():
        summary = arms_mod.train_arm(name, arm_cfg)
        assert summary["parameters"] == 123 and summary["steps"] == 3
    assert calls == [("none", False), ("bahdanau", True), ("luong", False)]
    for name, arm_cfg in arms_mod.arm_configs(cfg).items():  # a second run trains nothing
        assert arms_mod.train_arm(name, arm_cfg)["steps"] == 3
    assert len(calls) == 3


def test_a_finished_arm_with_other_settings_is_refused(tmp_path, monkeypatch) -> None:
    import seq2seq.training.loop

    monkeypatch.setattr(seq2seq.training.loop, "train_main", _fake_trainer([]))
    cfg = reproduce_cfg(f"reproduce.out_dir={tmp_path}")
    arms_mod.train_arm("none", arms_mod.arm_configs(cfg)["none"])
    bigger = reproduce_cfg(f"reproduce.out_dir={tmp_path}", "model.hidden_size=300")
    with pytest.raises(ConfigError, match=r"model.hidden_size differ.*reproduce.out_dir"):
        arms_mod.train_arm("none", arms_mod.arm_configs(bigger)["none"])


# -------------------------------------------------------- criteria and the report
WORDS = [f"w{i}" for i in range(300)]


def _synthetic_split(name: str, lengths: list[int], seed: int) -> Split:
    rng = random.Random(seed)
    src = [" ".join(rng.choices(WORDS, k=n)) for n in lengths]
    ref = [" ".join(rng.choices(WORDS, k=n)) for n in lengths]
    return Split(name, src, ref, f"fp-{name}", "en")


def _system(name: str, split: Split, keep: callable) -> SystemOutput:
    """References cut to ``keep(n_words)`` words: a system that degrades as chosen."""
    hyps = [" ".join(r.split()[: keep(len(r.split()))]) for r in split.references]
    return SystemOutput(name, hyps, None, None, 1.0, False, "synthetic")


def _synthetic_results() -> dict:
    ev = OmegaConf.create({"n_boot": 200, "boot_seed": 1})
    lengths = [n for n in (5, 15, 25, 35, 45, 55) for _ in range(40)]
    splits = {}
    for name, lens in (("test", lengths), ("test_long", [80] * 30)):
        split = _synthetic_split(name, lens, seed=len(name))
        systems = {
            "none": _system("none", split, lambda n: max(1, int(n * (0.9 - 0.012 * n)))),
            "bahdanau": _system("bahdanau", split, lambda n: n - 1),
            "luong": _system("luong", split, lambda n: max(1, n // 3)),
            "apertium": _system("apertium", split, lambda n: max(1, n // 2)),
        }
        comparison, trends = compare(split, systems, "none", ev)
        splits[name] = {"count": len(lens),
                        "scores": {n: score_system(split, s, ev) for n, s in systems.items()},
                        "comparisons": {"none": comparison},
                        "trends": {"none": {a: trends[a] for a in ("bahdanau", "luong")}}}
    summary = {"attention": "x", "parameters": 1000, "steps": 10, "epochs_completed": 1,
               "stop_reason": "max_steps=10", "wall_time_s": 60.0, "mean_tgt_tok_per_s": 900.0,
               "best_dev_bleu": 1.5}
    arms = {"none": {**summary, "spec": {"attention": "none", "baseline": ""}},
            "bahdanau": {**summary, "spec": {"attention": "bahdanau", "baseline": "none"}},
            "luong": {**summary, "spec": {"attention": "luong", "baseline": "none"}}}
    cfg = OmegaConf.to_container(reproduce_cfg(), resolve=True)
    return {"profile": "quick", "command": "seq2seq-reproduce", "config": cfg, "arms": arms,
            "splits": splits, "apertium": "Apertium 3.8.3", "wall_time_s": 600.0,
            "timings": {"corpus": {"seconds": 3.0, "cached": False},
                        "decode none test": {"seconds": 9.0, "cached": True}}}


@pytest.fixture(scope="module")
def synthetic_results() -> dict:
    results = _synthetic_results()
    results["criteria"] = criteria(results)
    return results


def test_criteria_are_computed_from_the_numbers(synthetic_results) -> None:
    verdicts = {(r["id"], r["system"]): r["verdict"] for r in synthetic_results["criteria"]}
    assert verdicts[(1, "bahdanau")] == "PASS"  # nearly the reference vs a weak none
    assert verdicts[(1, "luong")] == "FAIL"  # a third of each reference is worse than none
    assert verdicts[(2, "bahdanau")] == "PASS"  # none falls with length, bahdanau does not
    assert verdicts[(4, "bahdanau")] == "PASS"
    assert verdicts[(4, "luong")] == "FAIL"  # below Apertium's half references
    assert {s for (i, s) in verdicts if i == 3} == {"none", "bahdanau", "luong", "apertium"}
    gain = next(r for r in synthetic_results["criteria"] if r["id"] == 1)
    test = synthetic_results["splits"]["test"]["scores"]
    want = test["bahdanau"]["overall"]["BLEU"]["score"] / test["none"]["overall"]["BLEU"]["score"]
    assert gain["value"] == pytest.approx(want - 1)


def test_criteria_without_apertium_say_skipped(synthetic_results) -> None:
    results = json.loads(json.dumps(report.jsonable(synthetic_results)))
    del results["splits"]["test"]["scores"]["apertium"]
    rows = [r for r in criteria(results) if r["id"] == 4]
    assert [r["verdict"] for r in rows] == ["SKIPPED"]


def test_report_opens_with_the_verdict_in_plain_words(synthetic_results) -> None:
    text = render_report(synthetic_results)
    first = text.split("\n\n")[1]  # the paragraph after the title
    assert "**bahdanau: the bottleneck shows.**" in first
    trend = synthetic_results["splits"]["test"]["trends"]["none"]["bahdanau"]
    assert f"×{trend['ratio_short']:.2f} on 11-20-word sources" in first
    assert f"effect size {trend['ratio_long'] / trend['ratio_short']:.2f}" in first
    # an arm whose advantage does not grow is called that, and the budget note is printed
    flat = json.loads(json.dumps(report.jsonable(synthetic_results)))
    for arm in ("bahdanau", "luong"):
        flat["splits"]["test"]["trends"]["none"][arm]["p_value"] = 0.4
    flat["config"]["reproduce"]["budget_note"] = "12 minutes cannot show it."
    text = render_report(flat)
    assert "**bahdanau: the bottleneck does not show.**" in text.split("## What was run")[0]
    assert "does not fall away on long sentences" in text
    assert "*About this budget:* 12 minutes cannot show it." in text.split("## What was run")[0]
    # the quick profile names its longer one, with the steps the arms that missed took
    assert ("Training steps in this budget: bahdanau 10, luong 10. The `long` profile trains "
            "every arm longer on the same recipe: `seq2seq-reproduce profile=long`") in text
    flat["config"]["reproduce"]["longer_profile"] = ""
    assert "Training steps in this budget" not in render_report(flat)
    # the arm that shows the effect is not named; over seeds the steps are a range
    flat["config"]["reproduce"]["longer_profile"] = "long"
    flat["splits"]["test"]["trends"]["none"]["bahdanau"]["p_value"] = 0.001
    flat["arms"]["luong"]["per_seed"] = {"1": {"steps": 1751}, "2": {"steps": 1910}}
    assert "Training steps in this budget: luong 1,751-1,910. The `long`" in render_report(flat)


def test_report_has_every_section(synthetic_results) -> None:
    text = render_report(synthetic_results)
    for needle in ("## What was run", "## Arms", "BLEU and chrF by source length: test",
                   "## Beyond the training length: test_long",
                   "## Criteria (docs/evaluation-protocol.md)",
                   "## Timings", "BLEU signature: `nrefs:1", "bahdanau p", "**PASS**",
                   "**FAIL**", "from an earlier run (reused)", "| 51+ | 40 |"):
        assert needle in text, needle
    json.dumps(report.jsonable(synthetic_results), allow_nan=False)  # results.json is valid


# ------------------------------------------------- end to end on a tiny corpus
SRC_WORDS = [f"{a}{b}" for a in "bcdfglmnprst" for b in "aeiou"][:40]
TGT = {w: w.upper()[::-1] for w in SRC_WORDS}  # a word-for-word "language"


def _write_tiny_corpus(folder: Path, scale: float = 1.0) -> list[str]:
    """train/valid/test TSVs of a monotone word-for-word task; test covers every bucket
    and its consecutive lines join into 60-120-word test_long segments (``scale`` < 1
    shortens every sentence). Returns the data overrides of a `data=local` config."""
    rng = random.Random(7)
    folder.mkdir(parents=True, exist_ok=True)

    def write(name: str, lengths: list[int]) -> Path:
        lines = []
        for n in lengths:
            src = rng.choices(SRC_WORDS, k=max(1, int(n * scale)))
            lines.append(" ".join(src) + "\t" + " ".join(TGT[w] for w in src) + "\n")
        path = folder / f"{name}.tsv"
        path.write_text("".join(lines), encoding="utf-8")
        return path

    train = write("train", [rng.randint(1, 50) for _ in range(300)])
    valid = write("valid", [rng.randint(1, 40) for _ in range(20)])
    test = write("test", [n for n in (4, 14, 24, 34, 44, 54) for _ in range(8)])
    return ["data=local", "data.name=tiny", f"data.root={folder / 'data'}",
            f"data.train_file={train}", f"data.valid_file={valid}", f"data.test_file={test}",
            "tokenizer.vocab_size=120"]


TINY_TRAINING = ["model.emb_size=16", "model.hidden_size=16", "model.dropout=0.0",
                 "train.max_steps=6", "train.max_minutes=0", "train.valid_every=3",
                 "train.valid_bleu_sentences=5", "train.batch_tokens=400", "train.log_every=3",
                 "train.threads=1", "train.device=cpu"]
TINY_EVAL = ["eval.beam=2", "eval.n_boot=50", "eval.max_len_ratio=1.2", "eval.max_len_extra=3",
             "eval.device=cpu", "eval.threads=1"]


@pytest.fixture(scope="module")
def tiny_reproduction(tmp_path_factory) -> tuple[Path, list[str]]:
    """A whole `seq2seq-reproduce` (quick profile's arms, tiny sizes) on the tiny corpus."""
    root = tmp_path_factory.mktemp("repro")
    data = _write_tiny_corpus(root / "corpus")
    overrides = [*data, *TINY_TRAINING, *TINY_EVAL, f"reproduce.out_dir={root / 'out'}"]
    out = reproduce.reproduce_main(reproduce_cfg(*overrides))
    return out, overrides


def test_reproduce_end_to_end_writes_the_report(tiny_reproduction) -> None:
    out, _ = tiny_reproduction
    for name in ("report.md", "bleu_vs_length.png", "results.json", "scores_test.csv",
                 "scores_test_long.csv", "reproduce_config.yaml"):
        assert (out / name).is_file(), name
    results = json.loads((out / "results.json").read_text())
    assert list(results["arms"]) == ["none", "bahdanau", "luong"]
    for arm in results["arms"].values():
        assert arm["steps"] == 6 and arm["parameters"] > 0 and arm["mean_tgt_tok_per_s"] > 0
    test = results["splits"]["test"]
    assert test["count"] == 48
    assert [test["scores"]["bahdanau"]["buckets"][b]["count"] for b in
            ("1-10", "11-20", "21-30", "31-40", "41-50", "51+")] == [8] * 6
    assert set(test["comparisons"]["none"]["systems"]) >= {"bahdanau", "luong"}
    assert results["splits"]["test_long"]["count"] > 0
    assert {r["id"] for r in results["criteria"]} == {1, 2, 3, 4}
    report_md = (out / "report.md").read_text()
    assert "## Criteria (docs/evaluation-protocol.md)" in report_md
    assert "BLEU signature" in report_md
    assert (out / "bleu_vs_length.png").read_bytes()[:4] == b"\x89PNG"
    # every arm logged dev BLEU by bucket at its validations (steps 3 and 6), and the
    # reproduction drew them against training time
    assert results["curves_png"] == "bleu_by_length_over_time.png"
    assert (out / "bleu_by_length_over_time.png").read_bytes()[:4] == b"\x89PNG"
    assert "`bleu_by_length_over_time.png`" in report_md
    for arm in ("none", "bahdanau", "luong"):
        rows = read_dev_buckets(out / "arms" / arm)
        assert sorted({int(r["step"]) for r in rows}) == [3, 6]


def test_reproduce_again_trains_and_decodes_nothing(tiny_reproduction, monkeypatch) -> None:
    import seq2seq.evaluation.command
    import seq2seq.inference.decode
    import seq2seq.training.loop

    def refuse(*args, **kwargs):
        raise AssertionError("a finished phase ran again")

    monkeypatch.setattr(seq2seq.training.loop, "train_main", refuse)
    monkeypatch.setattr(seq2seq.evaluation.command, "decode", refuse)
    out, overrides = tiny_reproduction
    before = json.loads((out / "results.json").read_text())
    reproduce.reproduce_main(reproduce_cfg(*overrides))
    after = json.loads((out / "results.json").read_text())
    assert after["splits"]["test"]["scores"] == before["splits"]["test"]["scores"]
    reused = [k for k, t in after["timings"].items() if k.startswith(("train", "decode"))]
    assert reused and all(after["timings"][k]["cached"] for k in reused)


# ------------------------------------------------------------- seq2seq-evaluate
def evaluate_cfg(*overrides: str):
    from seq2seq.config import validate_evaluate

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("evaluate", overrides=["n_boot=50", "device=cpu", "threads=1",
                                             "max_len_ratio=1.2", "max_len_extra=3",
                                             *overrides])
    validate_evaluate(cfg)
    return cfg


def test_evaluate_one_run(tiny_reproduction, tmp_path, capsys) -> None:
    from seq2seq.evaluation.command import evaluate_main

    run = tiny_reproduction[0] / "arms" / "bahdanau"
    out = evaluate_main(evaluate_cfg(f"run={run}", "split=test", "beam=3",
                                     f"out_dir={tmp_path / 'ev'}"))
    assert out == tmp_path / "ev"
    hyps = (out / "hypotheses.txt").read_text().splitlines()
    assert len(hyps) == 48
    results = json.loads((out / "results.json").read_text())
    scores = results["systems"]["bahdanau"]
    assert scores["overall"]["count"] == 48 and "BLEU" in scores["signatures"]
    assert scores["buckets"]["51+"]["attention_entropy"] is not None  # attention has weights
    rows = (out / "sentences.csv").read_text().splitlines()
    assert len(rows) == 49 and "attention_entropy" in rows[0] and "out_tokens" in rows[0]
    assert "| 51+ | 8 |" in capsys.readouterr().out  # the table is printed


def test_evaluate_compares_runs_with_paired_tests(tiny_reproduction, tmp_path) -> None:
    from seq2seq.evaluation.command import evaluate_main

    arms = tiny_reproduction[0] / "arms"
    out = evaluate_main(evaluate_cfg(f"runs=[{arms / 'none'},{arms / 'luong'}]", "beam=2",
                                     "split=test", f"out_dir={tmp_path / 'cmp'}"))
    results = json.loads((out / "results.json").read_text())
    assert list(results["systems"]) == ["none", "luong"]
    paired = results["comparison"]["systems"]["luong"]
    assert results["comparison"]["baseline"] == "none"
    assert 0 < paired["overall"]["BLEU"]["p_value"] <= 1
    assert "luong" in results["ratio_trend"]
    assert "luong p" in (out / "table.md").read_text()


def test_evaluate_an_ensemble_and_a_named_checkpoint(tiny_reproduction) -> None:
    from seq2seq.evaluation.command import evaluate_main

    arms = tiny_reproduction[0] / "arms"
    b, lu = arms / "bahdanau", arms / "luong"
    out = evaluate_main(evaluate_cfg(f"run=[{b},{lu}]", "split=test", "beam=2"))
    assert out.parent == b / "eval" and out.name.startswith("test-beam2-ensemble-")
    assert len((out / "hypotheses.txt").read_text().splitlines()) == 48
    assert list(json.loads((out / "results.json").read_text())["systems"]) == ["bahdanau+luong"]
    single = evaluate_main(evaluate_cfg(f"run={b}", "split=test", "beam=2"))
    one = evaluate_main(evaluate_cfg(f"run=[{b}]", "split=test", "beam=2"))  # a list of one
    assert one == single == b / "eval" / "test-beam2"
    last = evaluate_main(evaluate_cfg(f"run={b / 'last.pt'}", "split=test", "beam=2"))
    assert last == b / "eval" / "test-beam2-last"  # not written over best.pt's evaluation
    cmp = evaluate_main(evaluate_cfg(f"runs=[[{b},{lu}],{b}]", "names=[ens,single]",
                                     "split=test", "beam=2", f"out_dir={out.parent / 'cmp'}"))
    paired = json.loads((cmp / "results.json").read_text())["comparison"]
    assert paired["baseline"] == "ens" and "single" in paired["systems"]


def test_evaluate_bad_input_is_one_clear_error(tiny_reproduction, tmp_path) -> None:
    import shutil

    from seq2seq.errors import CheckpointError, DataError
    from seq2seq.evaluation.command import evaluate_main

    run = tiny_reproduction[0] / "arms" / "none"
    with pytest.raises(DataError, match=r"split 'tset' is not in corpus .*test_long"):
        evaluate_main(evaluate_cfg(f"run={run}", "split=tset"))
    broken = tmp_path / "broken"
    shutil.copytree(run, broken)
    (broken / "best.pt").write_bytes((broken / "best.pt").read_bytes()[:200])
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        evaluate_main(evaluate_cfg(f"run={broken}"))
    with pytest.raises(CheckpointError, match="does not exist"):
        evaluate_main(evaluate_cfg(f"run={tmp_path / 'nowhere'}"))


def test_evaluate_cli_prints_one_line(tmp_path) -> None:
    import subprocess
    import sys

    repo = Path(__file__).resolve().parent.parent
    proc = subprocess.run(
        [sys.executable, "-c", "from seq2seq.cli import evaluate_main; evaluate_main()",
         f"run={tmp_path / 'missing'}"],
        capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(repo)},
        check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"error: {tmp_path / 'missing'} does not exist: pass a run folder written by "
        "seq2seq-train or a .pt file in it"]


# ------------------------------------------------------------------- paper profile
@pytest.mark.slow  # ~20 s: a 33M-parameter model, two checkpoints of ~400 MB
def test_paper_profile_trains_a_couple_of_steps_on_cpu(tmp_path) -> None:
    from seq2seq.training.loop import train_main

    data = _write_tiny_corpus(tmp_path / "corpus", scale=0.1)  # 1-5 words: a fast step
    cfg = reproduce_cfg("profile=paper", *data, f"reproduce.out_dir={tmp_path / 'out'}",
                        "train.max_steps=2", "train.max_minutes=0", "train.valid_every=2",
                        "train.valid_bleu_sentences=2", "train.batch_tokens=40",
                        "train.device=cpu")
    from seq2seq.corpus.build import build_main

    build_main(cfg)
    arms = arms_mod.arm_configs(cfg)
    run = train_main(arms["RNNsearch-30"])
    assert json.loads((run / "summary.json").read_text())["steps"] == 2
    saved = OmegaConf.load(run / "config.yaml")
    assert (saved.model.emb_size, saved.model.hidden_size, saved.model.maxout) == (620, 1000, True)
    assert saved.train.max_src_words == 30 and saved.model.attention.name == "bahdanau"


def test_a_truncated_summary_is_redone_not_a_traceback(tiny_reproduction) -> None:
    out, overrides = tiny_reproduction
    summary = out / "arms" / "none" / "summary.json"
    good = json.loads(summary.read_text())
    summary.write_text(summary.read_text()[:20])  # a file cut by a crash of an older version
    reproduce.reproduce_main(reproduce_cfg(*overrides))
    again = json.loads(summary.read_text())
    assert again["steps"] == good["steps"] and again["stop_reason"] == good["stop_reason"]
