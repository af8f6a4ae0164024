"""Structured configs (dataclasses registered in Hydra's ConfigStore).

The YAML files under ``configs/`` only set values; these schemas type every key, so a typo
or a wrong type fails when the config is composed, not an hour into training; fixed sets of
values are StrEnums, which OmegaConf checks too. Range checks: :mod:`seq2seq.config.checks`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from seq2seq.constants import DECODE_BATCH_TOKENS

# The YAML side of every config: configs/ beside the package (an editable install).
CONFIG_DIR = str(Path(__file__).resolve().parents[2] / "configs")


# Settings with a fixed set of values. OmegaConf refuses any other value when the config
# is composed, naming the choices; a member compares and prints as its plain string.
class RnnType(StrEnum):
    gru = "gru"
    lstm = "lstm"


class AttentionName(StrEnum):
    none = "none"  # the fixed context vector of Cho et al. (2014)
    bahdanau = "bahdanau"  # additive (Bahdanau et al., 2015)
    luong = "luong"  # multiplicative family (Luong et al., 2015)


class LuongScore(StrEnum):
    dot = "dot"
    general = "general"
    concat = "concat"
    scaled_dot = "scaled_dot"


class ModelImpl(StrEnum):
    fast = "fast"
    reference = "reference"


class Precision(StrEnum):
    """Decoding's precision (`seq2seq-translate`, `seq2seq-evaluate`)."""

    auto = "auto"  # bf16 where a start-up probe measures it faster
    fp32 = "fp32"
    bf16 = "bf16"


class TrainPrecision(StrEnum):
    """Training's precision: decoding's, and bf16 for the output layer and loss alone."""

    auto = "auto"  # whichever of fp32, bf16_loss, bf16_gemm, bf16 a start-up probe finds faster
    fp32 = "fp32"
    bf16 = "bf16"
    bf16_loss = "bf16_loss"  # fp32 model; the fused output layer + loss multiply in bf16
    bf16_gemm = "bf16_gemm"  # and the other large products too (not the dot-product keys)


class LrSchedule(StrEnum):
    constant = "constant"
    plateau = "plateau"
    inverse_sqrt = "inverse_sqrt"


class SpmModelType(StrEnum):
    unigram = "unigram"
    bpe = "bpe"
    char = "char"
    word = "word"


class LogLevel(StrEnum):
    critical = "critical"
    error = "error"
    warning = "warning"
    info = "info"
    debug = "debug"


class Alignment(StrEnum):
    soft = "soft"  # the attention matrix
    hard = "hard"  # the argmax source subword per target subword (Pharaoh pairs)


@dataclass
class DataConfig:
    """Which parallel corpus to build/read and how to filter and split it."""

    name: str = MISSING  # folder under `root`: data/<name>/
    kind: str = MISSING  # sword | local | hub (only seq2seq.corpus knows these)
    root: str = "data"
    src_lang: str = "es"
    tgt_lang: str = "en"
    # kind=sword
    src_module: str = "spaRV1909eb"
    tgt_module: str = "engKJV2006eb"
    sword_path: str | None = None  # folder with mods.d/; else $SWORD_PATH, else /usr/share/sword
    # kind=local: TSV (src<TAB>tgt) or JSONL ({"translation": {src: .., tgt: ..}} or {src: .., tgt: ..})
    train_file: str | None = None
    valid_file: str | None = None
    test_file: str | None = None
    # kind=hub
    hub_name: str | None = None
    hub_config: str | None = None
    # filtering
    min_words: int = 1
    max_words: int = 200
    max_len_ratio: float = 2.5  # word-count ratio beyond which a pair is dropped as misaligned
    # splitting (by chapter / document for kind=sword; by line groups otherwise)
    split_seed: int = 1234
    valid_size: int = 1000  # approximate number of pairs of random groups in dev
    # then groups are added until every source-length bucket holds this many dev segments
    # (within 10% of the pairs); 0 = random groups only
    valid_per_bucket: int = 0
    test_per_bucket: int = 150  # minimum test segments per source-length bucket
    test_long_min_words: int = 60
    test_long_max_words: int = 120


@dataclass
class TokenizerConfig:
    """SentencePiece settings; trained on the train split only."""

    vocab_size: int = 8000
    joint: bool = False  # one model for both sides; else one per side
    model_type: SpmModelType = SpmModelType.unigram
    character_coverage: float = 1.0


