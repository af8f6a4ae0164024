"""seq2seq/runtime.py: glibc keeps freed memory for reuse (no page faults every step);
denormals are flushed in every thread."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

from seq2seq.runtime import ISA_CAPS, LIBRARY_SETTINGS

# a child process: glibc's default or the setting (argv[1]), then a small model (`model`)
MODEL = """
import resource, sys, torch
from seq2seq import runtime
if sys.argv[1] == "keep":
    assert runtime.keep_freed_memory()
torch.set_num_threads(1)
from seq2seq.config import AttentionConfig, ModelConfig
from seq2seq.model import build_model
torch.manual_seed(0)
model = build_model(ModelConfig(attention=AttentionConfig(name="{attention}"), emb_size=64,
                                hidden_size=64), 4000, {tgt_vocab})
"""

STEPS = MODEL.format(attention="luong", tgt_vocab=4000) + """
src, tgt = torch.randint(4, 4000, (64, 30)), torch.randint(4, 4000, (64, 30))
lens = torch.full((64,), 30)
def step():
    model(src, lens, tgt, targets=tgt).backward()
    model.zero_grad(set_to_none=True)
step(); step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(3):
    step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str, script: str = STEPS) -> int:
    # no C kernels: their first-use timings free large blocks during the warm-up steps,
    # which raises glibc's dynamic mmap threshold in the default mode too
    env = {**os.environ, "SEQ2SEQ_NATIVE": "0"}
    out = subprocess.run([sys.executable, "-c", script, mode], capture_output=True, text=True,
                         check=True, timeout=120, env=env)
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_training_steps_stop_faulting_pages_back_in():
    """Measured: ~24,000 page faults in three steps of a small Luong model by default,
    ~5,000 with the setting (the first-step warm-up is excluded)."""
    default, kept = _faults("default"), _faults("keep")
    assert kept * 2 < default, (kept, default)


DECODE = MODEL.format(attention="bahdanau", tgt_vocab=8000) + """
from seq2seq.inference.search import beam_search
model.eval()
src, lens = torch.randint(4, 4000, (64, 30)), torch.full((64,), 30)
def search():  # 12 steps of (320, 8000) logits: ~10 MB freed and allocated again per step
    beam_search(model, src, lens, beam=5, max_len_ratio=0.0, max_len_extra=12)
search()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
search()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_beam_search_does_not_fault_its_logits_back_in():
    """A 12-step beam search of 64 sentences faults fewer pages than its (320, 8000) fp32
    logits (2,500 pages) would at every step, with glibc's defaults and with the setting
    the decoding commands use (seq2seq.cli._decode_process). Until the log-probabilities
    were written in place over the logits (stop 44) each step freed two such buffers, which
    glibc's default trimmed and faulted back in: ~61,000 faults, 0-4,400 with the setting;
    now 0-7,501 either way over 20 runs, in steps of a buffer, varying from run to run
    (docs/performance.md#keeping-freed-memory)."""
    every_step = 12 * 320 * 8000 * 4 // 4096
    default, kept = _faults("default", DECODE), _faults("keep", DECODE)
    assert default < every_step and kept < every_step, (default, kept)


def test_the_decoding_commands_keep_freed_memory(monkeypatch):
    """seq2seq-translate, -evaluate and -serve set glibc's thresholds before decoding."""
    from seq2seq import cli, runtime

    calls = []
    monkeypatch.setattr(runtime, "keep_freed_memory", lambda: calls.append("malloc") or True)
    assert cli._decode_process({"x": 1}, lambda c: calls.append(c) or "done") == "done"
    assert calls == ["malloc", {"x": 1}]


FLUSH = """
import sentencepiece  # its wheel loads a second libgomp: the pool to restart is torch's
import torch
from seq2seq import runtime
torch.set_num_threads(2)
torch.mm(torch.randn(256, 256), torch.randn(256, 256))  # the worker threads exist now
print(runtime.denormals_flushed())
torch.set_flush_denormal(True)  # torch's own switch: this thread only
print(runtime.denormals_flushed())
print(runtime.flush_denormals())
print(runtime.denormals_flushed())
torch.set_num_threads(1)
torch.set_num_threads(2)
print(runtime.denormals_flushed())
x = torch.full((1 << 20,), 1e-39, dtype=torch.float64) * 1e-270  # 1e-309: a float64 denormal
print(bool((x == 0).all()))
"""


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86's MXCSR flags")
def test_flush_denormals_reaches_every_worker_thread():
    """torch.set_flush_denormal alone leaves MKL's/OpenMP's other thread computing on
    denormals (half of a matmul's rows stayed denormal here); runtime.flush_denormals
    restarts the pool so every thread flushes, and stays so when the pool regrows."""
    out = subprocess.run([sys.executable, "-c", FLUSH], capture_output=True, text=True,
                         check=True, timeout=120).stdout.split()
    assert out == ["False", "False", "True", "True", "True", "True"], out


DESCRIBE = """
import json
from seq2seq.runtime import cpu_description
print(json.dumps(cpu_description()))
"""


def _describe(extra_env: dict[str, str]) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ISA_CAPS + LIBRARY_SETTINGS}
    out = subprocess.run([sys.executable, "-c", DESCRIBE], env={**env, **extra_env},
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def test_cpu_description_records_instruction_set_caps_and_the_kernels_in_use():
    # a benchmark run under caps stands in for a smaller CPU; its record must say so
    plain = _describe({})
    assert plain["isa_caps"] == {}
    assert plain["kernels"] != "DEFAULT"  # every CI machine has at least AVX2
    capped = _describe({"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "AVX2"})
    assert capped["isa_caps"] == {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    assert capped["kernels"] == "DEFAULT"
    assert capped["flags"] == plain["flags"]  # the CPU's own flags, caps or not


def test_cpu_description_records_library_settings_that_change_speed():
    # a run with a larger oneDNN kernel cache, or implicit bf16 for fp32, is not the default
    assert _describe({})["library_settings"] == {}
    tuned = _describe({"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "16384",
                       "ONEDNN_DEFAULT_FPMATH_MODE": "BF16"})
    assert tuned["library_settings"] == {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "16384",
                                         "ONEDNN_DEFAULT_FPMATH_MODE": "BF16"}
    assert tuned["isa_caps"] == {}
