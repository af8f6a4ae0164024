"""Seq2Seq: shapes, teacher-forced forward == step loop (fast paths included), padding
invariance, encoder vs a packed reference, tying, scheduled sampling, overfitting."""

from __future__ import annotations

import time

import pytest
import torch
import torch.nn.functional as F
from model_helpers import ATTENTION_VARIANTS as ATTENTIONS
from model_helpers import (
    fit,
    one_thread,  # noqa: F401  (autouse fixture)
)
from model_helpers import reverse_task as _reverse_task
from model_helpers import variant_id as _ids
from omegaconf import OmegaConf
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from seq2seq.config import AttentionConfig, ModelConfig
from seq2seq.constants import BOS_ID, PAD_ID
from seq2seq.errors import ConfigError, DataError
from seq2seq.model import build_model, count_parameters
from seq2seq.model.fast import _length_mask

V = 17


def _model(att: AttentionConfig, rnn: str = "gru", **kw):
    torch.manual_seed(0)
    cfg = ModelConfig(rnn_type=rnn, emb_size=8, hidden_size=6, attention=att, **kw)
    return build_model(cfg, V, V)


def _batch(seed: int = 0):
    """src (4, 7) with lengths 7, 3, 5, 1; tgt_in (4, 6) starting with BOS."""
    gen = torch.Generator().manual_seed(seed)
    lens = torch.tensor([7, 3, 5, 1])
    src = torch.randint(4, V, (4, 7), generator=gen)
    src[torch.arange(7).unsqueeze(0) >= lens.unsqueeze(1)] = PAD_ID
    tgt_in = torch.randint(4, V, (4, 6), generator=gen)
    tgt_in[:, 0] = BOS_ID
    return src, lens, tgt_in


def _step_loop(model, src, lens, tgt_in):
    """The reference: encode, then step() token by token."""
    memory = model.encode(src, lens)
    state = model.init_state(memory)
    logits, weights = [], []
    for t in range(tgt_in.size(1)):
        out, state, w = model.step(tgt_in[:, t], state, memory)
        logits.append(out)
        weights.append(w)
    return torch.stack(logits, 1), torch.stack(weights, 1)


