"""scripts/benchmark.py: the ours-only path on the tiny corpus, JoeyNMT batch sizing and config.

The JoeyNMT run itself needs `make joeynmt-env`; its test is slow and skipped without it.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

import bench_flops  # noqa: E402
import bench_joey  # noqa: E402
import bench_kernels  # noqa: E402
import bench_ours  # noqa: E402
import bench_peers  # noqa: E402
import bench_probe  # noqa: E402
import benchmark  # noqa: E402

from seq2seq import precision  # noqa: E402
from seq2seq.errors import ConfigError  # noqa: E402


def test_ours_only_writes_sane_json(tiny_corpus, tmp_path):
    out = tmp_path / "bench.json"
    data = [arg for o in tiny_corpus for arg in ("--data", o)]
    benchmark.main(["--quick", "--no-joey", "--arms", "luong", "--batch-tokens", "200",
                    "--matmul-size", "256", "--rounds", "2", "--work", str(tmp_path),
                    "--with-denormals", "--json", str(out), *data])
    res = json.loads(out.read_text())
    assert set(res["ours"]) == {"luong", "luong-denormals"}
    for row in res["ours"].values():  # two rounds: the reported rate is their median
        train = row["train"]
        assert len(train["tgt_tok_per_s_rounds"]) == 2
        assert train["tgt_tok_per_s"] == pytest.approx(sum(train["tgt_tok_per_s_rounds"]) / 2)
    assert res["ours"]["luong"]["denormals_flushed"] is True  # as seq2seq-train runs
    assert res["ours"]["luong-denormals"]["denormals_flushed"] is False
    assert "greedy" not in res["ours"]["luong-denormals"]  # the variant times training only
    assert res["matmul"]["fp32_flops_per_s"] > 1e8
    for row in [res["ours"]["luong"]]:
        assert row["train"]["tgt_tok_per_s"] > 0
        assert len(row["train"]["tgt_tok_per_s_repeats"]) == 2
        assert 0 < row["batch"]["tgt_tokens"] <= 200 <= row["batch"]["tgt_positions"] * 3
        # at least the decoder GRU's gate matmuls, 3 x (256 x 256 + 256 x 256) multiply-adds
        # per token, forward and backward (x3): FlopCounterMode must see inside nn.GRU
        assert row["flops_per_tgt_token"] > 3 * 2 * 3 * (2 * 256 * 256)
        assert 0 < row["fraction_of_matmul"] < 1
        assert row["decode_sentences"] == 10
        assert row["greedy"]["sent_per_s"] > 0 and row["beam5"]["sent_per_s"] > 0
        assert row["peak_rss_mib"] > 50


def test_flop_count_has_all_three_products_of_the_fp32_loss():
    # the fp32 fused loss sums grad W with addmm_, which FlopCounterMode alone counts as 0:
    # the benchmark's fp32 rows must still count logits, grad x and grad W (2NHV each)
    from seq2seq.model.loss import CHUNK_ROWS, linear_cross_entropy

    n, h, v = CHUNK_ROWS + 37, 16, 50  # two chunks, the second one short
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, h, generator=gen, requires_grad=True)
    w = torch.randn(v, h, generator=gen, requires_grad=True)
    b = torch.zeros(v, requires_grad=True)
    target = torch.randint(0, v, (n,), generator=gen)
    with bench_flops.flop_counter() as counter:
        linear_cross_entropy(x, w, b, target).backward()
    assert counter.get_total_flops() == 3 * 2 * n * h * v
    z = torch.zeros(2, 4, 3)
    with bench_flops.flop_counter() as counter:  # the batched in-place product, the same gap
        z.baddbmm_(torch.ones(2, 4, 5), torch.ones(2, 5, 3))
    assert counter.get_total_flops() == 2 * 2 * 4 * 5 * 3


@pytest.mark.parametrize("how", ["repeat", "new"])
def test_probe_benchmark_reports_each_precision_and_the_choice(tiny_corpus, tmp_path, how):
    out = tmp_path / "probe.json"
    data = [arg for o in tiny_corpus for arg in ("--data", o)]
    bench_probe.main(["--arm", "bahdanau", "--how", how, "--threads", "1", "--batch-tokens", "200",
                      "--json", str(out), *data])
    rec = json.loads(out.read_text())
    assert set(rec["seconds"]) == set(precision.TRAIN_MODES)
    assert min(rec["seconds"].values()) > 0
    assert rec["chosen"] in precision.TRAIN_MODES and rec["how"] == how
    for mode, times in rec["rounds"].items():  # the median of the ratios within rounds
        ratios = [f / t for f, t in zip(rec["rounds"]["fp32"], times, strict=True)]
        assert rec["speedup_over_fp32"][mode] == pytest.approx(statistics.median(ratios))
    # more than PROBE_ROUNDS rounds only with the comparison that asked for them, and said so
    extended = len(rec["rounds"]["fp32"]) > precision.PROBE_ROUNDS
    assert bool(rec["more_rounds_for"]) == extended == bool(rec["more_rounds"])


def test_auto_precision_is_resolved_as_training_resolves_it(tiny_corpus, tmp_path):
    """--precision auto: each row says which precision it ran in and why, and the
    fraction of the matmul rate is taken against that precision's rate. --bf16-grid:
    bf16 rows whose products go on the grid."""
    from seq2seq.model import gemm
    from seq2seq.runtime import bf16_supported

    out = tmp_path / "bench.json"
    data = [arg for o in tiny_corpus for arg in ("--data", o)]
    benchmark.main(["--quick", "--no-joey", "--arms", "bahdanau", "--batch-tokens", "200",
                    "--matmul-size", "256", "--precision", "auto", "--bf16-grid", "--bf16-loss", "--work",
                    str(tmp_path), "--json", str(out), *data])
    res = json.loads(out.read_text())
    row = res["ours"]["bahdanau"]
    assert row["precision"].startswith(bench_ours.precision_of(row))  # auto may pick bf16_loss
    assert "auto" in row["precision"] or "no native bf16" in row["precision"]
    assert row["fraction_of_matmul"] == pytest.approx(
        row["achieved_flops_per_s"] / benchmark.ceiling_of(row, res["matmul"]))
    fp32 = res["ours"]["bahdanau+fp32"]  # the same run's fp32 speed, training only
    assert fp32["bf16"] is False and fp32["train"]["tgt_tok_per_s"] > 0 and "greedy" not in fp32
    assert "bf16_gemm" not in fp32 and ("bf16_gemm" in row) is row["bf16"]
    on_grid = res["ours"]["bahdanau+bf16grid"]
    assert on_grid["bf16"] is bf16_supported(torch.device("cpu")) and "greedy" not in on_grid
    if on_grid["bf16"]:
        assert on_grid["bf16_gemm"] == ("grid" if gemm.available() else "as_is")
        assert benchmark.precision_label(on_grid) == ("bf16+grid" if gemm.available() else "bf16")
    if row["bf16"]:  # auto chose bf16: its products as they are, the default
        assert row["bf16_gemm"] == "as_is" and benchmark.precision_label(row) == "bf16"
    loss_only = res["ours"]["bahdanau+bf16loss"]  # fp32 model, loss products in bf16
    assert loss_only["loss_bf16"] is bf16_supported(torch.device("cpu")) and not loss_only["bf16"]
    assert "greedy" not in loss_only and loss_only["train"]["tgt_tok_per_s"] > 0
    if loss_only["loss_bf16"]:
        assert benchmark.precision_label(loss_only) == "bf16loss"
        assert loss_only["precision"] == "bf16_loss (train.precision=bf16_loss)"


def test_mkl_rows_force_the_default_gemm_route(tiny_corpus, tmp_path):
    """--fp32-gemm grid --dnn-loss --mkl: the main rows' fp32 GEMMs went through oneDNN's
    grid, the +dnnloss rows' loss chunks through oneDNN and the +mkl rows' through MKL,
    each row's fraction against its own route's matmul rate."""
    from seq2seq.model import gemm

    out = tmp_path / "bench.json"
    data = [arg for o in tiny_corpus for arg in ("--data", o)]
    benchmark.main(["--quick", "--no-joey", "--arms", "luong", "--batch-tokens", "200",
                    "--matmul-size", "256", "--fp32-gemm", "grid", "--dnn-loss", "--mkl", "--work",
                    str(tmp_path), "--json", str(out), *data])
    res = json.loads(out.read_text())
    main, mkl = res["ours"]["luong"], res["ours"]["luong+mkl"]
    assert main["fp32_gemm"] == ("grid" if gemm.available() else "default")
    assert res["ours"]["luong+dnnloss"]["fp32_gemm"] == ("onednn" if gemm.available() else "default")
    assert mkl["fp32_gemm"] == "default" and "greedy" not in mkl
    from seq2seq import native
    if native.available():  # each timed choice of the C kernels, as the row's process made it
        assert " thread" in main["native"] and ("kernel (" in main["native"]
                                                or "torch (" in main["native"])
    assert mkl["fraction_of_matmul"] == pytest.approx(
        mkl["achieved_flops_per_s"] / res["matmul"]["fp32_flops_per_s"])
    if gemm.available():
        assert main["fraction_of_matmul"] == pytest.approx(
            main["achieved_flops_per_s"] / res["matmul"]["fp32_onednn_flops_per_s"])


def test_the_onednn_ceiling_is_timed_through_onednn(monkeypatch):
    """fp32_onednn_flops_per_s is measured with the oneDNN flag set, the others without."""
    from seq2seq.model import gemm

    if not gemm.available():
        pytest.skip("this torch has no oneDNN matmul route")
    flags = []

    def rate(n, dtype, sizes=None, device="cpu"):
        assert device == "cpu"
        flags.append((dtype, torch.backends.mkldnn.matmul.fp32_precision))
        if sizes is not None:  # as the real one records the size it used
            sizes[str(dtype).removeprefix("torch.")] = n
        return 1.0
    monkeypatch.setattr(benchmark.bench_ours, "matmul_rate", rate)
    before = torch.backends.mkldnn.matmul.fp32_precision
    rates = benchmark.ceiling(benchmark.parse_args(["--matmul-size", "64", "--threads", "1"]))
    assert set(rates) >= {"fp32_flops_per_s", "bf16_flops_per_s", "fp32_onednn_flops_per_s"}
    assert flags == [(torch.float32, before), (torch.bfloat16, before), (torch.float32, "bf16")]
    assert rates["sizes"] == {"float32": 64, "bfloat16": 64, "float32_onednn": 64}
    assert torch.backends.mkldnn.matmul.fp32_precision == before


def test_ceiling_of_follows_precision_and_route():
    rates = {"fp32_flops_per_s": 1.0, "bf16_flops_per_s": 2.0, "fp32_onednn_flops_per_s": 3.0}
    assert benchmark.ceiling_of({"bf16": True, "fp32_gemm": "onednn"}, rates) == 2.0
    assert benchmark.ceiling_of({"bf16": False, "fp32_gemm": "onednn"}, rates) == 3.0
    assert benchmark.ceiling_of({"bf16": False, "fp32_gemm": "grid"}, rates) == 3.0
    assert benchmark.ceiling_of({"bf16": False, "fp32_gemm": "default"}, rates) == 1.0
    assert benchmark.ceiling_of({"bf16": False}, {"fp32_flops_per_s": 1.0, "bf16_flops_per_s": 2.0}) == 1.0


def test_joey_batches_count_padding():
    src = np.array([9, 9, 9, 9, 19, 19])  # +1 EOS: 10 and 20 positions per row
    tgt = np.array([4, 4, 4, 4, 4, 4])
    stats = bench_joey.simulate_batches(src, tgt, batch_size=40)
    assert stats["padded_positions"] >= 40
    assert stats["tgt_tokens"] < stats["padded_positions"]  # real target tokens exclude padding
    assert 0 < stats["padding_fraction"] < 1
    matched = bench_joey.match_batch_size(np.full(500, 19), np.full(500, 9), target_tokens=100)
    assert matched["batch_size"] == 200  # rows of 20 positions holding 10 real target tokens
    assert matched["tgt_tokens"] == pytest.approx(100)


def test_bad_options_are_clear_errors():
    with pytest.raises(ConfigError, match="ARM=DIR"):
        benchmark.parse_args(["--ours-run", "attention=/nonexistent"])
    with pytest.raises(ConfigError, match="unknown arm 'bahdanu'"):
        benchmark.parse_args(["--arms", "none,bahdanu"])
    with pytest.raises(ConfigError, match="no 'none' attention"):
        benchmark.parse_args(["--joey-arms", "none"])
    assert benchmark.parse_args(["--quick", "--repeats", "3"]).repeats == 3  # explicit wins


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_a_gpu_asked_for_without_one_is_a_clear_error():
    with pytest.raises(ConfigError, match="--device cuda: no CUDA device"):
        benchmark.parse_args(["--device", "cuda"])


def test_the_cpu_only_comparisons_refuse_a_gpu():
    for extra in (["--minutes", "10"], ["--onmt-arms", "luong"]):
        with pytest.raises(ConfigError, match="run on the CPU only"):
            benchmark.parse_args(["--device", "cuda", *extra])


def test_a_model_profile_sets_our_sizes_and_its_batch(tmp_path):
    args = benchmark.parse_args(["--no-joey", "--model-profile", "paper", "--data", "model.dropout=0"])
    assert "model.hidden_size=1000" in args.data and "model.maxout=true" in args.data
    assert args.data[-1] == "model.dropout=0"  # the user's own overrides come last and win
    assert args.batch_tokens == 8000  # configs/profile/paper.yaml's train.batch_tokens
    cfg = bench_ours.bench_config(args.data, "bahdanau", args.batch_tokens, "fp32", 1,
                                  device="cuda")  # composing needs no GPU
    assert (cfg.model.emb_size, cfg.model.hidden_size, cfg.model.dropout) == (620, 1000, 0)
    assert cfg.train.device == "cuda" and cfg.train.batch_tokens == 8000
    explicit = benchmark.parse_args(["--no-joey", "--model-profile", "paper", "--batch-tokens", "500"])
    assert explicit.batch_tokens == 500
    assert benchmark.parse_args(["--no-joey"]).batch_tokens == 3000
    with pytest.raises(ConfigError, match="'papr'.*use one of long, paper, quick"):
        benchmark.parse_args(["--model-profile", "papr"])
    # a profile built on another (long.yaml's defaults: [quick]) has that one's sizes
    quick = benchmark.parse_args(["--no-joey", "--model-profile", "quick"])
    long = benchmark.parse_args(["--no-joey", "--model-profile", "long"])
    assert "model.dropout=0.2" in quick.data and "model.hidden_size=256" in quick.data
    assert (long.data, long.batch_tokens) == (quick.data, quick.batch_tokens) == (quick.data, 3000)


def test_joey_on_a_gpu_and_from_another_python(tmp_path, monkeypatch):
    files = {"prefix": str(tmp_path), "src_model": "s.model", "tgt_model": "t.model"}
    assert bench_joey.joey_config("luong", files, ("es", "en"), tmp_path, 600, 20, 10)["use_cuda"] is False
    cfg = bench_joey.joey_config("luong", files, ("es", "en"), tmp_path, 600, 20, 10, use_cuda=True)
    assert cfg["use_cuda"] is True and cfg["fp16"] is False
    import importlib

    monkeypatch.setenv(bench_joey.JOEY_PYTHON_ENV, sys.executable)
    try:
        assert importlib.reload(bench_joey).joey_command(["train"])[0] == sys.executable
    finally:
        monkeypatch.delenv(bench_joey.JOEY_PYTHON_ENV)
        importlib.reload(bench_joey)
    assert bench_joey.JOEY_PYTHON.parts[-3:] == (".venv-joey", "bin", "python")


def test_joey_config_matches_our_sizes(tmp_path):
    files = {"prefix": str(tmp_path), "src_model": "s.model", "tgt_model": "t.model"}
    cfg = bench_joey.joey_config("luong", files, ("es", "en"), tmp_path / "m", 6000, 120, 20)
    enc, dec = cfg["model"]["encoder"], cfg["model"]["decoder"]
    assert enc["rnn_type"] == dec["rnn_type"] == "gru" and enc["bidirectional"]
    assert enc["hidden_size"] == dec["hidden_size"] == enc["embeddings"]["embedding_dim"] == 256
    assert dec["attention"] == "luong" and dec["input_feeding"]
    assert cfg["training"]["scheduling"] == "exponential" and cfg["training"]["decrease_factor"] == 1.0
    assert cfg["training"]["validation_freq"] == cfg["training"]["updates"] == 120  # saves a checkpoint


def test_joey_embeddings_start_like_ours():
    """JoeyNMT's embeddings are drawn as ours are: normal with our embeddings' std."""
    import torch

    from seq2seq.config import ModelConfig
    from seq2seq.model import build_model

    torch.manual_seed(0)
    ours = build_model(ModelConfig(), 8000, 8000)
    files = {"prefix": "p", "src_model": "s.model", "tgt_model": "t.model"}
    model = bench_joey.joey_config("bahdanau", files, ("es", "en"), Path("m"), 6000, 120, 20)["model"]
    assert model["embed_initializer"] == "normal"
    for emb in (ours.encoder.embedding, ours.decoder.embedding):
        assert float(emb.weight[4:].std()) == pytest.approx(model["embed_init_weight"], rel=0.02)


@pytest.mark.slow
@pytest.mark.skipif(not bench_joey.joey_available(), reason="no .venv-joey (make joeynmt-env)")
def test_joey_runs_on_the_tiny_corpus(tiny_corpus, tmp_path):
    data = [arg for o in tiny_corpus for arg in ("--data", o)]
    res = benchmark.main(["--quick", "--arms", "bahdanau", "--joey-arms", "bahdanau",
                          "--batch-tokens", "200", "--matmul-size", "256", "--rounds", "2",
                          "--joey-flush-denormals", "--precision", "auto", "--work", str(tmp_path),
                          *data])
    joey = res["joey"]["arms"]["bahdanau"]
    assert joey["train"]["tgt_tok_per_s"] > 0 and joey["beam5"]["sent_per_s"] > 0
    assert len(joey["train"]["tgt_tok_per_s_rounds"]) == 2 and len(res["round_ratios"]["bahdanau"]) == 2
    assert len(joey["train_ftz"]["tgt_tok_per_s_rounds"]) == 2  # checked flushed in every thread
    assert len(res["round_ratios"]["bahdanau+ftz"]) == 2
    assert res["ratios"]["bahdanau"]["train_tgt_tok_per_s"] > 0
    assert res["ratios"]["bahdanau"]["train_tgt_tok_per_s_vs_ftz"] > 0
    # --precision auto also times fp32 in every round, against the same JoeyNMT rounds
    fp32 = res["ours"]["bahdanau+fp32"]["train"]["tgt_tok_per_s_rounds"]
    assert res["round_ratios"]["bahdanau+fp32"] == pytest.approx(
        [o / j for o, j in zip(fp32, joey["train"]["tgt_tok_per_s_rounds"], strict=True)])
    assert res["ratios"]["bahdanau"]["train_tgt_tok_per_s+fp32"] > 0


def test_joey_warmup_covers_our_warmup_batches():
    def windows(*argv: str) -> int:
        return bench_peers.joey_warmup_windows(benchmark.parse_args(list(argv)))

    assert windows("--warmup", "100", "--per-repeat", "10") == 10
    assert windows("--warmup", "25", "--per-repeat", "10") == 3  # whole windows, rounded up
    assert windows("--warmup", "3", "--per-repeat", "10") == 1
    assert windows("--warmup", "0", "--per-repeat", "10") == 1  # its first window is never timed


def test_kernel_benchmark_writes_its_record(tmp_path, capsys):
    out = tmp_path / "kernels.json"
    bench_kernels.main(["--rows", "6", "--src-len", "5", "--attn-size", "16", "--vocab", "1000",
                        "--k", "4", "--repeats", "3", "--json", str(out)])
    res = json.loads(out.read_text())
    assert set(res["pointwise_ms"]) == {"tanh_fp32", "sigmoid_fp32", "tanh_bf16", "sigmoid_bf16"}
    assert set(res["selection_ms"]) == {"torch_topk", "row_topk"}
    assert all(v > 0 for part in ("pointwise_ms", "selection_ms") for v in res[part].values())
    assert res["cpu"]["model"] and "row_topk" in capsys.readouterr().out


def test_kernel_benchmark_times_the_encoder_directions_and_restores_threads(tmp_path, capsys):
    out, before = tmp_path / "kernels.json", torch.get_num_threads()
    bench_kernels.main(["--rows", "6", "--src-len", "5", "--attn-size", "16", "--vocab", "1000",
                        "--k", "4", "--repeats", "3", "--encoder", "--batch", "4",
                        "--threads", "2", "--json", str(out)])
    enc = json.loads(out.read_text())["encoder_ms"]
    assert set(enc) == {"in_turn", "side_by_side"} and all(v > 0 for v in enc.values())
    assert torch.get_num_threads() == 2 and "side by side" in capsys.readouterr().out
    torch.set_num_threads(before)


def test_a_slow_matmul_is_measured_at_a_size_that_fits_the_budget(monkeypatch):
    """An emulated bf16 (seconds per 2048-sized product) must not hold the benchmark for
    minutes: the size shrinks until the repeats fit the budget."""
    sizes = []
    real_mm = torch.mm

    def counted_mm(a, b):
        sizes.append(a.size(0))
        return real_mm(a, b)
    monkeypatch.setattr(benchmark.bench_ours.torch, "mm", counted_mm)
    monkeypatch.setattr(benchmark.bench_ours, "_seconds_of_mm", lambda n, dtype, device="cpu": 0.05)
    used: dict[str, int] = {}
    benchmark.bench_ours.matmul_rate(2048, torch.float32, repeats=2, budget_s=1.0, sizes=used)
    # 0.05 s at 256 predicts 3 x 0.05 x 8^3 = 77 s at 2048; 256 is the largest that fits 1 s
    assert set(sizes) == {256} and used == {"float32": 256}
    sizes.clear()
    monkeypatch.setattr(benchmark.bench_ours, "_seconds_of_mm", lambda n, dtype, device="cpu": 1e-4)
    benchmark.bench_ours.matmul_rate(1024, torch.float32, repeats=2, budget_s=1.0)
    assert set(sizes) == {1024}
    # a GPU's small product is launch-bound: its size is not cut (nothing runs on a GPU here)
    monkeypatch.setattr(benchmark.bench_ours, "_seconds_of_mm", lambda n, dtype, device="cpu": 0.05)
    monkeypatch.setattr(benchmark.bench_ours, "_best_seconds",
                        lambda n, dtype, repeats, device="cpu": 1.0)
    used.clear()
    rate = benchmark.bench_ours.matmul_rate(2048, torch.float32, repeats=2, budget_s=1.0,
                                            sizes=used, device="cuda")
    assert used == {"float32": 2048} and rate == 2.0 * 2048 ** 3


def test_one_slow_call_does_not_shrink_the_matmul_size(monkeypatch):
    """The size check takes the fastest of its small products, so one slow call (a hiccup
    of the machine) leaves a fast product at its full size."""
    calls = iter([5.0, 5.0, 1e-4, 1e-4] + [0.01] * 10)  # the warm-up, the hiccup, two fast
    monkeypatch.setattr(benchmark.bench_ours.precision, "timed", lambda fn, dev: next(calls))
    used: dict[str, int] = {}
    benchmark.bench_ours.matmul_rate(2048, torch.float32, repeats=2, budget_s=1.0, sizes=used)
    assert used == {"float32": 2048}
    assert benchmark.bench_ours._seconds_of_mm(64, torch.float32) == 0.01


def test_the_rates_line_names_each_shrunk_size():
    args = benchmark.parse_args(["--arms", "bahdanau"])
    rates = {"fp32_flops_per_s": 275e9, "bf16_flops_per_s": 1.8e12,
             "sizes": {"float32": 1024, "bfloat16": args.matmul_size}}
    line = benchmark.rates_line(args, rates)
    assert "fp32 275.0 GFLOP/s (at 1024^3: slow here)" in line
    assert line.count("slow here") == 1
    rates["sizes"] = {"float32": args.matmul_size, "bfloat16": args.matmul_size}
    assert "slow here" not in benchmark.rates_line(args, rates)
    rates["fp32_onednn_flops_per_s"] = 900e9
    rates["sizes"]["float32_onednn"] = 512
    assert "(through oneDNN 900.0 (at 512^3: slow here))" in benchmark.rates_line(args, rates)


def test_kernel_benchmark_times_new_shapes_against_a_warm_one(tmp_path, capsys):
    out = tmp_path / "kernels.json"
    bench_kernels.main(["--rows", "6", "--src-len", "5", "--attn-size", "16", "--vocab", "1000",
                        "--k", "4", "--repeats", "3", "--new-shapes", "3", "--batch", "5",
                        "--step-size", "32", "--json", str(out)])
    new = json.loads(out.read_text())["new_shapes_ms"]
    assert set(new) == {"warm_fp32", "cold_fp32", "warm_bf16", "cold_bf16"}
    assert all(v > 0 for v in new.values())
    assert "with a new row count each" in capsys.readouterr().out