@dataclass
class AttentionConfig:
    """The pluggable attention (seq2seq.model.attention builds it from these settings)."""

    name: AttentionName = AttentionName.bahdanau
    score: LuongScore = LuongScore.general  # luong only
    input_feeding: bool = True  # luong only
    # luong only: the readout also reads E y_{t-1} (Bahdanau's deep output); Luong et al.
    # read [c_t; h_t] only. On a short CPU budget it makes Luong learn as fast as Bahdanau.
    deep_output: bool = False
    attn_size: int = 0  # additive/concat scorer size; 0 = hidden_size


@dataclass
class ModelConfig:
    rnn_type: RnnType = RnnType.gru
    emb_size: int = 256
    hidden_size: int = 256
    enc_layers: int = 1
    dec_layers: int = 1
    dropout: float = 0.2
    bidirectional: bool = True
    deep_output: bool = True
    maxout: bool = False
    tie_embeddings: bool = False
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    # fast: seq2seq/model/fast.py; reference: seq2seq/model/reference.py, the plain-torch
    # model it is tested equal to (same parameters: a checkpoint of either loads in the other)
    impl: ModelImpl = ModelImpl.fast


@dataclass
class TrainConfig:
    seed: int = 1
    device: str = "auto"  # auto | cpu | cuda
    threads: int = 0  # torch intra-op threads; 0 = all cores
    # auto: what a probe of real training passes at start-up shows faster (seq2seq/precision.py);
    # fp32; bf16 autocast; bf16_loss: only the output layer + loss in bf16; bf16_gemm: those
    # and the other large products (bf16 only where the device has it native, else fp32)
    precision: TrainPrecision = TrainPrecision.fp32
    # fixed kernel paths and fp32 GEMM route, not timed ones: a seed's runs train alike
    deterministic: bool = False
    # CPU: denormals read as zero in every thread (runtime.flush_denormals): slow, and common early on
    flush_denormals: bool = True
    batch_tokens: int = 3000  # target tokens per batch (padding excluded)
    max_src_words: int = 50  # pairs longer than this (source words) are not trained on
    lr: float = 1e-3
    lr_schedule: LrSchedule = LrSchedule.plateau
    lr_decay: float = 0.5
    lr_patience: int = 2
    warmup_steps: int = 0
    min_lr: float = 1e-5
    clip_norm: float = 1.0
    label_smoothing: float = 0.0
    teacher_forcing: float = 1.0  # below 1.0: scheduled sampling with this ratio
    max_epochs: int = 20
    max_steps: int = 0  # 0 = no limit
    max_minutes: float = 0.0  # 0 = no wall-clock limit
    valid_every: int = 500  # steps
    valid_at_epoch_end: bool = True  # also validate when an epoch ends (off: every valid_every steps only)
    # greedy dev BLEU (overall and by source-length bucket, dev_buckets.csv) on this many
    # dev pairs spread over the split; >= the dev size: all of dev; 0 = off
    valid_bleu_sentences: int = 300
    patience: int = 5  # validations without improvement before early stop; 0 = off
    resume: bool = False
    resume_from: str = "last"  # with resume: last (last.pt) | best (best.pt) | a checkpoint file
    overwrite: bool = False  # a fresh run may replace another run's files in run_dir
    # also write last.pt every this many minutes between validations (0 = at validations only);
    # SIGTERM/SIGINT/SIGUSR1 always save it at the next step boundary (seq2seq/training/preempt.py)
    save_every_minutes: float = 0.0
    distributed: bool = False  # DDP over the processes torchrun starts (README: Several processes / GPUs)
    log_every: int = 50
    overfit_batches: int = 0  # > 0: every epoch trains on the same first N batches (memorisation check)
    # TensorBoard event files in the run folder (seq2seq/runs/tensorboard.py): losses, lr, tokens/s,
    # dev BLEU by bucket, attention images; skipped with a warning when tensorboard is missing
    tensorboard: bool = True
    # also keep the model of the last N validations in checkpoints/ (for seq2seq-average); 0 = none
    keep_checkpoints: int = 0


# train keys that say how a run is kept, logged and resumed, not what it learns: they may
# change on resume, and a finished reproduction arm is reused whatever they were
BOOKKEEPING_KEYS = ("resume", "resume_from", "overwrite", "tensorboard", "keep_checkpoints",
                    "save_every_minutes", "log_every")