@pytest.mark.parametrize("rnn", ["gru", "lstm"])
@pytest.mark.parametrize("att", ATTENTIONS, ids=_ids)
def test_shapes_and_masked_attention(att, rnn):
    model = _model(att, rnn)
    src, lens, tgt_in = _batch()
    logits, weights = model.forward_with_attention(src, lens, tgt_in)
    assert logits.shape == (4, 6, V) and weights.shape == (4, 6, 7)
    pad = (src == PAD_ID).unsqueeze(1).expand_as(weights)
    assert bool((weights[pad] == 0).all())
    expected = 0.0 if att.name == "none" else 1.0
    torch.testing.assert_close(weights.sum(-1), torch.full((4, 6), expected))
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("rnn", ["gru", "lstm"])
@pytest.mark.parametrize("att", ATTENTIONS, ids=_ids)
def test_teacher_forced_forward_equals_step_loop(att, rnn, layers):
    """Covers the fast paths: fused RNN call (none, luong without input feeding),
    keys projected once, readout/logits over all steps after the loop."""
    model = _model(att, rnn, enc_layers=layers, dec_layers=layers).double().eval()
    src, lens, tgt_in = _batch()
    logits, weights = model.forward_with_attention(src, lens, tgt_in)
    ref_logits, ref_weights = _step_loop(model, src, lens, tgt_in)
    torch.testing.assert_close(logits, ref_logits, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(weights, ref_weights, rtol=1e-10, atol=1e-10)


def test_fused_path_is_taken_where_the_rnn_input_is_known_in_advance():
    fused = {_ids(a): _model(a).decoder.can_fuse for a in ATTENTIONS}
    assert fused["none"] and fused["luong-general-nofeed"]
    assert not fused["bahdanau"] and not fused["luong-general-feed"]


@pytest.mark.parametrize("att", ATTENTIONS[:3], ids=_ids)
def test_float32_fast_path_close_to_step_loop(att):
    model = _model(att).eval()
    src, lens, tgt_in = _batch()
    ref, _ = _step_loop(model, src, lens, tgt_in)
    torch.testing.assert_close(model(src, lens, tgt_in), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("rnn", ["gru", "lstm"])
def test_encoder_equals_packed_reference(rnn, bidirectional):
    """The reversal trick gives the same states as a packed nn.GRU/nn.LSTM run."""
    torch.manual_seed(0)
    model = _model(AttentionConfig(name="bahdanau"), rnn, bidirectional=bidirectional,
                   enc_layers=2).double().eval()
    enc = model.encoder
    ref = torch.nn.GRU if rnn == "gru" else torch.nn.LSTM
    ref = ref(8, 6, num_layers=2, bidirectional=bidirectional, batch_first=True).double()
    with torch.no_grad():
        for layer in range(2):
            for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
                getattr(ref, f"{name}_l{layer}").copy_(getattr(enc.fwd[layer], f"{name}_l0"))
                if bidirectional:
                    getattr(ref, f"{name}_l{layer}_reverse").copy_(
                        getattr(enc.bwd[layer], f"{name}_l0"))
    src, lens, _ = _batch()
    states_ours, final_ours = enc(src, lens, _length_mask(lens, src.size(1)))
    packed = pack_padded_sequence(enc.embedding(src), lens, batch_first=True,
                                  enforce_sorted=False)
    out, h_n = ref(packed)
    states, _ = pad_packed_sequence(out, batch_first=True, total_length=7)
    h_n = h_n[0] if rnn == "lstm" else h_n
    final = torch.cat(list(h_n[-(2 if bidirectional else 1):]), dim=-1)
    torch.testing.assert_close(states_ours, states)
    torch.testing.assert_close(final_ours, final)
    torch.testing.assert_close(model.encode(src, lens).final, final)


@pytest.mark.parametrize("rnn", ["gru", "lstm"])
@pytest.mark.parametrize("att", ATTENTIONS[:3], ids=_ids)
def test_padding_and_batch_companions_do_not_matter(att, rnn):
    model = _model(att, rnn).eval()
    src, lens, tgt_in = _batch()
    logits = model(src, lens, tgt_in)
    memory = model.encode(src, lens)
    # sentence 1 (length 3) alone, with no padding, and with extra padding columns
    alone = model(src[1:2, :3], lens[1:2], tgt_in[1:2])
    wide = torch.cat([src[1:2], torch.full((1, 4), PAD_ID)], dim=1)
    padded = model(wide, lens[1:2], tgt_in[1:2])
    torch.testing.assert_close(alone[0], logits[1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(padded[0], logits[1], rtol=1e-5, atol=1e-5)
    mem_alone = model.encode(src[1:2, :3], lens[1:2])
    states, _ = model.encoder(src, lens, _length_mask(lens, src.size(1)))
    states_alone, _ = model.encoder(src[1:2, :3], lens[1:2], _length_mask(lens[1:2], 3))
    torch.testing.assert_close(states_alone[0], states[1, :3], rtol=1e-5, atol=1e-5)
    assert bool((states[1, 3:] == 0).all())
    torch.testing.assert_close(mem_alone.final[0], memory.final[1], rtol=1e-5, atol=1e-5)


def test_memory_and_state_index_select_match_a_smaller_batch():
    model = _model(AttentionConfig(name="luong")).double().eval()  # input feeding state
    src, lens, tgt_in = _batch()
    memory = model.encode(src, lens)
    state = model.init_state(memory)
    idx = torch.tensor([2, 0, 2])
    logits, _, w = model.step(tgt_in[:, 0], state, memory)
    sel_logits, _, sel_w = model.step(tgt_in[idx, 0], state.index_select(idx),
                                      memory.index_select(idx))
    torch.testing.assert_close(sel_logits, logits[idx])
    torch.testing.assert_close(sel_w, w[idx])


def test_tied_embeddings_share_the_matrix_and_project_when_sizes_differ():
    src, lens, tgt_in = _batch()
    untied = _model(AttentionConfig(name="bahdanau"))
    tied = _model(AttentionConfig(name="bahdanau"), tie_embeddings=True)
    assert tied.decoder.tie_proj is not None  # hidden 6 != emb 8
    assert count_parameters(tied) < count_parameters(untied)
    logits = tied(src, lens, tgt_in)
    assert logits.shape == (4, 6, V)
    logits.sum().backward()
    assert tied.decoder.embedding.weight.grad.abs().sum() > 0
    torch.manual_seed(0)
    same = build_model(ModelConfig(emb_size=6, hidden_size=6, tie_embeddings=True), V, V)
    assert same.decoder.tie_proj is None


@pytest.mark.parametrize("options", [{"maxout": True}, {"deep_output": False},
                                     {"bidirectional": False}])
def test_model_options_build_and_agree_with_step(options):
    model = _model(AttentionConfig(name="bahdanau"), **options).double().eval()
    src, lens, tgt_in = _batch()
    ref, _ = _step_loop(model, src, lens, tgt_in)
    torch.testing.assert_close(model(src, lens, tgt_in), ref)


def test_scheduled_sampling_goes_through_step(monkeypatch):
    model = _model(AttentionConfig(name="luong", input_feeding=False)).train()
    src, lens, tgt_in = _batch()
    calls = []
    original = model.decoder.step

    def counting_step(*args):
        calls.append(1)
        return original(*args)

    monkeypatch.setattr(model.decoder, "step", counting_step)
    logits, weights = model.forward_with_attention(src, lens, tgt_in, teacher_forcing=0.5)
    assert len(calls) == tgt_in.size(1)
    assert logits.shape == (4, 6, V) and weights.shape == (4, 6, 7)
    logits.sum().backward()  # differentiable


def test_scheduled_sampling_feeds_the_models_own_argmax():
    model = _model(AttentionConfig(name="bahdanau")).double().eval()
    src, lens, tgt_in = _batch()
    # a ratio this small always samples: the result is greedy decoding's logits
    sampled = model(src, lens, tgt_in, teacher_forcing=1e-12)
    memory = model.encode(src, lens)
    state, y, ref = model.init_state(memory), tgt_in[:, 0], []
    for _ in range(tgt_in.size(1)):
        out, state, _ = model.step(y, state, memory)
        ref.append(out)
        y = out.argmax(-1)
    torch.testing.assert_close(sampled, torch.stack(ref, 1))


def test_build_model_accepts_dataclass_dictconfig_and_dict():
    cfg = ModelConfig(emb_size=8, hidden_size=6)
    counts = set()
    for form in (cfg, OmegaConf.structured(cfg),
                 {"emb_size": 8, "hidden_size": 6, "attention": {"name": "bahdanau"}}):
        torch.manual_seed(0)
        counts.add(count_parameters(build_model(form, V, V)))
    assert len(counts) == 1


def test_arms_have_comparable_sizes():
    sizes = {a.name: count_parameters(_model(a)) for a in ATTENTIONS[:3]}
    assert max(sizes.values()) < 1.25 * min(sizes.values())


@pytest.mark.parametrize("bad, message", [
    ({"rnn_type": "rnn"}, "gru"),
    ({"hidden_size": 0}, "hidden_size"),
    ({"dropout": 1.0}, "dropout"),
    ({"attention": {"name": "nope"}}, "bahdanau"),
    ({"attention": {"name": "luong", "score": "cos"}}, "scaled_dot"),
    ({"hiden_size": 6}, "hiden_size"),
    ({"emb_size": "big"}, "emb_size"),
])
def test_bad_model_config_is_refused_with_the_fix(bad, message):
    with pytest.raises(ConfigError, match=message):
        build_model(bad, V, V)


def test_bad_batches_are_refused_with_a_clear_error():
    model = _model(AttentionConfig(name="bahdanau"))
    src, lens, tgt_in = _batch()
    with pytest.raises(DataError, match="at least one token"):
        model(src, torch.tensor([7, 0, 5, 1]), tgt_in)
    with pytest.raises(DataError, match="exceeds"):
        model(src, torch.tensor([8, 3, 5, 1]), tgt_in)
    with pytest.raises(DataError, match="tgt_in"):
        model(src, lens, tgt_in[:2])




LOSS_BOUND = 0.05  # mean token cross-entropy (nats) after 60 full-batch Adam steps


@pytest.mark.parametrize("rnn", ["gru", "lstm"])
@pytest.mark.parametrize("att", [AttentionConfig(name="none"), AttentionConfig(name="bahdanau"),
                                 AttentionConfig(name="luong")], ids=_ids)
def test_overfits_a_tiny_reverse_task(att, rnn):
    torch.manual_seed(0)
    cfg = ModelConfig(rnn_type=rnn, emb_size=32, hidden_size=64, dropout=0.0, attention=att)
    model = build_model(cfg, 12, 12)
    src, lens, tgt_in, tgt_out = _reverse_task()
    start = time.perf_counter()
    loss = fit(model, src, lens, tgt_in, tgt_out, steps=60)
    assert loss.item() < LOSS_BOUND, f"loss {loss.item():.4f} after 60 steps"
    assert time.perf_counter() - start < 20


@pytest.mark.parametrize("att", ["none", "bahdanau", "luong"])
def test_composed_hydra_config_builds_a_model(att):
    from pathlib import Path

    from hydra import compose, initialize_config_dir

    from seq2seq.config import register_configs

    register_configs()
    configs = str(Path(__file__).resolve().parent.parent / "configs")
    with initialize_config_dir(config_dir=configs, version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            f"model/attention={att}", "model.emb_size=8", "model.hidden_size=6"])
    model = build_model(cfg.model, V, V)
    expected = {"none": "NoAttention", "bahdanau": "BahdanauAttention", "luong": "LuongAttention"}
    assert type(model.attention).__name__ == expected[att]
    src, lens, tgt_in = _batch()
    assert model(src, lens, tgt_in).shape == (4, 6, V)


@pytest.mark.parametrize("att", ATTENTIONS[:3], ids=_ids)
def test_runs_under_bf16_autocast(att):
    model = _model(att)
    src, lens, tgt_in = _batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(src, lens, tgt_in)
        memory = model.encode(src, lens)
        step_logits, _, _ = model.step(tgt_in[:, 0], model.init_state(memory), memory)
    assert logits.shape == (4, 6, V) and step_logits.shape == (4, V)
    logits.float().sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_luong_deep_output_reads_the_previous_embedding():
    plain = _model(AttentionConfig(name="luong"))
    deep = _model(AttentionConfig(name="luong", deep_output=True))
    assert not plain.decoder.reads_embedding and deep.decoder.reads_embedding
    # readout input [s; c] (6 + 12) grows by the embedding size (8)
    assert deep.decoder.readout.proj.in_features == plain.decoder.readout.proj.in_features + 8
    # the model config can still switch the deep output off for every attention
    off = _model(AttentionConfig(name="luong", deep_output=True), deep_output=False)
    assert not off.decoder.reads_embedding


@pytest.mark.parametrize("rnn", ["gru", "lstm"])
@pytest.mark.parametrize("att", ATTENTIONS, ids=_ids)
def test_teacher_forced_gradients_equal_step_loop(att, rnn):
    """The loop's deferred gradients (seq2seq/model/deferred.py) and the fused paths give
    every parameter the gradient of the plain step loop."""
    model = _model(att, rnn, dec_layers=2).double().eval()
    src, lens, tgt_in = _batch()
    weight = torch.randn(4, 6, V, generator=torch.Generator().manual_seed(1), dtype=torch.double)

    def grads(logits):
        model.zero_grad(set_to_none=True)
        (logits * weight).sum().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    fast = grads(model(src, lens, tgt_in))
    ref = grads(_step_loop(model, src, lens, tgt_in)[0])
    assert fast.keys() == ref.keys() and len(ref) > 10
    for name in ref:
        torch.testing.assert_close(fast[name], ref[name], rtol=1e-9, atol=1e-11, msg=name)


@pytest.mark.parametrize("rnn", ["gru", "lstm"])
@pytest.mark.parametrize("att", ATTENTIONS, ids=_ids)
def test_training_loss_skips_finished_rows_exactly(att, rnn):
    """forward(targets=) runs the step loop on unfinished rows only (rows re-sorted,
    finished ones dropped): its loss and every gradient equal the plain step loop's
    cross-entropy over the real tokens. Target lengths 3, 6, 1, 3: unsorted, a tie,
    a one-token target."""
    model = _model(att, rnn, dec_layers=2).double().eval()
    src, lens, tgt_in = _batch()
    tgt_lens = torch.tensor([3, 6, 1, 3])
    tgt_out = torch.randint(4, V, tgt_in.shape, generator=torch.Generator().manual_seed(2))
    tgt_out[torch.arange(6).unsqueeze(0) >= tgt_lens.unsqueeze(1)] = PAD_ID
    tgt_in[torch.arange(6).unsqueeze(0) >= tgt_lens.unsqueeze(1)] = PAD_ID

    def grads(loss):
        model.zero_grad(set_to_none=True)
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                               if p.grad is not None}

    ref_logits = _step_loop(model, src, lens, tgt_in)[0]
    ref, ref_grads = grads(F.cross_entropy(ref_logits.flatten(0, 1), tgt_out.flatten(),
                                           ignore_index=PAD_ID, reduction="sum"))
    out, out_grads = grads(model(src, lens, tgt_in, targets=tgt_out))
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    assert out_grads.keys() == ref_grads.keys() and len(ref_grads) > 10
    for name in ref_grads:
        torch.testing.assert_close(out_grads[name], ref_grads[name], rtol=1e-9, atol=1e-11,
                                   msg=name)


@pytest.mark.parametrize("backward", [True, False])
@pytest.mark.parametrize("att", ATTENTIONS[:3], ids=_ids)
def test_training_step_leaves_nothing_alive(att, backward, monkeypatch):
    """The step loop's deferred gradients must not tie the batch's graph into a
    reference cycle through autograd's C++ nodes (invisible to Python's gc): that kept
    every batch's encoder states alive and ran a 12-minute training out of memory."""
    import gc
    import weakref

    import seq2seq.model.attention as attention_module

    made = []

    class Tracked(attention_module.DeferredGrad):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(weakref.ref(self))
            made.append(weakref.ref(self.shared))

    monkeypatch.setattr(attention_module, "DeferredGrad", Tracked)
    model = _model(att).train()
    src, lens, tgt_in = _batch()
    loss = model(src, lens, tgt_in, targets=tgt_in.roll(-1, dims=1))
    if backward:
        loss.backward()
    del loss
    gc.collect()
    expect_loop = att.name != "none" and (att.input_feeding or att.name == "bahdanau")
    assert (len(made) > 0) == expect_loop
    assert all(ref() is None for ref in made)
