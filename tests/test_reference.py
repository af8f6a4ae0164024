"""The reference model (seq2seq/model/reference.py) is the oracle for the fast one.

With the same weights in float64, the fast model's training loss and every parameter
gradient, its teacher-forced logits and attention, and its greedy and beam outputs
equal the reference's. The reference shares no code with the fast model's modules, so
a broken fast path (fused RNN call, packed step loop, deferred gradients, fused output
layer and loss) shows up here. Also: one state dict loads into either, and
``model.impl=reference`` trains and decodes end to end.
"""

from __future__ import annotations

import ast
import itertools
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from model_helpers import one_thread  # noqa: F401  (autouse fixture)
from omegaconf import OmegaConf
from test_train import run_cli

import seq2seq.model.loss
from seq2seq import constants
from seq2seq.config import AttentionConfig, ModelConfig
from seq2seq.constants import BOS_ID, EOS_ID, PAD_ID
from seq2seq.errors import ConfigError
from seq2seq.inference.search import beam_search, greedy
from seq2seq.model import build_model, reference
from seq2seq.model.fast import Seq2Seq
from seq2seq.model.reference import ReferenceSeq2Seq
from seq2seq.runs import checkpoint

SRC_V, TGT_V, HIDDEN = 13, 11, 4
TOL = {"rtol": 1e-10, "atol": 1e-12}  # float64: the two differ only in summation order

# ------------------------------------------------------------- the variants

ATTENTIONS = ["none", "bahdanau", "luong-dot", "luong-general", "luong-concat",
              "luong-scaled_dot"]
# two-level factors; the first two matter to Luong only
BINARY = {
    "input_feeding": (True, False),
    "luong_deep_output": (False, True),  # model.attention.deep_output
    "rnn_type": ("gru", "lstm"),
    "deep_output": (True, False),
    "maxout": (False, True),
    "tie_embeddings": (False, True),
    "emb_size": (HIDDEN + 1, HIDDEN),  # tied: a projection H -> E only when they differ
    "layers": (1, 2),
    "bidirectional": (True, False),  # unidirectional: dot without a key projection
    "label_smoothing": (0.0, 0.1),
}


def orthogonal_rows(n_factors: int) -> list[tuple[int, ...]]:
    """16 rows of 0/1 levels in which every pair of factors takes each of its four level
    pairs (00, 01, 10, 11) exactly 4 times: row r, factor c -> parity of r & c over
    distinct nonzero 4-bit c (a strength-2 orthogonal array)."""
    assert n_factors <= 15
    return [tuple(bin(r & c).count("1") % 2 for c in range(1, n_factors + 1))
            for r in range(16)]


def variant(attention: str, levels: tuple[int, ...]) -> dict:
    """One variant: an attention with one level of every binary factor."""
    v = {name: values[level] for (name, values), level in zip(BINARY.items(), levels, strict=True)}
    name, _, score = attention.partition("-")
    if name != "luong":  # these two do not exist there: one id per distinct model
        v["input_feeding"], v["luong_deep_output"] = True, False
    return {"attention": name, "score": score or "general", **v}


# every attention with each row: all level pairs of any two binary factors, per attention
VARIANTS = [variant(a, row) for a in ATTENTIONS for row in orthogonal_rows(len(BINARY))]


def variant_id(v: dict) -> str:
    att = v["attention"] if v["attention"] != "luong" else "luong-" + v["score"] + (
        "-feed" if v["input_feeding"] else "-nofeed") + ("-deep" if v["luong_deep_output"] else "")
    flags = [name for name in ("deep_output", "maxout", "tie_embeddings", "bidirectional")
             if v[name]]
    return "-".join([att, v["rnn_type"], f"E{v['emb_size']}", f"L{v['layers']}", *flags,
                     f"ls{v['label_smoothing']}"])


def model_config(v: dict) -> ModelConfig:
    att = AttentionConfig(name=v["attention"], score=v["score"],
                          input_feeding=v["input_feeding"], deep_output=v["luong_deep_output"])
    return ModelConfig(rnn_type=v["rnn_type"], emb_size=v["emb_size"], hidden_size=HIDDEN,
                       enc_layers=v["layers"], dec_layers=v["layers"], dropout=0.0,
                       bidirectional=v["bidirectional"], deep_output=v["deep_output"],
                       maxout=v["maxout"], tie_embeddings=v["tie_embeddings"], attention=att)