@dataclass
class TranslateConfig:
    """Primary schema of `seq2seq-translate`; its keys are top-level (run=... beam=... nbest=...).

    The model, its tokenizers and its training settings come from the run folder.
    """

    # a run folder written by seq2seq-train, or a best.pt/last.pt in one; a list of them
    # decodes as an ensemble (seq2seq/inference/ensemble.py)
    run: Any = None
    beam: int = 5  # 1 = greedy search
    nbest: int = 1  # the prompt's n-best; in file and filter modes nbest > 1 writes the n-best TSV
    # file mode (seq2seq/inference/translate_file.py): read `input` (or stdin when it is a file, not a
    # pipe), decode in length-sorted batches, write `output` ("" = stdout)
    input: str = ""
    output: str = ""
    alignments: str = ""  # file mode: also write one JSON line of alignments per input line
    alignment: Alignment = Alignment.soft
    # file mode: padded source subwords per batch, before beam expansion
    batch_tokens: int = DECODE_BATCH_TOKENS
    alpha: float = 0.6  # GNMT length penalty of the beam score
    max_len_ratio: float = 2.0  # output cap: int(ratio * source subwords) + max_len_extra
    max_len_extra: int = 10
    max_src_tokens: int = 0  # longer inputs are cut with a warning; 0 = 4 x the run's train.max_src_words
    attention: bool = False  # REPL starts with the attention heatmap shown (toggle with :attn)
    history_file: str = "~/.cache/seq2seq/translate_history"  # REPL line history; "" = none kept
    device: str = "cpu"  # cpu | cuda | auto (startup is fastest on cpu)
    # auto: bf16 autocast where timing a few decoder steps at this mode's batch size shows it
    # faster (seq2seq/precision.py); fp32; bf16 (where the device has native bf16)
    precision: Precision = Precision.auto
    # torch intra-op threads; 0 = all cores; -1 = auto: 1 for the prompt and the filter (one
    # sentence at a time is small matrix work that more threads only slow down on a busy
    # machine, docs/performance.md#decoding), all cores for file mode (big batches)
    threads: int = -1
    # file mode: batches decoded at once, each in a thread on one torch thread; -1 = auto (one
    # per thread where timing a few decoder steps shows it faster than one batch on all of them)
    workers: int = -1


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    run_dir: str = "runs/${now:%Y-%m-%d_%H-%M-%S}"
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class EvalConfig:
    """Decoding and scoring settings shared by `seq2seq-evaluate` and `seq2seq-reproduce`."""

    beam: int = 5  # 1 = greedy search
    alpha: float = 0.6  # GNMT length penalty of the beam score
    max_len_ratio: float = 2.0  # output cap: int(ratio * source subwords) + max_len_extra
    max_len_extra: int = 10
    # padded source subwords per decoding batch, before beam expansion
    batch_tokens: int = DECODE_BATCH_TOKENS
    n_boot: int = 1000  # bootstrap resamples for intervals and paired tests
    boot_seed: int = 12345
    device: str = "auto"  # auto | cpu | cuda
    threads: int = 0  # torch intra-op threads; 0 = all cores
    # batches decoded at once, each in a thread on one torch thread; -1 = auto (timed at start,
    # seq2seq/inference/workers.py); the decodings are the same either way
    workers: int = -1


@dataclass
class EvaluateConfig(EvalConfig):
    """Primary schema of `seq2seq-evaluate`; its keys are top-level (run=... split=... beam=...)."""

    run: Any = None  # one run folder (or a checkpoint file in one); a list: one ensemble
    runs: list[Any] = field(default_factory=list)  # several runs (a list in it: an ensemble), compared
    names: list[str] = field(default_factory=list)  # display names for runs; default: folder names
    baseline: str | None = None  # system the others are tested against; default: the first run
    split: str = "test"
    out_dir: str | None = None  # default: <run>/eval/<split>-beam<k>; runs=[..]: runs/compare/<...>
    apertium: bool = False  # also translate the split with Apertium and add it as a system
    apertium_pair: str = "spa-eng"


@dataclass
class ArmConfig:
    """One arm of the reproduction: the base config with another attention (and length cap)."""

    attention: str = MISSING  # a model/attention group: none | bahdanau | luong
    max_src_words: int = 0  # train.max_src_words of this arm (RNNsearch-30/-50); 0 = the base's
    baseline: str = ""  # the arm it is compared with (paired test, ratio trend); "" = none


