"""The native kernels (seq2seq/native) against the torch ops they replace: the
same numbers within fp32 rounding, PAD and BOS never chosen, the same beam-search
output, the choice by timing, and a clean fallback when no C compiler builds them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from model_helpers import (
    fit,
    one_thread,  # noqa: F401  (autouse fixture)
    reverse_task,
)

from seq2seq import native
from seq2seq.config import AttentionConfig, ModelConfig
from seq2seq.constants import BOS_ID, PAD_ID
from seq2seq.inference.search import beam_search, greedy
from seq2seq.inference.vocab import _log_probs, best_tokens, row_topk
from seq2seq.model import build_model
from seq2seq.model.scorers import additive_scores
from seq2seq.native import build

ROOT = Path(__file__).resolve().parent.parent
needs_kernels = pytest.mark.skipif(not native.available(),
                                   reason=f"native kernels not built here: {native.status()}")


def test_the_kernels_build_wherever_a_c_compiler_is_found():
    """A machine with a compiler must not fall back silently (make system installs gcc)."""
    import shutil

    if not any(shutil.which(c) for c in ("cc", "gcc")):
        pytest.skip("no C compiler on this machine")
    assert native.available(), native.status()
    assert native.status().startswith("on (")


@needs_kernels
@pytest.mark.parametrize("queries", [0, 1, 5])  # 0: one (B, A) query per memory row
def test_additive_scores_equal_the_torch_path(queries):
    gen = torch.Generator().manual_seed(0)
    b, s, a = 7, 13, 48
    q2 = torch.randn((b, a) if queries == 0 else (b, queries, a), generator=gen) * 3
    keys = torch.randn(b, s, a, generator=gen) * 2
    v = torch.randn(1, a, generator=gen)
    got = native.additive_scores(q2, keys, v)
    want = additive_scores(q2.double(), keys.double(), v.double())
    assert got.dtype == torch.float32 and got.shape == want.shape
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


@needs_kernels
def test_additive_scores_in_bf16_are_the_fp32_scores_of_the_bf16_inputs():
    """bf16 inputs are widened exactly and the scores computed in fp32: closer to the
    exact scores than torch's bf16 chain, which rounds after each op."""
    gen = torch.Generator().manual_seed(1)
    q2 = (torch.randn(4, 5, 256, generator=gen) * 2).bfloat16()
    keys = torch.randn(4, 30, 256, generator=gen).bfloat16()
    v = torch.randn(1, 256, generator=gen) / 16
    exact = additive_scores(q2.double(), keys.double(), v.double())
    got = native.additive_scores(q2, keys, v)
    torch.testing.assert_close(got.double(), exact, rtol=1e-5, atol=1e-5)
    torch_bf16 = additive_scores(q2, keys, v).double()
    assert (got.double() - exact).abs().max() < (torch_bf16 - exact).abs().max()


@needs_kernels
def test_additive_scores_hold_at_extreme_arguments():
    q2 = torch.tensor([[[-500.0, 500.0, 0.0, 90.0]]])
    keys = torch.tensor([[[-200.0, 200.0, 1e-8, -45.0], [0.0, 0.0, 0.0, 0.0]]])
    v = torch.tensor([[1.0, -2.0, 0.5, 3.0]])
    got = native.additive_scores(q2, keys, v)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), additive_scores(q2.double(), keys.double(),
                                                             v.double()), rtol=1e-6, atol=1e-6)


def test_the_kernels_refuse_what_they_do_not_cover():
    keys = torch.randn(2, 3, 8)
    assert native.additive_scores(torch.randn(2, 8).double(), keys.double(), torch.ones(8)) is None
    assert native.additive_scores(torch.randn(2, 8).bfloat16(), keys, torch.ones(8)) is None
    assert native.vocab_topk(torch.randn(3, 6), 5, (PAD_ID, BOS_ID)) is None  # 5 > 6 - 2
    assert native.vocab_topk(torch.randn(3, 6).double(), 2) is None


