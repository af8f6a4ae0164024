"""What the server serves: trained runs (or a reproduction's arms) loaded as translators.

The one module of :mod:`seq2seq.serve` that imports the rest of seq2seq, and only its
public names; the other modules take what they need from here. Everything is read
from disk here, once, at start-up: no request reads or writes a file.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from seq2seq.constants import DECODE_BATCH_TOKENS, MAX_BEAM
from seq2seq.errors import CheckpointError, ConfigError, Seq2SeqError
from seq2seq.inference.settings import SearchSettings
from seq2seq.inference.translator import Translation, Translator

__all__ = ["MAX_BEAM", "CheckpointError", "ConfigError", "Seq2SeqError", "ServedModel",
           "Translation", "arm_runs", "load_served", "model_specs"]

CHECKPOINTS = ("best.pt", "last.pt")  # what seq2seq-train writes into a run folder
_SEED_DIR = re.compile(r"seed(\d+)")


@dataclass
class ServedModel:
    """A loaded model under its name.

    attention: the model's attention (``none``, ``bahdanau``, ``luong``; an ensemble's
        members' names joined by ``+`` when they differ).
    runs: the run folder(s) or checkpoint(s) it was loaded from (several: an ensemble).
    parameters: trainable parameters (all members of an ensemble).
    training: the run's ``summary.json`` (steps, time, best dev BLEU...), None if absent.
    """

    name: str
    translator: Any  # seq2seq.inference.translator.Translator, or a stand-in with its translate()
    attention: str
    runs: list[str] = field(default_factory=list)
    parameters: int = 0
    training: dict[str, Any] | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    batch_tokens: int = DECODE_BATCH_TOKENS  # padded source subwords per decoding batch

    @property
    def alignment(self) -> bool:
        """Whether attention weights mean anything: ``none`` attends to one fixed vector."""
        return any(a != "none" for a in self.attention.split("+"))

    def translate(self, sentences: Sequence[str], beam: int, nbest: int) -> list[Translation]:
        """One Translation per sentence, in order (see seq2seq.inference.translator.Translator)."""
        return self.translator.translate(list(sentences), beam=beam, nbest=nbest,
                                         batch_tokens=self.batch_tokens)

    @classmethod
    def wrap(cls, name: str, translator: Any, attention: str) -> ServedModel:
        """A translator already in memory (tests, notebooks) as a served model."""
        params = sum(p.numel() for p in translator.model.parameters())
        settings = {"max_src_tokens": translator.max_src_tokens,
                    "alpha": translator.search.alpha, "ensemble_size": 1}
        return cls(name, translator, attention, parameters=params, settings=settings)


# ---------------------------------------------------------------- which runs


def _folder_of(run: str) -> Path:
    path = Path(run).expanduser()
    return path.parent if path.suffix == ".pt" else path


def _default_name(run: Any) -> str:
    members = [run] if isinstance(run, str) else list(run)
    return "+".join(_folder_of(m).name for m in members)


def _check_exists(run: Any) -> list[str]:
    members = [str(run)] if isinstance(run, str) else [str(m) for m in run]
    if not members:
        raise ConfigError("runs=[..,[],..]: an ensemble needs at least one run folder")
    for member in members:
        if not Path(member).expanduser().exists():
            raise CheckpointError(f"{member} does not exist: pass a run folder written by "
                                  "seq2seq-train (or a .pt file in one)")
    return members


def arm_runs(reproduction: str | Path, seed: int = 0) -> list[tuple[str, str]]:
    """``(arm name, run folder)`` for every trained arm of a seq2seq-reproduce folder,
    ``none`` first (the baseline), then by name. With seed folders (``arms/<arm>/seed<k>``)
    the run of ``seed`` (0: the lowest seed each arm has)."""
    root = Path(reproduction).expanduser()
    arms = root / "arms"
    if not arms.is_dir():
        what = "does not exist" if not root.exists() else "holds no arms/ folder"
        raise CheckpointError(f"reproduction={reproduction} {what}: pass the out_dir of a "
                              "seq2seq-reproduce run, e.g. reproduction=runs/reproduce_quick")
    found = []
    for arm in sorted((p for p in arms.iterdir() if p.is_dir()), key=lambda p: (p.name != "none", p.name)):
        if any((arm / c).is_file() for c in CHECKPOINTS):
            found.append((arm.name, str(arm)))
            continue
        seeds = {int(m.group(1)): p for p in arm.glob("seed*")
                 if (m := _SEED_DIR.fullmatch(p.name)) and any((p / c).is_file() for c in CHECKPOINTS)}
        if seed and seeds and seed not in seeds:  # an arm not trained at all is skipped
            raise CheckpointError(f"arm {arm.name} of {reproduction} has no trained seed{seed} "
                                  f"(it has {sorted(seeds) or 'none'}): pass another seed=")
        if seeds:
            found.append((arm.name, str(seeds[seed or min(seeds)])))
    if not found:
        raise CheckpointError(f"{arms} holds no trained arm (no best.pt or last.pt): let "
                              "seq2seq-reproduce finish training first")
    return found


def model_specs(cfg: Any) -> list[tuple[str, list[str]]]:
    """``(name, run members)`` for ``runs=``/``names=`` or ``reproduction=``; checks that
    every run exists (before the slow torch import) and that names are unique."""
    if cfg.reproduction:
        return [(name, [run]) for name, run in arm_runs(cfg.reproduction, cfg.seed)]
    runs = [r if isinstance(r, str) else list(r) for r in cfg.runs]
    members = [_check_exists(r) for r in runs]
    names = list(cfg.names) or [_default_name(r) for r in runs]
    if len(set(names)) < len(names):  # runs/a/seed1 and runs/b/seed1: name them a/seed1, b/seed1
        names = list(cfg.names) or ["+".join("/".join(_folder_of(m).parts[-2:]) for m in ms)
                                    for ms in members]
    if len(set(names)) < len(names):
        raise ConfigError(f"two runs would be served as the same name ({names}): give each a "
                          "name with names=[a,b,...]")
    return list(zip(names, members, strict=True))


# ---------------------------------------------------------------- loading


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _attention_names(members: list[str]) -> str:
    """Each member's model.attention.name from its run folder's config.yaml, ``+``-joined
    when they differ; ``unknown`` for a checkpoint moved out of its run folder."""
    from omegaconf import OmegaConf

    names = []
    for member in members:
        try:
            names.append(str(OmegaConf.load(_folder_of(member) / "config.yaml").model.attention.name))
        except Exception:  # missing or unreadable: the weights still load from the .pt
            names.append("unknown")
    return "+".join(dict.fromkeys(names))


def load_served(name: str, members: list[str], cfg: Any) -> ServedModel:
    """Load one model (an ensemble for several members) with the decoding settings of
    a checked ServeConfig. CheckpointError when a run is missing or corrupt."""
    search = SearchSettings(cfg.alpha, cfg.max_len_ratio, cfg.max_len_extra)
    run: Any = members[0] if len(members) == 1 else members
    translator = Translator.from_run(run, cfg.device, cfg.max_src_tokens, search)
    served = ServedModel.wrap(name, translator, _attention_names(members))
    served.runs = members
    served.batch_tokens = cfg.batch_tokens
    served.training = _read_json(_folder_of(members[0]) / "summary.json")
    served.settings["ensemble_size"] = len(members)
    return served