@dataclass
class ReproduceConfig:
    """What `seq2seq-reproduce` trains, evaluates and compares; profiles set the arms."""

    profile: str = "custom"  # name shown in the report; configs/profile/*.yaml set it
    out_dir: str = "runs/reproduce_${reproduce.profile}"  # arms/, evaluations, report.md, results.json
    arms: dict[str, ArmConfig] = field(default_factory=dict)  # name -> arm, in training order
    splits: list[str] = field(default_factory=lambda: ["test", "test_long"])
    build_corpus: bool = True  # build data/<name>/ first when it is missing
    apertium: bool = True  # the rule-based reference row; skipped with a note when not installed
    apertium_pair: str = "spa-eng"
    plot_split: str = "test"  # the split drawn in bleu_vs_length.png
    # several training seeds: every arm is trained once per seed (arms/<name>/seed<k>) and
    # the report gives mean ± sd per bucket and tests pooled across seeds (seq2seq/experiments/seeds.py);
    # [] = one run per arm with train.seed, in arms/<name>/
    seeds: list[int] = field(default_factory=list)
    budget_note: str = ""  # the profile's words on what its budget can show (report's top)
    longer_profile: str = ""  # a profile with more training per arm, named when an arm misses


@dataclass
class ReproduceAppConfig(Config):
    """Primary schema of `seq2seq-reproduce`: the training config every arm starts from."""

    eval: EvalConfig = field(default_factory=EvalConfig)
    reproduce: ReproduceConfig = field(default_factory=ReproduceConfig)


@dataclass
class AverageConfig:
    """Primary schema of `seq2seq-average`: average a run's kept validation checkpoints."""

    run: str | None = None  # the run folder (trained with train.keep_checkpoints=N)
    last: int = 5  # average the newest `last` checkpoints of <run>/checkpoints/
    checkpoints: list[str] = field(default_factory=list)  # or these files (of one run)
    output: str = ""  # default <run>/averaged.pt


@dataclass
class LimitsConfig:
    """What one request may ask for; going over a limit is a 4xx JSON error naming it."""

    max_chars: int = 1000  # characters per sentence
    max_sentences: int = 16  # sentences per request
    max_beam: int = 10
    max_nbest: int = 5
    timeout_s: float = 30.0  # a request still undecoded after this long gets 408
    max_queue: int = 64  # requests waiting for the decoder; more get 429


@dataclass
class ServeConfig:
    """Primary schema of `seq2seq-serve`; its keys are top-level (runs=... port=...)."""

    # run folders (or checkpoints) to serve; an element that is itself a list is one
    # ensemble (seq2seq/inference/ensemble.py)
    runs: list[Any] = field(default_factory=list)
    names: list[str] = field(default_factory=list)  # display names for runs; default: folder names
    # or a seq2seq-reproduce output folder: every arm under arms/, one model per arm
    reproduction: str = ""
    seed: int = 0  # with reproduction= and seed folders (arms/<arm>/seed<k>): which k; 0 = lowest
    host: str = "127.0.0.1"  # loopback only; 0.0.0.0 exposes the server to the network
    port: int = 8000  # 0 = any free port (the URL is printed)
    beam: int = 5  # the page's initial beam
    alpha: float = 0.6  # GNMT length penalty of the beam score
    max_len_ratio: float = 2.0  # output cap: int(ratio * source subwords) + max_len_extra
    max_len_extra: int = 10
    max_src_tokens: int = 0  # longer inputs are cut (and flagged); 0 = 4 x the run's train.max_src_words
    batch_tokens: int = DECODE_BATCH_TOKENS  # padded source subwords per batch
    device: str = "cpu"  # cpu | cuda | auto
    # torch intra-op threads of the decoding thread; 0 = all cores. One leaves a core to the
    # HTTP event loop, and small batches gain little from more (see seq2seq.config.TranslateConfig.threads)
    threads: int = 1
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    log_level: LogLevel = LogLevel.warning  # uvicorn's


def register_configs() -> None:
    """Register the schemas so YAML files are validated against them."""
    cs = ConfigStore.instance()
    cs.store(name="base_config", node=Config)
    cs.store(name="evaluate_schema", node=EvaluateConfig)
    cs.store(name="reproduce_schema", node=ReproduceAppConfig)
    cs.store(name="translate_schema", node=TranslateConfig)
    cs.store(name="average_schema", node=AverageConfig)
    cs.store(name="serve_schema", node=ServeConfig)