@needs_kernels
@pytest.mark.parametrize("width", [8000, 8003, 100, 40])
@pytest.mark.parametrize("k", [1, 10])
def test_vocab_topk_equals_log_softmax_then_topk(width, k):
    gen = torch.Generator().manual_seed(width + k)
    logits = torch.randn(37, width, generator=gen) * 4
    logits[::3, PAD_ID] = 50.0  # PAD and BOS can be the largest and still never come out
    logits[1::3, BOS_ID] = 50.0
    want_v, want_i = row_topk(_log_probs(logits.clone()), k)
    got_v, got_i = native.vocab_topk(logits, k, (PAD_ID, BOS_ID))
    assert got_v.shape == got_i.shape == (37, k) and got_i.dtype == torch.int64
    assert torch.equal(got_i, want_i)
    torch.testing.assert_close(got_v, want_v, rtol=2e-6, atol=2e-6)


@needs_kernels
def test_vocab_topk_reads_bf16_logits_and_keeps_all_but_the_skipped():
    gen = torch.Generator().manual_seed(3)
    logits = (torch.randn(9, 20, generator=gen) * 3).bfloat16()
    got_v, got_i = native.vocab_topk(logits, 18, (PAD_ID, BOS_ID))
    want_v = _log_probs(logits)
    assert not ({PAD_ID, BOS_ID} & set(got_i.flatten().tolist()))
    assert (got_v[:, :-1] >= got_v[:, 1:]).all()
    torch.testing.assert_close(got_v, want_v.gather(1, got_i), rtol=2e-6, atol=2e-6)


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_the_loss_rows_equal_the_torch_softmax_part(dtype, smoothing):
    """The fused loss's softmax part in C: the summed cross-entropy, the gradient of the
    logits in the products' dtype, and the bias gradient added to what it held."""
    from seq2seq.model.loss import _torch_softmax_part

    gen = torch.Generator().manual_seed(5)
    logits = (4 * torch.randn(37, 803, generator=gen)).to(dtype)
    target = torch.randint(0, 803, (37,), generator=gen)
    start = torch.randn(803, generator=gen)
    want_b, got_b = start.clone(), start.clone()
    want_loss, want_g = _torch_softmax_part(logits, target, smoothing, dtype, want_b)
    got_loss, got_g = native.cross_entropy_rows(logits, target, smoothing, dtype, got_b)
    assert got_g.dtype == dtype and got_g.shape == logits.shape
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-6, atol=1e-4)
    tol = 1e-6 if dtype == torch.float32 else 8e-3  # bf16: one rounding step apart at most
    torch.testing.assert_close(got_g.float(), want_g.float(), rtol=tol, atol=tol / 100)
    torch.testing.assert_close(got_b, want_b, rtol=1e-5, atol=1e-5)
    loss_only, none = native.cross_entropy_rows(logits, target, smoothing, None)
    assert none is None and float(loss_only) == float(got_loss)
    # written over the logits themselves (the fused loss does so): the same, to the bit
    over, over_b = logits.clone(), start.clone()
    over_loss, over_g = native.cross_entropy_rows(over, target, smoothing, dtype, over_b, over)
    assert over_g.data_ptr() == over.data_ptr() and torch.equal(over_g, got_g)
    assert float(over_loss) == float(got_loss) and torch.equal(over_b, got_b)


def test_the_loss_rows_refuse_targets_outside_the_vocabulary():
    logits = torch.randn(2, 5)
    assert native.cross_entropy_rows(logits, torch.tensor([1, 5]), 0.0, torch.float32) is None