def test_variants_cover_every_pair_of_levels_for_every_attention():
    for attention in ATTENTIONS:
        name, _, score = attention.partition("-")
        rows = [v for v in VARIANTS if v["attention"] == name and (not score or v["score"] == score)]
        names = [n for n in BINARY if attention.startswith("luong") or n not in
                 ("input_feeding", "luong_deep_output")]
        for a, b in itertools.combinations(names, 2):
            seen = {(v[a], v[b]) for v in rows}
            assert seen == set(itertools.product(BINARY[a], BINARY[b])), (attention, a, b)


# ------------------------------------------------------------- the oracle


def batch():
    """Unsorted, padded: source lengths 3, 6, 1, 5; target lengths (with EOS) 4, 6, 2, 5."""
    gen = torch.Generator().manual_seed(0)
    src_lens = torch.tensor([3, 6, 1, 5])
    src = torch.randint(4, SRC_V, (4, 6), generator=gen)
    src[torch.arange(6) >= src_lens.unsqueeze(1)] = PAD_ID
    tgt = torch.randint(4, TGT_V, (4, 7), generator=gen)
    tgt[:, 0] = BOS_ID
    for row, n in enumerate([4, 6, 2, 5]):
        tgt[row, n], tgt[row, n + 1:] = EOS_ID, PAD_ID
    return src, src_lens, tgt[:, :-1], tgt[:, 1:]


def twins(v: dict) -> tuple[Seq2Seq, ReferenceSeq2Seq]:
    """The fast and the reference model of a variant with the same float64 weights."""
    torch.manual_seed(0)
    fast = build_model(model_config(v), SRC_V, TGT_V).double()
    ref = build_model(replace(model_config(v), impl="reference"), SRC_V, TGT_V).double()
    assert isinstance(fast, Seq2Seq) and isinstance(ref, ReferenceSeq2Seq)
    ref.load_state_dict(fast.state_dict(), strict=True)
    return fast, ref


def loss_and_grads(model, src, src_lens, tgt_in, tgt_out, smoothing: float):
    model.zero_grad()
    loss = model(src, src_lens, tgt_in, targets=tgt_out, label_smoothing=smoothing)
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("v", VARIANTS, ids=variant_id)
def test_fast_model_equals_the_reference(v, monkeypatch):
    # small chunks, so the fused output layer + loss runs its chunk loop (6 chunks here)
    monkeypatch.setattr(seq2seq.model.loss, "CHUNK_ROWS", 3)
    fast, ref = twins(v)
    src, src_lens, tgt_in, tgt_out = batch()

    loss, grads = loss_and_grads(fast, src, src_lens, tgt_in, tgt_out, v["label_smoothing"])
    ref_loss, ref_grads = loss_and_grads(ref, src, src_lens, tgt_in, tgt_out, v["label_smoothing"])
    torch.testing.assert_close(loss, ref_loss, **TOL)
    assert grads.keys() == ref_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, ref_grads[name], **TOL, msg=lambda m, n=name: f"{n}: {m}")

    with torch.no_grad():  # the teacher-forced forward (the fused RNN call where it applies)
        logits, weights = fast.forward_with_attention(src, src_lens, tgt_in)
        ref_logits, ref_weights = ref.forward_with_attention(src, src_lens, tgt_in)
    torch.testing.assert_close(logits, ref_logits, **TOL)
    torch.testing.assert_close(weights, ref_weights, **TOL)

    for hyp, ref_hyp in zip(greedy(fast, src, src_lens), greedy(ref, src, src_lens), strict=True):
        assert hyp.tokens == ref_hyp.tokens
        assert hyp.score == pytest.approx(ref_hyp.score, rel=1e-6)  # search scores in float32
        torch.testing.assert_close(hyp.attention, ref_hyp.attention)
    beams = beam_search(fast, src, src_lens, beam=3, nbest=2)
    ref_beams = beam_search(ref, src, src_lens, beam=3, nbest=2)
    assert [[h.tokens for h in hs] for hs in beams] == [[h.tokens for h in hs] for hs in ref_beams]


