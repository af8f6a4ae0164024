"""Ensembles (mean log-probabilities through the same search) and checkpoint averaging."""

from __future__ import annotations

import copy
import re
import shutil
from pathlib import Path

import pytest
import torch
from conftest import train_in_process
from fixtures_translate import trained_word_translator, word_translator

from seq2seq.config import AverageConfig
from seq2seq.corpus.tokenizer import Tokenizers
from seq2seq.errors import CheckpointError, ConfigError
from seq2seq.inference.ensemble import Ensemble, load_models
from seq2seq.inference.search import beam_search, greedy
from seq2seq.inference.translator import Translator
from seq2seq.runs.average import average_checkpoints, average_main, average_state_dicts
from seq2seq.runs.checkpoint import kept_checkpoints, load_checkpoint, load_model

SENTENCES = ["los cielos", "la tierra", "creó dios los cielos y la tierra", "dios",
             "en el principio"]


def _batch(translator: Translator) -> tuple[torch.Tensor, torch.Tensor]:
    from torch.nn.utils.rnn import pad_sequence

    ids = [torch.tensor(translator.tokenizers.src.encode(s)) for s in SENTENCES]
    return pad_sequence(ids, batch_first=True), torch.tensor([len(i) for i in ids])


def test_an_ensemble_of_one_model_equals_that_model() -> None:
    model = trained_word_translator().model
    src, lens = _batch(trained_word_translator())
    for members in ([model], [model, model]):
        ens = Ensemble(members)
        for ours, theirs in zip(beam_search(ens, src, lens, beam=3, nbest=2),
                                beam_search(model, src, lens, beam=3, nbest=2), strict=True):
            assert [h.tokens for h in ours] == [h.tokens for h in theirs]
            assert [h.score for h in ours] == pytest.approx([h.score for h in theirs], abs=1e-5)
            assert torch.allclose(ours[0].attention, theirs[0].attention, atol=1e-6)


def test_an_ensemble_step_is_the_mean_of_the_members_log_probabilities() -> None:
    a = trained_word_translator().model
    b = word_translator("luong").model  # another attention, untrained: clearly different
    src, lens = _batch(trained_word_translator())
    ens = Ensemble([a, b]).eval()
    with torch.no_grad():
        memory = ens.encode(src, lens)
        state = ens.init_state(memory)
        y = torch.full((src.size(0),), 2, dtype=torch.long)  # BOS
        logp, _, weights = ens.step(y, state, memory)
        mem_a, mem_b = a.encode(src, lens), b.encode(src, lens)
        la, _, wa = a.step(y, a.init_state(mem_a), mem_a)
        lb, _, wb = b.step(y, b.init_state(mem_b), mem_b)
    reference = (torch.log_softmax(la, -1) + torch.log_softmax(lb, -1)) / 2
    assert torch.allclose(logp, reference, atol=1e-6)
    assert torch.allclose(weights, (wa + wb) / 2, atol=1e-6)
    # and search decodes with it: the ensemble's greedy output follows the mean
    hyps = greedy(ens, src, lens)
    assert len(hyps) == len(SENTENCES)


def test_average_of_two_copies_is_the_checkpoint_and_of_two_models_their_mean() -> None:
    a = trained_word_translator().model.state_dict()
    b = word_translator("bahdanau").model.state_dict()
    same = average_state_dicts([a, copy.deepcopy(a)])
    assert all(torch.equal(same[k], a[k]) for k in a)
    mean = average_state_dicts([a, b])
    assert all(torch.allclose(mean[k], (a[k] + b[k]) / 2, atol=1e-7) for k in a)
    other = word_translator("luong").model.state_dict()
    with pytest.raises(CheckpointError, match="other parameters than the first"):
        average_state_dicts([a, other])


# ---------------------------------------------------------------- real runs