@needs_kernels
def test_linear_cross_entropy_through_the_kernel_equals_torchs(monkeypatch):
    """The whole fused loss with the kernel forced on against the torch path forced on:
    loss and the gradients of x, W and b."""
    from seq2seq.model.loss import CHUNK_ROWS, linear_cross_entropy

    gen = torch.Generator().manual_seed(6)
    x = torch.randn(CHUNK_ROWS + 44, 32, generator=gen)  # two chunks, the second partial
    w, b = torch.randn(700, 32, generator=gen) / 4, torch.randn(700, generator=gen)
    target = torch.randint(0, 700, (x.size(0),), generator=gen)
    results, calls = [], []
    kernel = native.cross_entropy_rows
    # each chunk's gradient is written over its logits (the sixth argument is the first),
    # and every chunk's logits lie in one block (the same first address)
    monkeypatch.setattr(native, "cross_entropy_rows",
                        lambda *a: calls.append((a[5] is not None and a[5].data_ptr() == a[0].data_ptr(),
                                                 a[0].data_ptr())) or kernel(*a))
    for faster in (True, False):
        monkeypatch.setattr(native, "_chosen",
                            {"cross_entropy_rows/torch.float32 on 1 thread": (faster, "a timing")})
        inputs = [t.clone().requires_grad_() for t in (x, w, b)]
        loss = linear_cross_entropy(*inputs, target, label_smoothing=0.1)
        results.append((loss.detach(), torch.autograd.grad(loss, inputs)))
        assert [over for over, _ in calls] == [True, True]  # two chunks, then none
        assert len({start for _, start in calls}) == 1
    (got, got_grads), (want, want_grads) = results
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-3)
    for g, w_ in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w_, rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def trained():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = build_model(ModelConfig(emb_size=32, hidden_size=64, dropout=0.1,
                                    attention=AttentionConfig(name="bahdanau")), 12, 12)
    src, lens, tgt_in, tgt_out = reverse_task(vocab=12)
    fit(model, src, lens, tgt_in, tgt_out, steps=80)
    return model, src[:12], lens[:12]


@needs_kernels
@pytest.mark.parametrize("beam,nbest", [(1, 1), (5, 3)])
def test_search_with_the_kernels_equals_search_without(trained, beam, nbest):
    model, src, lens = trained
    with native.disabled():
        want = beam_search(model, src, lens, beam=beam, nbest=nbest)
        want_greedy = greedy(model, src, lens)
    got = beam_search(model, src, lens, beam=beam, nbest=nbest)
    assert [[h.tokens for h in hs] for hs in got] == [[h.tokens for h in hs] for hs in want]
    for g_hyps, w_hyps in zip(got, want, strict=True):
        for g, w in zip(g_hyps, w_hyps, strict=True):
            assert g.score == pytest.approx(w.score, abs=1e-5)
            torch.testing.assert_close(g.attention, w.attention, rtol=1e-5, atol=1e-5)
    assert [h.tokens for h in greedy(model, src, lens)] == [h.tokens for h in want_greedy]


@needs_kernels
@pytest.mark.parametrize("queries", [0, 4])
def test_score_gradients_through_the_kernels_equal_torchs(queries):
    """The C backward recomputes the sigmoid; masked positions (zero upstream gradient)
    are skipped."""
    from seq2seq.model.scorers import _NativeScores

    gen = torch.Generator().manual_seed(4)
    b, s, a = 6, 11, 40
    q2 = (torch.randn((b, a) if queries == 0 else (b, queries, a), generator=gen) * 2)
    keys, v = torch.randn(b, s, a, generator=gen), torch.randn(1, a, generator=gen)
    up = torch.randn(q2.shape[:-1] + (s,), generator=gen)
    up[..., -3:] = 0.0
    inputs = [t.requires_grad_() for t in (q2, keys, v)]
    got = torch.autograd.grad(_NativeScores.apply(*inputs), inputs, up)
    wide = [t.detach().double().requires_grad_() for t in inputs]
    want = torch.autograd.grad(additive_scores(*wide), wide, up.double())
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == torch.float32
        torch.testing.assert_close(g.double(), w, rtol=1e-5, atol=1e-5 * float(w.abs().max()))