# every attention, GRU and LSTM, one and two layers, input feeding on and off (Luong)
GRID_VARIANTS = [v for v in VARIANTS if v["rnn_type"] == "lstm" or v["layers"] == 2][::6]


@pytest.mark.parametrize("grid", [2, 3])
@pytest.mark.parametrize("v", GRID_VARIANTS, ids=variant_id)
def test_step_rows_on_a_grid_equal_the_reference(v, grid, monkeypatch):
    """The packed loop with its row counts rounded up (as under CPU bf16 autocast): rows
    run past their target's end are dropped, so loss and gradients stay the reference's;
    and every step did run a multiple of the grid (or the whole batch)."""
    monkeypatch.setattr(seq2seq.model.loss, "CHUNK_ROWS", 3)
    fast, ref = twins(v)
    fast.decoder.row_grid = grid
    rows = []
    advance = fast.decoder._advance
    monkeypatch.setattr(fast.decoder, "_advance",
                        lambda emb, *a: rows.append(emb.size(0)) or advance(emb, *a))
    src, src_lens, tgt_in, tgt_out = batch()
    loss, grads = loss_and_grads(fast, src, src_lens, tgt_in, tgt_out, v["label_smoothing"])
    ref_loss, ref_grads = loss_and_grads(ref, src, src_lens, tgt_in, tgt_out, v["label_smoothing"])
    torch.testing.assert_close(loss, ref_loss, **TOL)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, ref_grads[name], **TOL, msg=lambda m, n=name: f"{n}: {m}")
    if rows:  # the fused RNN call (none, Luong without input feeding) has no step loop
        # target lengths 6, 5, 4, 2: without the grid 4, 4, 3, 3, 2, 1 rows
        want = [min(4, -(-n // grid) * grid) for n in (4, 4, 3, 3, 2, 1)]
        assert rows == want, rows


def test_the_row_grid_applies_under_cpu_bf16_autocast_only():
    from seq2seq.model.decoder import ROW_GRID_BF16_CPU, row_grid

    assert row_grid("cpu") == 1
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert row_grid("cpu") == ROW_GRID_BF16_CPU > 1
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=False):
        assert row_grid("cpu") == 1


@pytest.mark.parametrize("attention", ["bahdanau", "luong-general"])
def test_scheduled_sampling_equals_the_reference(attention):
    """teacher_forcing < 1 draws which sentences read their own argmax in the same order."""
    fast, ref = twins(variant(attention, (0,) * len(BINARY)))
    src, src_lens, tgt_in, tgt_out = batch()
    torch.manual_seed(3)
    loss = fast(src, src_lens, tgt_in, teacher_forcing=0.5, targets=tgt_out)
    torch.manual_seed(3)
    ref_loss = ref(src, src_lens, tgt_in, teacher_forcing=0.5, targets=tgt_out)
    torch.testing.assert_close(loss.double(), ref_loss)  # the fast one sums in float32 here


@pytest.mark.parametrize("attention", ATTENTIONS)
@pytest.mark.parametrize("rnn", ["gru", "lstm"])
def test_same_seed_same_weights_and_state_dicts_load_both_ways(attention, rnn):
    levels = (0, 0, int(rnn == "lstm"), 0, 1, 1, 0, 1, 0, 0)  # maxout, tied, 2 layers
    cfg = model_config(variant(attention, levels))
    torch.manual_seed(5)
    fast = build_model(cfg, SRC_V, TGT_V)
    torch.manual_seed(5)
    ref = ReferenceSeq2Seq(cfg, SRC_V, TGT_V)
    assert {n: p.shape for n, p in fast.state_dict().items()} == {
        n: p.shape for n, p in ref.state_dict().items()}
    for name, tensor in fast.state_dict().items():  # parameters are created in the same order
        assert torch.equal(tensor, ref.state_dict()[name]), name
    torch.manual_seed(6)
    other = ReferenceSeq2Seq(cfg, SRC_V, TGT_V)
    fast.load_state_dict(other.state_dict(), strict=True)
    ref.load_state_dict(fast.state_dict(), strict=True)
    assert all(torch.equal(a, b) for a, b in zip(ref.state_dict().values(),
                                                 other.state_dict().values(), strict=True))


def test_reference_imports_only_torch():
    tree = ast.parse(Path(reference.__file__).read_text())
    modules = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
               for alias in node.names}
    modules |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert {m.split(".")[0] for m in modules} <= {"__future__", "dataclasses", "typing", "torch"}
    assert reference.PAD_ID == constants.PAD_ID


def test_masked_positions_get_zero_weight_and_padding_changes_nothing():
    fast, ref = twins(variant("bahdanau", (0,) * len(BINARY)))
    src, src_lens, tgt_in, _ = batch()
    with torch.no_grad():
        logits, weights = ref.forward_with_attention(src, src_lens, tgt_in)
        wide = torch.cat([src, torch.full((4, 3), PAD_ID)], dim=1)  # three more padding columns
        wide_logits, wide_weights = ref.forward_with_attention(wide, src_lens, tgt_in)
    pad = (src == PAD_ID).unsqueeze(1).expand_as(weights)
    assert bool((weights[pad] == 0).all()) and bool((wide_weights[..., 6:] == 0).all())
    torch.testing.assert_close(weights.sum(-1), torch.ones(4, 6, dtype=weights.dtype))
    torch.testing.assert_close(wide_logits, logits, **TOL)
    torch.testing.assert_close(wide_weights[..., :6], weights, **TOL)


def test_unknown_impl_and_attention_are_config_errors():
    with pytest.raises(ConfigError, match=r"Invalid value 'slow'.*\(model\.impl\)"):
        build_model({"impl": "slow"}, SRC_V, TGT_V)
    with pytest.raises(ConfigError, match=r"Invalid value 'luong2'.*\(model\.attention\.name\)"):
        build_model({"impl": "reference", "attention": {"name": "luong2"}}, SRC_V, TGT_V)
    with pytest.raises(ConfigError, match=r"Invalid value 'cosine'.*\(model\.attention\.score\)"):
        build_model({"impl": "reference", "attention": {"name": "luong", "score": "cosine"}},
                    SRC_V, TGT_V)


# ------------------------------------------------------------- end to end


def test_reference_trains_via_the_cli_decodes_and_its_checkpoint_loads_in_the_fast_model(
        tiny_train_overrides, tmp_path: Path):
    run_dir = tmp_path / "run"
    proc = run_cli(*tiny_train_overrides, f"run_dir={run_dir}", "train.max_steps=4",
                   "model/attention=luong", "model.impl=reference", "model.dropout=0.0",
                   "train.valid_every=4")
    assert proc.returncode == 0, proc.stderr[-3000:]
    ref, tokenizers, cfg = checkpoint.load_model(run_dir)
    assert isinstance(ref, ReferenceSeq2Seq) and cfg.model.impl == "reference"
    ids = torch.tensor([tokenizers.src.encode("el perro come pan")])
    lens = torch.tensor([ids.size(1)])
    [hyps] = beam_search(ref, ids, lens, beam=3)
    assert isinstance(tokenizers.tgt.decode(hyps[0].tokens), str)

    # the same checkpoint in the fast model decodes to the same tokens, and back again
    ckpt = checkpoint.load_checkpoint(checkpoint.find_checkpoint(run_dir))
    fast_cfg = OmegaConf.merge(cfg.model, {"impl": "fast"})
    fast = build_model(fast_cfg, ckpt["vocab"]["src"], ckpt["vocab"]["tgt"])
    fast.load_state_dict(ckpt["model"], strict=True)
    [fast_hyps] = beam_search(fast, ids, lens, beam=3)
    assert fast_hyps[0].tokens == hyps[0].tokens
    assert greedy(fast, ids, lens)[0].tokens == greedy(ref, ids, lens)[0].tokens
    ref.load_state_dict(fast.state_dict(), strict=True)
