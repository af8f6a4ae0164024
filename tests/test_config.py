"""Every config composes and builds a model; bad configs are refused with one clear line."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from seq2seq.config import CONFIG_DIR, LuongScore, validate
from seq2seq.errors import ConfigError
from seq2seq.model import build_model

REPO = Path(__file__).resolve().parent.parent
GROUPS = {g: sorted(p.stem for p in (Path(CONFIG_DIR) / g).glob("*.yaml"))
          for g in ("data", "train", "experiment", "model/attention")}
LUONG_SCORES = tuple(LuongScore)


def make_cfg(*overrides: str):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose("config", overrides=list(overrides))


def small(*overrides: str):
    """A composed config with a small model, so building it is fast."""
    return make_cfg("model.emb_size=16", "model.hidden_size=16", *overrides)


def test_groups_are_found() -> None:
    assert GROUPS["model/attention"] == ["bahdanau", "luong", "luong_deep", "none"]
    assert {"debug", "overfit"} <= set(GROUPS["experiment"])


ARCH = [
    *(("model/attention=none", f"model.rnn_type={r}") for r in ("gru", "lstm")),
    *(("model/attention=bahdanau", f"model.rnn_type={r}") for r in ("gru", "lstm")),
    *(("model/attention=luong", f"model.rnn_type={r}", f"model.attention.score={s}",
       f"model.attention.input_feeding={f}")
      for r, s, f in itertools.product(("gru", "lstm"), LUONG_SCORES, ("true", "false"))),
    *(("model/attention=luong_deep", f"model.rnn_type={r}") for r in ("gru", "lstm")),
]


ATTENTION_CLASSES = {"none": "NoAttention", "bahdanau": "BahdanauAttention",
                     "luong": "LuongAttention"}


@pytest.mark.parametrize("overrides", ARCH, ids=lambda o: ",".join(x.split("=")[1] for x in o))
def test_every_architecture_composes_and_builds(overrides: tuple[str, ...]) -> None:
    cfg = small(*overrides)
    validate(cfg)
    model = build_model(cfg.model, 40, 50)
    group = overrides[0].split("=")[1]
    name = group.removesuffix("_deep")
    assert cfg.model.attention.name == name
    assert type(model.attention).__name__ == ATTENTION_CLASSES[name]
    assert all(r.mode == cfg.model.rnn_type.upper() for r in model.encoder.fwd)
    assert model.decoder.rnn.rnn.mode == cfg.model.rnn_type.upper()
    assert model.decoder.reads_embedding == (group != "luong")  # deep output: all but Luong's own
    if name == "luong":
        assert model.attention.score == cfg.model.attention.score
        assert model.attention.feeds_input == cfg.model.attention.input_feeding
        # input feeding widens the decoder RNN's input by the attentional vector
        width = 16 + (16 if cfg.model.attention.input_feeding else 0)
        assert model.decoder.rnn.rnn.input_size == width


def _option_effects(model, cfg) -> None:
    """What each model option must change in the built model."""
    m = cfg.model
    assert len(model.encoder.fwd) == m.enc_layers
    assert model.decoder.rnn.rnn.num_layers == m.dec_layers
    assert (model.encoder.bwd is not None) == m.bidirectional
    assert model.encoder.output_size == m.hidden_size * (2 if m.bidirectional else 1)
    assert model.decoder.readout.maxout == m.maxout
    assert model.decoder.readout.proj.out_features == m.hidden_size * (2 if m.maxout else 1)
    assert model.decoder.tie_embeddings == m.tie_embeddings
    assert hasattr(model.decoder, "output") != m.tie_embeddings
    if m.tie_embeddings:
        assert (model.decoder.tie_proj is not None) == (m.emb_size != m.hidden_size)
    if m.attention.name != "luong":
        assert model.decoder.reads_embedding == m.deep_output
    if m.attention.name == "bahdanau":
        assert model.attention.scorer.key_proj.out_features == (m.attention.attn_size or m.hidden_size)


@pytest.mark.parametrize("flags", [
    ("model.enc_layers=2", "model.dec_layers=2"),
    ("model.bidirectional=false",),
    ("model.deep_output=false",),
    ("model.maxout=true",),
    ("model.tie_embeddings=true",),
    ("model.emb_size=24", "model.tie_embeddings=true"),
    ("model.attention.attn_size=8",),
])
def test_model_options_build_with_each_attention(flags: tuple[str, ...]) -> None:
    for att in GROUPS["model/attention"]:
        cfg = small(f"model/attention={att}", *flags)
        validate(cfg)
        _option_effects(build_model(cfg.model, 40, 50), cfg)


def _leaves(node, prefix: str = ""):
    """(dotted key, value) of every leaf of a YAML mapping, ``defaults`` left out."""
    for key, value in node.items():
        if key == "defaults":
            continue
        if isinstance(value, dict):
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


@pytest.mark.parametrize("group,name", [(g, n) for g, names in GROUPS.items() for n in names])
def test_every_group_file_composes(group: str, name: str) -> None:
    cfg = make_cfg(f"{group}={name}")
    validate(cfg)
    build_model(cfg.model, 40, 50)
    # every value the file sets is in the composed config, under the group's package
    text = (Path(CONFIG_DIR) / group / f"{name}.yaml").read_text()
    package = "" if "@package _global_" in text else group.replace("/", ".") + "."
    values = OmegaConf.to_container(OmegaConf.create(text), resolve=False)
    checked = 0
    for key, value in _leaves(values, package):
        if isinstance(value, str) and "${" in value:
            continue  # an interpolation: resolved against the whole config
        assert OmegaConf.select(cfg, key, throw_on_missing=True) == value, key
        checked += 1
    assert checked > 0


def test_experiment_files_are_global_packages() -> None:
    for name in GROUPS["experiment"]:
        text = (Path(CONFIG_DIR) / "experiment" / f"{name}.yaml").read_text()
        assert text.startswith("# @package _global_"), name
    cfg = make_cfg("experiment=debug")
    assert cfg.train.max_steps == 20 and cfg.model.hidden_size == 32  # train/debug + its own keys


@pytest.mark.parametrize("override,message", [
    ("model.hidden_size=-5", "model.hidden_size=-5 must be a positive integer"),
    ("model.dropout=1.5", "model.dropout=1.5 must be in [0, 1)"),
    ("train.teacher_forcing=0", "train.teacher_forcing=0.0 must be in (0, 1]"),
    ("train.lr_decay=1.5", "train.lr_decay=1.5 must be in (0, 1): the factor the plateau "
                           "schedule multiplies the learning rate by"),
    ("train.threads=-2", "train.threads=-2 must be >= 0 (0 = all cores)"),
    ("train.save_every_minutes=-1", "train.save_every_minutes=-1.0 must be >= 0 (0 = at "
                                    "validations only)"),
])
def test_validate_refuses_bad_values(override: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        validate(make_cfg(override))
    assert str(err.value) == message


@pytest.mark.parametrize("override,choices", [
    ("train.lr_schedule=cosine", "[constant, plateau, inverse_sqrt]"),
    ("tokenizer.model_type=wordpiece", "[unigram, bpe, char, word]"),
    ("model.attention.name=transformer", "[none, bahdanau, luong]"),
    ("model.attention.score=cosine", "[dot, general, concat, scaled_dot]"),
    ("model.rnn_type=rnn", "[gru, lstm]"),
    ("train.precision=fp16", "[auto, fp32, bf16, bf16_loss, bf16_gemm]"),
])
def test_a_value_outside_a_fixed_set_is_refused_when_composing(override: str, choices: str) -> None:
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException) as err:
        make_cfg(override)
    assert f"expected one of {choices}" in str(err.value.__cause__)


def test_build_model_refuses_a_bad_plain_dict() -> None:
    with pytest.raises(ConfigError, match="model.attention.name"):
        build_model({"attention": {"name": "transformer"}}, 40, 50)
    with pytest.raises(ConfigError, match="model.hidden_size=0 must be a positive integer"):
        build_model({"hidden_size": 0}, 40, 50)


def test_unknown_group_option_is_refused_when_composing() -> None:
    from hydra.errors import MissingConfigException

    with pytest.raises(MissingConfigException):
        make_cfg("model/attention=transformer")


def test_typo_in_a_key_is_refused_when_composing() -> None:
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException):
        make_cfg("train.max_step=5")


def run_cli(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    """`seq2seq-train` in a subprocess (the package is not necessarily installed)."""
    code = "from seq2seq.cli import train_main; train_main()"
    return subprocess.run(
        [sys.executable, "-c", code, f"run_dir={tmp_path / 'run'}", f"data.root={tmp_path / 'nodata'}",
         *overrides],
        cwd=REPO, capture_output=True, text=True, timeout=120,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )


@pytest.mark.parametrize("override,message", [
    ("model.hidden_size=-1", "error: model.hidden_size=-1 must be a positive integer"),
    ("model.dropout=1.5", "error: model.dropout=1.5 must be in [0, 1)"),
    ("train.seed=1", "error: corpus"),  # a valid config whose corpus is not built
])
def test_cli_refuses_bad_configs_with_one_line(tmp_path: Path, override: str, message: str) -> None:
    proc = run_cli(tmp_path, override)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(message), proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "run" / "last.pt").exists()


def test_cli_names_the_choices_of_a_fixed_set(tmp_path: Path) -> None:
    """Hydra refuses it while composing: its own short report, no traceback, nothing written."""
    proc = run_cli(tmp_path, "model.attention.name=transformer")
    assert proc.returncode == 1, proc.stderr
    assert "Invalid value 'transformer', expected one of [none, bahdanau, luong]" in proc.stderr
    assert "full_key: model.attention.name" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()


def test_eval_workers_must_be_auto_or_positive() -> None:
    from seq2seq.config import EvalConfig, validate_eval

    ev = OmegaConf.structured(EvalConfig)
    validate_eval(ev)  # the default, -1: auto
    ev.workers = 2
    validate_eval(ev)
    ev.workers = 0
    with pytest.raises(ConfigError, match=r"workers=0 must be -1 \(auto\)"):
        validate_eval(ev)
