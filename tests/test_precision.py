"""train.precision: fp32 / bf16 / auto, where auto keeps bf16 only when timed passes say so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from seq2seq import precision, runtime
from seq2seq.errors import ConfigError

CPU = torch.device("cpu")


def _mode() -> str:
    """The precision the code runs in now, as the model would see it."""
    from seq2seq.model import bf16_gemm, loss

    if torch.is_autocast_enabled("cpu"):
        return "bf16"
    return "bf16_gemm" if bf16_gemm.active() else "bf16_loss" if loss._bf16 else "fp32"


def _step(fp32_s: float, bf16_s: float, calls: list[str], loss_s: float | None = None,
          gemm_s: float | None = None):
    """A fake training pass that draws randoms and reports the given time in each
    precision to the clock below (``step.seconds``): no sleeping, so the probe's medians
    are exact on a loaded machine too. bf16_loss takes ``loss_s`` (default: fp32's),
    bf16_gemm ``gemm_s`` (default: bf16_loss's)."""
    loss_s = fp32_s if loss_s is None else loss_s
    seconds = {"fp32": fp32_s, "bf16": bf16_s, "bf16_loss": loss_s,
               "bf16_gemm": loss_s if gemm_s is None else gemm_s}

    def step() -> None:
        calls.append(_mode())
        torch.rand(3)
        step.seconds = seconds[calls[-1]]
    return step


@pytest.fixture
def fake_clock(monkeypatch):
    """precision.timed returns the time the fake pass reports."""
    def timed(step, device) -> float:
        step()
        return step.seconds
    monkeypatch.setattr(precision, "timed", timed)


def test_fp32_and_unsupported_bf16_never_probe(monkeypatch) -> None:
    calls: list[str] = []
    assert precision.choose("fp32", CPU, _step(0, 0, calls)).bf16 is False
    monkeypatch.setattr(runtime, "bf16_supported", lambda device: False)
    auto = precision.choose("auto", CPU, _step(0, 0, calls))
    forced = precision.choose("bf16", CPU, _step(0, 0, calls))
    loss_only = precision.choose("bf16_loss", CPU, _step(0, 0, calls))
    assert not auto.bf16 and not forced.bf16 and "no native bf16" in auto.reason
    assert loss_only.name == "fp32" and "bf16_loss ignored" in loss_only.reason
    assert "ignored" in forced.reason and calls == []


def test_auto_takes_bf16_only_when_clearly_faster(monkeypatch, fake_clock) -> None:
    monkeypatch.setattr(runtime, "bf16_supported", lambda device: True)
    calls: list[str] = []
    fast = precision.choose("auto", CPU, _step(0.02, 0.005, calls))
    assert fast.bf16 and "20 ms in fp32, 20 ms in bf16_loss, 20 ms in bf16_gemm, 5 ms in bf16" \
        in fast.reason
    rounds = "/".join(["20"] * precision.PROBE_ROUNDS)
    assert f"ms per round: fp32 {rounds}; bf16_loss {rounds}" in fast.reason  # for diagnosis
    for mode in precision.TRAIN_MODES:  # one warm-up and the timed rounds each, alternating
        assert calls.count(mode) == precision.PROBE_ROUNDS + 1
    assert calls[:4] == list(precision.TRAIN_MODES)
    slow = precision.choose("auto", CPU, _step(0.01, 0.02, []))
    assert slow.name == "fp32" and slow.reason.startswith("fp32 (auto")
    assert precision.choose("bf16", CPU, _step(0.01, 0.02, [])).bf16  # asked for: kept


@pytest.mark.parametrize(("fp32_s", "loss_s", "gemm_s", "bf16_s", "chosen"), [
    (1.0, 0.90, 0.90, 0.85, "bf16_loss"),  # bf16 beats fp32 by x1.18 but bf16_loss by x1.06 only
    (1.0, 0.90, 0.90, 0.75, "bf16"),  # x1.2 over bf16_loss
    (1.0, 0.97, 0.97, 0.85, "bf16"),  # bf16_loss under its x1.05: bf16 against fp32, x1.18
    (1.0, 0.97, 0.97, 0.90, "fp32"),  # neither clearly faster
    (1.0, 0.90, 0.80, 0.75, "bf16_gemm"),  # x1.125 over bf16_loss; bf16 only x1.07 over it
    (1.0, 0.90, 0.88, 0.85, "bf16_loss"),  # bf16_gemm x1.02 over bf16_loss: not enough
    (1.0, 0.97, 0.90, 0.85, "bf16_gemm"),  # bf16_loss under its margin: bf16_gemm against fp32
])
def test_auto_keeps_each_further_change_only_when_it_pays(fp32_s, loss_s, gemm_s, bf16_s,
                                                          chosen) -> None:
    """The rule, given the four modes' times."""
    seconds = {"fp32": fp32_s, "bf16_loss": loss_s, "bf16_gemm": gemm_s, "bf16": bf16_s}
    choice = precision._pick({m: [s, s, s] for m, s in seconds.items()}, "a training pass")
    assert choice.name == chosen and choice.reason.startswith(f"{chosen} (auto")
    assert choice.bf16 is (chosen == "bf16")
    assert choice.loss_bf16 is (chosen in ("bf16_loss", "bf16_gemm"))
    assert choice.gemm_bf16 is (chosen == "bf16_gemm")


def test_each_timed_round_runs_a_new_pass_in_every_mode(monkeypatch) -> None:
    """Several passes (training's batches): all warm up on the first; round r runs pass
    1 + r in every mode, a different mode first each round; each time is scaled by the
    pass's size to the mean size, so batches of different size compare."""
    calls: list[tuple[int, str]] = []
    sizes = [100, 200, 400, 300]
    per_token = {"fp32": 3e-4, "bf16_loss": 2e-4, "bf16_gemm": 1.5e-4, "bf16": 1e-4}

    def make(i: int):
        def one_pass() -> None:
            calls.append((i, _mode()))
            one_pass.seconds = sizes[i] * per_token[_mode()]
        return one_pass

    monkeypatch.setattr(runtime, "bf16_supported", lambda device: True)
    monkeypatch.setattr(precision, "timed", lambda step, device: (step(), step.seconds)[1])
    got = precision.probe([make(i) for i in range(4)], CPU, precision.TRAIN_MODES, sizes)
    modes = precision.TRAIN_MODES
    n = len(modes)
    assert calls[:n] == [(0, m) for m in modes]
    rounds = [calls[n + n * r: 2 * n + n * r] for r in range(precision.PROBE_ROUNDS)]
    for r, done in enumerate(rounds):
        assert {i for i, _ in done} == {1 + r} and sorted(m for _, m in done) == sorted(modes)
    assert [done[0][1] for done in rounds] == list(modes[:precision.PROBE_ROUNDS])  # turns first
    assert got == pytest.approx({m: t * 250 for m, t in per_token.items()})


def test_training_auto_probes_on_several_batches(tiny_train_overrides, tmp_path: Path,
                                                 monkeypatch) -> None:
    from test_train import train

    seen = {}

    def probe(passes, device, modes, sizes=None):
        seen.update(passes=len(passes), sizes=list(sizes), modes=modes)
        return {m: [1.0] for m in modes}

    monkeypatch.setattr(precision, "probe_rounds", probe)
    monkeypatch.setattr(runtime, "bf16_supported", lambda device: True)
    train(tiny_train_overrides, f"run_dir={tmp_path / 'run'}", "train.max_steps=1",
          "train.precision=auto")
    assert seen["modes"] == precision.TRAIN_MODES and seen["passes"] == precision.PROBE_BATCHES
    assert len(seen["sizes"]) == seen["passes"] and all(n > 0 for n in seen["sizes"])


def test_decoding_auto_never_times_bf16_loss(monkeypatch, fake_clock) -> None:
    monkeypatch.setattr(runtime, "bf16_supported", lambda device: True)
    calls: list[str] = []
    choice = precision.choose("auto", CPU, _step(0.02, 0.01, calls, loss_s=0.001), key="precision")
    assert choice.bf16 and "bf16_loss" not in calls and "x2.00" in choice.reason
    with pytest.raises(ConfigError, match="'bf16_loss' is for training"):
        precision.check("bf16_loss", key="precision")
    with pytest.raises(ConfigError, match="'bf16_gemm' is for training"):
        precision.check("bf16_gemm", key="precision")


def test_applied_sets_and_restores_the_mode(monkeypatch) -> None:
    monkeypatch.setattr(runtime, "bf16_supported", lambda device: True)
    seen = {}
    for name in precision.TRAIN_MODES:
        with precision.applied(precision.of_name(name), CPU):
            seen[name] = _mode()
        assert _mode() == "fp32"
    assert seen == {m: m for m in precision.TRAIN_MODES}
    monkeypatch.setattr(runtime, "bf16_supported", lambda device: False)
    with precision.applied(precision.of_name("bf16_loss"), CPU):
        assert _mode() == "fp32"  # emulated bf16 is never used


def test_probe_restores_the_random_state(monkeypatch, fake_clock) -> None:
    monkeypatch.setattr(runtime, "bf16_supported", lambda device: True)
    torch.manual_seed(5)
    expected = torch.rand(4)
    torch.manual_seed(5)
    precision.choose("auto", CPU, _step(0.0, 0.0, []))
    assert torch.equal(torch.rand(4), expected)


def test_unknown_precision_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="train.precision='fp16'"):
        precision.check("fp16")


def test_training_records_the_choice_and_a_resume_keeps_it(tiny_train_overrides, tmp_path: Path,
                                                           monkeypatch) -> None:
    from test_train import train

    run_dir = tmp_path / "run"
    monkeypatch.setattr(precision, "MIN_SPEEDUP", 0.0)  # any bf16 time wins, where bf16 is native
    train(tiny_train_overrides, f"run_dir={run_dir}", "train.max_steps=3", "train.precision=auto")
    chosen = json.loads((run_dir / "summary.json").read_text())["precision"]
    assert chosen == ("bf16" if runtime.bf16_supported(CPU) else "fp32")
    assert "precision: " in (run_dir / "train.log").read_text()
    monkeypatch.setattr(precision, "MIN_SPEEDUP", 1e9)  # would now pick fp32
    train(tiny_train_overrides, f"run_dir={run_dir}", "train.max_steps=5", "train.precision=auto",
          "train.resume=true")
    assert json.loads((run_dir / "summary.json").read_text())["precision"] == chosen
    assert f"precision: {chosen} (kept from the run's start)" in (run_dir / "train.log").read_text()


@pytest.mark.parametrize("name", ["bf16_loss", "bf16_gemm"])
def test_bf16_loss_trains_fp32_with_its_loss_in_bf16(tiny_train_overrides, tmp_path: Path,
                                                   monkeypatch, name: str) -> None:
    """train.precision=bf16_loss (and bf16_gemm): recorded, kept on resume, and the
    training step's loss runs inside bf16_products (bf16_gemm: and the large products'
    block) while the model's parameters and gradients stay fp32."""
    from test_train import train

    from seq2seq.model import bf16_gemm, loss

    native = runtime.bf16_supported(CPU)
    seen: list[tuple[bool, bool, bool, torch.dtype]] = []
    real = loss.linear_cross_entropy

    def spy(x, weight, *args, **kwargs):
        if torch.is_grad_enabled():
            seen.append((loss._bf16, bf16_gemm.active(), torch.is_autocast_enabled("cpu"),
                         weight.dtype))
        return real(x, weight, *args, **kwargs)

    monkeypatch.setattr("seq2seq.model.decoder.linear_cross_entropy", spy)
    run_dir = tmp_path / "run"
    train(tiny_train_overrides, f"run_dir={run_dir}", "train.max_steps=2", f"train.precision={name}")
    expected = name if native else "fp32"
    assert json.loads((run_dir / "summary.json").read_text())["precision"] == expected
    gemm_on = native and name == "bf16_gemm"
    assert seen and all(s == (native, gemm_on, False, torch.float32) for s in seen), seen[:3]
    train(tiny_train_overrides, f"run_dir={run_dir}", "train.max_steps=4", "train.precision=fp32",
          "train.resume=true")
    assert json.loads((run_dir / "summary.json").read_text())["precision"] == expected


@pytest.mark.parametrize("name", ["bahdanau", "luong"])
def test_decoding_under_autocast_casts_the_values_once(name: str) -> None:
    """Without grad under autocast, encode stores the attention values in bf16 once, so no
    step casts them again; a step gives exactly what it gives with fp32 values, which the
    context bmm would cast at every step."""
    from seq2seq.config import AttentionConfig, ModelConfig
    from seq2seq.model import build_model

    torch.manual_seed(0)
    model = build_model(ModelConfig(emb_size=16, hidden_size=16,
                                    attention=AttentionConfig(name=name)), 20, 20).eval()
    src, lens = torch.randint(4, 20, (3, 6)), torch.tensor([6, 4, 2])
    y = torch.tensor([1, 5, 7])
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        once = model.encode(src, lens)
        with torch.enable_grad():  # training keeps fp32 values (their gradient is fp32)
            per_step = model.encode(src, lens)
        assert once.attn.values.dtype == torch.bfloat16
        assert per_step.attn.values.dtype == torch.float32
        state = model.init_state(once)
        logits_a, _, w_a = model.step(y, state, once)
        logits_b, _, w_b = model.step(y, state, per_step)
    assert torch.equal(logits_a, logits_b) and torch.equal(w_a, w_b)
    with torch.no_grad():  # no autocast: nothing is cast
        assert model.encode(src, lens).attn.values.dtype == torch.float32


def _casts(run) -> int:
    """How many tensor copies with a dtype change (``aten::_to_copy``) ``run()`` makes."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run()
    return sum(e.count for e in prof.key_averages() if e.key == "aten::_to_copy")


def test_decoding_under_autocast_casts_each_weight_once_per_batch() -> None:
    """Greedy decoding under bf16 autocast: the casts do not grow by a weight per step
    (autocast's cast cache works in decoding's grad mode), while the same steps under
    inference_mode, where the cache does not work, cast the weights at every step."""
    from seq2seq.config import AttentionConfig, ModelConfig
    from seq2seq.inference import search
    from seq2seq.model import build_model

    torch.manual_seed(0)
    model = build_model(ModelConfig(emb_size=16, hidden_size=16,
                                    attention=AttentionConfig(name="bahdanau")), 20, 20).eval()
    src, lens = torch.randint(4, 20, (2, 5)), torch.tensor([5, 3])

    def steps(n: int, grad_mode) -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16), grad_mode():
            memory = model.encode(src, lens)
            state = model.init_state(memory)
            y = torch.ones(2, dtype=torch.long)
            for _ in range(n):
                _, state, _ = model.step(y, state, memory)

    def per_step(grad_mode) -> float:
        return (_casts(lambda: steps(8, grad_mode)) - _casts(lambda: steps(2, grad_mode))) / 6

    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert isinstance(search.no_grad_mode("cpu"), torch.no_grad)
    assert isinstance(search.no_grad_mode("cpu"), torch.inference_mode)
    old = per_step(torch.inference_mode)
    new = per_step(lambda: search.no_grad_mode("cpu"))  # called inside the autocast
    assert old >= 4  # the step's weight matrices were cast again at every step
    assert new <= old - 8, (old, new)


def test_auto_compares_modes_within_each_round() -> None:
    """The machine slowed down while two of fp32's rounds ran: per-mode medians would
    read bf16_loss x3 faster, but within rounds it is x1.01-1.03 (one outlier), under
    its margin. A steady x1.2 within every round is kept."""
    rounds = {"fp32": [1.0, 3.0, 3.0], "bf16_loss": [0.99, 2.9, 1.0],
              "bf16_gemm": [0.99, 2.9, 1.0], "bf16": [1.0, 3.0, 3.0]}
    assert precision.speedup(rounds, "fp32", "bf16_loss") == pytest.approx(3.0 / 2.9)
    assert precision._pick(rounds, "a pass").name == "fp32"
    drift = {"fp32": [1.2, 2.4, 3.6], "bf16_loss": [2.0, 3.0, 1.0],
             "bf16_gemm": [2.0, 3.0, 1.0], "bf16": [2.0, 3.0, 1.0]}
    assert precision.speedup(drift, "fp32", "bf16_loss") == pytest.approx(0.8)
    steady = {"fp32": [1.2, 2.4, 3.6], "bf16_loss": [1.0, 2.0, 3.0],
              "bf16_gemm": [1.0, 2.0, 3.0], "bf16": [1.0, 2.0, 3.0]}
    choice = precision._pick(steady, "a pass")
    assert choice.name == "bf16_loss" and "bf16_loss x1.20" in choice.reason


def test_undecided_names_the_first_comparison_whose_rounds_disagree() -> None:
    agree = {"fp32": [1.0] * 3, "bf16_loss": [0.9] * 3, "bf16_gemm": [0.8, 0.82, 0.84],
             "bf16": [0.85] * 3}
    assert precision.undecided(agree) == ""
    # bf16_gemm over bf16_loss: x1.125, x1.02, x1.0 against its x1.05
    split = {**agree, "bf16_gemm": [0.8, 0.88, 0.9]}
    assert precision.undecided(split) == "bf16_gemm against bf16_loss"
    # bf16_gemm dropped (median x1.02), so bf16 is judged against bf16_loss: x1.2, x1.0, x1.2
    split["bf16"] = [0.75, 0.9, 0.75]
    assert precision.undecided({**split, "bf16_gemm": [0.9] * 3}) == "bf16 against bf16_loss"
    assert precision.undecided({"fp32": [1.0, 1.0], "bf16": [0.8, 0.9]}) == "bf16 against fp32"


def test_the_probe_adds_rounds_where_the_first_ones_disagree(monkeypatch) -> None:
    """bf16_gemm runs x1.2 faster than bf16_loss on every batch but the first timed one,
    where it ties: three rounds would pick by one noisy round (median x1.2 here, but a
    second tie would drop it); the probe runs MAX_PROBE_ROUNDS rounds, each on a new
    batch, and the median of all keeps bf16_gemm. Rounds that agree stop at three."""
    ran: list[tuple[int, str]] = []

    def make(i: int):
        def one_pass() -> None:
            ran.append((i, _mode()))
            tie = i == 1
            one_pass.seconds = {"fp32": 1.0, "bf16_loss": 0.8, "bf16": 0.78,
                                "bf16_gemm": 0.8 if tie else 0.8 / 1.2}[_mode()]
        return one_pass

    monkeypatch.setattr(runtime, "bf16_supported", lambda device: True)
    monkeypatch.setattr(precision, "timed", lambda step, device: (step(), step.seconds)[1])
    passes = [make(i) for i in range(precision.PROBE_BATCHES)]
    choice = precision.choose("auto", CPU, passes)
    n = len(precision.TRAIN_MODES)
    assert ran == [(p, m) for p in range(precision.MAX_PROBE_ROUNDS + 1)
                   for m in _rotated(p)]
    assert choice.name == "bf16_gemm"
    assert (f"{precision.MAX_PROBE_ROUNDS} rounds: the first {precision.PROBE_ROUNDS} "
            "disagreed on bf16_gemm against bf16_loss") in choice.reason
    ran.clear()
    steady = [make(i + 1) for i in range(precision.PROBE_BATCHES)]  # no tie at all
    choice = precision.choose("auto", CPU, steady)
    assert len(ran) == n * (1 + precision.PROBE_ROUNDS) and "disagreed" not in choice.reason


def _rotated(p: int) -> list[str]:
    """The modes in the order the probe runs them on pass ``p`` (0: the warm-up)."""
    modes = list(precision.TRAIN_MODES)
    r = (p - 1) % len(modes)
    return modes if p == 0 else modes[r:] + modes[:r]