@needs_kernels
@pytest.mark.parametrize("faster", [False, True])
def test_training_takes_the_kernels_only_where_timed_faster(trained, monkeypatch, faster):
    """With gradients on, the scorer runs the kernels (forward and backward) where they
    were timed faster, else torch's differentiable ops; the gradients agree."""
    from seq2seq.model import scorers

    scorer = trained[0].decoder.attention.scorer
    query, keys = torch.randn(3, 64), torch.randn(3, 5, scorer.v.in_features)
    keys.requires_grad_()
    monkeypatch.setattr(native, "_chosen",
                        {"additive_scores with gradients on 1 thread": (faster, "a timing")})
    calls = []
    kernel = scorers._NativeScores.apply
    monkeypatch.setattr(scorers._NativeScores, "apply",
                        staticmethod(lambda *a: calls.append(1) or kernel(*a)))
    scores = scorer(query, keys)
    assert len(calls) == int(faster) and scores.requires_grad
    got = torch.autograd.grad(scores.sum(), (keys, scorer.v.weight))
    with native.disabled():
        want = torch.autograd.grad(scorer(query, keys).sum(), (keys, scorer.v.weight))
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


@needs_kernels
@pytest.mark.parametrize("faster", [False, True])
def test_best_tokens_takes_the_kernel_only_where_timed_faster(monkeypatch, faster):
    logits = torch.randn(4, 50)
    monkeypatch.setattr(native, "_chosen",
                        {f"vocab_topk/{logits.dtype} on 1 thread": (faster, "a timing")})
    calls = []
    kernel = native.vocab_topk
    monkeypatch.setattr(native, "vocab_topk", lambda *a: calls.append(a) or kernel(*a))
    got = best_tokens(logits.clone(), 3)
    assert len(calls) == int(faster)
    want = row_topk(_log_probs(logits.clone()), 3)
    assert torch.equal(got[1], want[1])
    torch.testing.assert_close(got[0], want[0], rtol=2e-6, atol=2e-6)


@needs_kernels
def test_a_kernel_that_does_not_apply_is_not_timed_or_chosen():
    calls = []
    chosen = native.choose("trial/float64", lambda: (lambda: calls.append(1), lambda: None))
    assert chosen is False and not calls
    assert "trial/float64 on 1 thread: torch (the kernel does not apply)" in native.status()


@needs_kernels
def test_a_kernel_slower_than_torch_is_not_chosen():
    slow_kernel = native.choose("trial/slow kernel", lambda: (lambda: None,
                                                              lambda: sum(range(20000))))
    assert slow_kernel is False and "trial/slow kernel on 1 thread: torch" in native.status()


def _python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, **env}, cwd=ROOT, timeout=120)


DECODE = """
import torch
from seq2seq import native
from seq2seq.config import AttentionConfig, ModelConfig
from seq2seq.inference.search import beam_search
from seq2seq.model import build_model
torch.manual_seed(0)
m = build_model(ModelConfig(emb_size=8, hidden_size=8, attention=AttentionConfig(name="bahdanau")), 20, 20)
out = beam_search(m, torch.randint(3, 20, (2, 5)), torch.tensor([5, 4]), beam=3)
print(native.available(), len(out), "|", native.status())
"""