@pytest.fixture(scope="module")
def kept_run(tiny_train_overrides: list[str], tmp_path_factory) -> Path:
    """A tiny run that keeps its last 3 validation checkpoints (validations every 5 steps)."""
    folder = tmp_path_factory.mktemp("kept") / "run"
    return train_in_process([*tiny_train_overrides, "train.max_steps=25",
                             "train.keep_checkpoints=3", "train.tensorboard=false",
                             "train.valid_at_epoch_end=false", f"run_dir={folder}"])


def test_keep_checkpoints_keeps_the_newest_validations(kept_run: Path) -> None:
    kept = kept_checkpoints(kept_run)
    assert [step for step, _ in kept] == [15, 20, 25]
    last = load_checkpoint(kept_run / "last.pt")
    newest = load_checkpoint(kept[-1][1])
    assert all(torch.equal(newest["model"][k], last["model"][k]) for k in last["model"])
    assert not list(kept_run.glob("**/*.tmp"))


def _average_cfg(**values):
    from omegaconf import OmegaConf

    cfg = OmegaConf.structured(AverageConfig)
    for key, value in values.items():
        cfg[key] = value
    return cfg


def test_seq2seq_average_writes_a_checkpoint_every_command_loads(kept_run: Path, capsys) -> None:
    out = average_main(_average_cfg(run=str(kept_run), last=2))
    assert out == kept_run / "averaged.pt"
    assert "averaged 2 checkpoints (steps 20, 25)" in capsys.readouterr().out
    ckpt = load_checkpoint(out)
    parts = [load_checkpoint(p)["model"] for _, p in kept_checkpoints(kept_run)[-2:]]
    for key, value in ckpt["model"].items():
        assert torch.allclose(value, (parts[0][key] + parts[1][key]) / 2, atol=1e-7)
    assert ckpt["optimizer"] is None and ckpt["progress"]["averaged_steps"] == [20, 25]
    [result] = Translator.from_run(out).translate(["el perro come pan"], beam=2)
    assert isinstance(result.text, str)
    model, _, _ = load_model(out)
    assert sum(p.numel() for p in model.parameters()) > 0


def test_seq2seq_average_refuses_what_it_cannot_do(kept_run: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=re.escape("keeps 3 validation checkpoint(s)")):
        average_main(_average_cfg(run=str(kept_run), last=5))
    with pytest.raises(ConfigError, match="pass run=<run folder>"):
        average_main(_average_cfg())
    other = tmp_path / "other"
    shutil.copytree(kept_run, other)
    mixed = [str(kept_run / "last.pt"), str(other / "last.pt")]
    with pytest.raises(ConfigError, match="come from 2 run folders"):
        average_main(_average_cfg(checkpoints=mixed))
    assert average_checkpoints([kept_run / "last.pt"])["model"].keys()


def test_ensembles_of_runs_refuse_other_tokenizers(kept_run: Path, tmp_path: Path) -> None:
    model, toks, _ = load_models([str(kept_run), str(kept_run / "last.pt")])
    assert isinstance(model, Ensemble) and len(model.members) == 2
    single = Translator.from_run(kept_run).translate(["el gato ve la casa"], beam=3)
    double = Translator.from_run([str(kept_run), str(kept_run)]).translate(
        ["el gato ve la casa"], beam=3)
    assert double[0].text == single[0].text
    other = tmp_path / "other"
    shutil.copytree(kept_run, other)
    tok = other / "tokenizer"
    (tok / "spm_tgt.model").write_bytes((tok / "spm_src.model").read_bytes())
    with pytest.raises(CheckpointError, match="is not the tokenizer best.pt was trained with"):
        load_models([str(other)])  # the checkpoint names its own tokenizer
    ckpt = load_checkpoint(other / "best.pt")  # a run that was trained with that tokenizer
    ckpt["identity"]["tokenizer"] = Tokenizers.load(tok).identity()
    torch.save(ckpt, other / "best.pt")
    load_models([str(other)])
    with pytest.raises(CheckpointError, match="their tokenizers differ"):
        load_models([str(kept_run), str(other)])