def test_a_failed_build_falls_back_to_torch_with_one_line(tmp_path):
    done = _python(DECODE, {"CC": "/bin/false", "SEQ2SEQ_CACHE": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("False 2 |") and "the C build failed" in done.stdout
    assert "Traceback" not in done.stderr
    assert done.stderr.count("seq2seq's native kernels") == 1


def test_switched_off_by_the_environment(tmp_path):
    done = _python(DECODE, {"SEQ2SEQ_NATIVE": "0", "SEQ2SEQ_CACHE": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("False 2 |") and "SEQ2SEQ_NATIVE=0" in done.stdout
    assert not list(tmp_path.iterdir()) and not done.stderr


@needs_kernels
def test_the_build_is_cached_per_cpu_and_source(tmp_path):
    first = _python(DECODE, {"SEQ2SEQ_CACHE": str(tmp_path)})
    assert first.returncode == 0 and first.stdout.startswith("True 2 |"), first.stderr
    [lib] = (tmp_path / "native").glob("kernels-*.so")
    stamp = lib.stat().st_mtime_ns
    second = _python(DECODE, {"SEQ2SEQ_CACHE": str(tmp_path)})
    assert second.returncode == 0 and second.stdout.startswith("True 2 |")
    assert [lib] == list((tmp_path / "native").glob("kernels-*.so"))
    assert lib.stat().st_mtime_ns == stamp  # loaded, not built again


def test_the_build_flags_follow_torchs_kernel_level():
    assert "-mprefer-vector-width=512" in build.flags("AVX512")
    assert "-mno-avx512f" not in build.flags("AVX512")
    assert {"-mno-avx512f", "-mprefer-vector-width=256"} <= set(build.flags("AVX2"))
    assert {"-mno-avx512f", "-mno-avx2"} <= set(build.flags("DEFAULT"))


@needs_kernels
@pytest.mark.skipif(torch.backends.cpu.get_cpu_capability() != "AVX512",
                    reason="needs a CPU on which torch runs AVX-512 kernels")
def test_an_avx2_capped_process_builds_kernels_without_avx512(tmp_path):
    """ATEN_CPU_CAPABILITY=avx2 stands in for an AVX2-only CPU: our kernels must be capped
    too (a library of their own, no 512-bit registers), and still agree with torch."""
    import shutil

    capped = _python(DECODE, {"SEQ2SEQ_CACHE": str(tmp_path), "ATEN_CPU_CAPABILITY": "avx2"})
    assert capped.returncode == 0 and capped.stdout.startswith("True 2 |"), capped.stderr
    full = _python(DECODE, {"SEQ2SEQ_CACHE": str(tmp_path)})
    assert full.returncode == 0 and full.stdout.startswith("True 2 |"), full.stderr
    libs = sorted((tmp_path / "native").glob("kernels-*.so"), key=lambda p: p.stat().st_mtime_ns)
    assert len(libs) == 2  # built first under the cap, then for the full kernel level
    if shutil.which("objdump"):
        code = [subprocess.run(["objdump", "-d", str(lib)], capture_output=True, text=True,
                               timeout=60).stdout for lib in libs]
        assert "zmm" not in code[0] and "zmm" in code[1]


@needs_kernels
def test_a_training_run_logs_the_kernels_choices_once(tiny_train_overrides, tmp_path):
    """Which path ran is a timing's choice, so train.log records it (after the first
    validation, when training, the dev loss and dev decoding have all chosen)."""
    from test_train import train

    run_dir = train(tiny_train_overrides, f"run_dir={tmp_path / 'run'}", "train.max_steps=10",
                    "model/attention=bahdanau", "train.precision=fp32")
    lines = [ln for ln in (run_dir / "train.log").read_text().splitlines()
             if "native kernels: " in ln]
    assert len(lines) == 1, lines
    assert "on (" in lines[0] and "additive_scores with gradients on 1 thread" in lines[0]
    assert "vocab_topk/torch.float32 on 1 thread" in lines[0]


@needs_kernels
def test_an_unwritable_cache_builds_for_the_process_only(tmp_path):
    """A cache path that cannot be a folder (here a file; a read-only home alike): the
    kernels are built in a temporary folder instead, which goes once they are loaded."""
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    done = _python(DECODE, {"SEQ2SEQ_CACHE": str(blocker)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("True 2 |") and "seq2seq-native-" in done.stdout
    assert not done.stderr
    folder = Path(done.stdout.split("on (", 1)[1].split(", ", 1)[1].split(")")[0]).parent
    assert folder.name.startswith("seq2seq-native-") and not folder.exists()


@needs_kernels
def test_a_choice_with_a_margin_needs_the_kernel_that_much_faster(monkeypatch):
    """The kernel path here takes half the torch path's time: chosen at margin 1.5, not
    at margin 3; the status line names the margin."""
    import time

    monkeypatch.setattr(native, "_chosen", {})

    def trial():
        return (lambda: time.sleep(0.004) or 1), (lambda: time.sleep(0.002) or 1)
    assert native.choose("half", trial, margin=1.5)
    assert not native.choose("half again", trial, margin=3.0)
    assert "needs x3.00" in native._chosen["half again on 1 thread"][1]
