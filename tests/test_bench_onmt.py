"""scripts/bench_onmt.py: OpenNMT-py's config, batch sizing, log parsing and data export, and
benchmark.py's --onmt-arms hook.

The OpenNMT-py run itself needs `make onmt-env`; its test is slow and skipped without it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

import bench_onmt  # noqa: E402
import benchmark  # noqa: E402

from seq2seq.errors import ConfigError  # noqa: E402

# Report lines of a real `onmt_train` (OpenNMT-py 3.5.1, torch 2.13.0, the Bible pairs), with
# the lines around them.
TRAIN_LOG = """\
[2026-12-01 23:15:00,913 INFO] encoder: 2360960
[2026-12-01 23:15:00,913 INFO] decoder: 4958272
[2026-12-01 23:15:00,913 INFO] * number of parameters: 7319232
[2026-12-01 23:15:00,915 INFO] Weighted corpora loaded so far:
\t\t\t* corpus_1: 1
[2026-12-01 23:15:32,021 INFO] Step  1/    3; acc: 0.0; ppl: 8250.8; xent: 9.0; lr: 0.00100; \
sents:     108; bsz: 2484/3212/108;  80/103 tok/s;     31 sec;
[2026-12-01 23:15:48,449 INFO] Step  2/    3; acc: 0.1; ppl: 7575.8; xent: 8.9; lr: 0.00100; \
sents:      91; bsz: 1718/1612/91; 105/ 98 tok/s;     48 sec;
[2026-12-01 23:16:03,693 INFO] Step  3/    3; acc: 0.8; ppl: 6012.8; xent: 8.7; lr: 0.00100; \
sents:      57; bsz: 1768/2415/57; 116/158 tok/s;     63 sec;
[2026-12-01 23:07:25,420 INFO] Step  4/    6; acc: 3.7; ppl: 4787.6; xent: 8.5; lr: 0.00100; \
sents:      52; bsz:  749/ 782/26; 1762/1840 tok/s;     45 sec;
[2026-12-01 23:16:03,704 INFO] Saving checkpoint /tmp/onmt_bench/onmt_bahdanau/model_step_3.pt
PEAK_RSS_KB 1479632
"""


def test_train_log_is_parsed():
    parsed = bench_onmt.parse_train_log(TRAIN_LOG)
    assert parsed["params"] == 7319232
    assert [w["step"] for w in parsed["windows"]] == [1, 2, 3, 4]
    assert [w["tgt_tok_per_s"] for w in parsed["windows"]] == [103, 98, 158, 1840]
    assert parsed["windows"][3]["src_tok_per_s"] == 1762
    assert parsed["windows"][1]["tgt_tokens"] == 1612 and parsed["windows"][1]["sentences"] == 91
    assert bench_onmt.peak_rss_mib(TRAIN_LOG) == pytest.approx(1479632 / 1024)


def test_onmt_config_matches_our_sizes(tmp_path):
    files = {"prefix": str(tmp_path), "train_pairs": "25348"}
    cfg = bench_onmt.onmt_config("bahdanau", files, tmp_path / "m", 3481, 120, 20)
    assert cfg["encoder_type"] == "brnn" and cfg["decoder_type"] == "rnn" and cfg["rnn_type"] == "GRU"
    assert cfg["enc_layers"] == cfg["dec_layers"] == 1
    assert cfg["word_vec_size"] == cfg["hidden_size"] == 256 and cfg["dropout"] == [0.2]
    assert cfg["global_attention"] == "mlp" and cfg["input_feed"] == 1 and cfg["bridge"]
    assert bench_onmt.onmt_config("luong", files, tmp_path, 1, 1, 1)["global_attention"] == "general"
    assert cfg["optim"] == "adam" and cfg["learning_rate"] == 0.001
    assert cfg["decay_method"] == "none" and cfg["learning_rate_decay"] == 1.0  # constant
    assert cfg["max_grad_norm"] == 1.0 and cfg["label_smoothing"] == 0.0
    assert cfg["batch_type"] == "tokens" and cfg["batch_size"] == 3481
    assert cfg["normalization"] == "tokens" and cfg["accum_count"] == [1]
    assert cfg["bucket_size"] == 25348 and cfg["num_workers"] == 0  # one epoch per bucket, in-process
    assert cfg["train_steps"] == cfg["save_checkpoint_steps"] == 120 and cfg["report_every"] == 20
    assert cfg["data"]["corpus_1"]["transforms"] == []  # pre-tokenized with our models
    written = yaml.safe_load(bench_onmt.write_config(cfg, tmp_path / "c.yaml").read_text())
    assert "name" not in written  # ours, not an OpenNMT-py option
    assert written["src_vocab"] == f"{tmp_path}/vocab.src" and written["hidden_size"] == 256


def test_translate_args_greedy_is_argmax_and_beam_has_the_length_penalty(tmp_path):
    greedy = bench_onmt.translate_args(tmp_path / "m.pt", tmp_path / "s", tmp_path / "o", 1)
    assert greedy[greedy.index("-beam_size") + 1] == "1"
    assert greedy[greedy.index("-random_sampling_topk") + 1] == "1"  # its default 0 samples
    beam = bench_onmt.translate_args(tmp_path / "m.pt", tmp_path / "s", tmp_path / "o", 5)
    assert beam[beam.index("-length_penalty") + 1] == "wu" and beam[beam.index("-alpha") + 1] == "0.6"
    assert beam[beam.index("-batch_type") + 1] == "tokens" and "-report_time" in beam


def test_onmt_batches_follow_its_batch_iter():
    # cost per pair = max(src, tgt + 2): 4, 4, 4, 6 once sorted
    src, tgt = np.array([4, 4, 6, 4]), np.array([2, 2, 1, 2])
    # 3 pairs of cost 4 reach 12: one batch; the 6 alone is the tail
    stats = bench_onmt.simulate_batches(src, tgt, 12)
    assert stats["batches_per_epoch"] == 2 and stats["sentences"] == 2.0
    assert stats["tgt_tokens"] == pytest.approx((3 * 3 + 2) / 2)  # target + EOS
    # 10: the third pair overflows (12 > 10) and opens the next batch, as does the 6 then
    assert bench_onmt.simulate_batches(src, tgt, 10)["batches_per_epoch"] == 3
    # a source already in the batch is skipped
    stats = bench_onmt.simulate_batches(src, tgt, 100, keys=["a", "a", "b", "c"])
    assert stats["batches_per_epoch"] == 1 and stats["sentences"] == 3.0
    matched = bench_onmt.match_batch_size(np.full(500, 19), np.full(500, 9), target_tokens=100)
    assert matched["tgt_tokens"] == pytest.approx(100)  # 10 pairs of 10 target tokens (+EOS)
    assert 190 <= matched["batch_size"] < 209  # rows of max(19, 9 + 2) positions


def test_export_writes_our_pieces_and_ids(tiny_corpus, tmp_path):
    import bench_ours

    cfg = bench_ours.bench_config(tiny_corpus, "bahdanau", 200, "fp32", 1)
    bench = bench_ours.load_bench_data(cfg, 5)
    files = bench_onmt.export_data(bench, tmp_path)
    tok, d = bench.tokenizers, bench.data
    src = (tmp_path / "train.src").read_text(encoding="utf-8").splitlines()
    tgt = (tmp_path / "train.tgt").read_text(encoding="utf-8").splitlines()
    assert len(src) == len(tgt) == len(d.train_idx) == int(files["train_pairs"])
    i = int(d.train_idx[0])
    assert src[0].split(" ") == [tok.src.id_to_piece(int(t)) for t in d.train.src(i)]
    vocab = (tmp_path / "vocab.tgt").read_text(encoding="utf-8").splitlines()
    # OpenNMT-py's <blank> takes id 0, so piece k is on line k - 1: every id stays ours
    assert len(vocab) == tok.tgt.vocab_size - 1 and vocab[0] == tok.tgt.id_to_piece(1)
    assert len((tmp_path / "test.src").read_text(encoding="utf-8").splitlines()) == 5
    line = " ".join(tok.tgt.id_to_piece(int(t)) for t in d.train.tgt(i))
    assert bench_onmt.detokenize(tok.tgt, [line]) == [tok.tgt.decode(d.train.tgt(i))]


def test_onmt_options_and_skip_without_its_environment(monkeypatch, tmp_path, capsys):
    assert benchmark.parse_args([]).onmt_arms == ""  # off unless asked
    with pytest.raises(ConfigError, match="no OpenNMT-py arm 'none'"):
        benchmark.parse_args(["--onmt-arms", "none"])
    monkeypatch.setattr(bench_onmt, "onmt_available", lambda: False)
    monkeypatch.setattr(benchmark, "ceiling", lambda args: {"fp32_flops_per_s": 1.0,
                                                            "bf16_flops_per_s": 1.0})
    monkeypatch.setattr(benchmark, "measure_ours", lambda args, rates: {})
    res = benchmark.main(["--no-joey", "--onmt-arms", "bahdanau", "--work", str(tmp_path)])
    assert "onmt" not in res
    assert "OpenNMT-py skipped: .venv-onmt is missing (run `make onmt-env`)" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.skipif(not bench_onmt.onmt_available(), reason="no .venv-onmt (make onmt-env)")
def test_onmt_runs_on_the_tiny_corpus(tiny_corpus, tmp_path):
    data = [arg for o in tiny_corpus for arg in ("--data", o)]
    res = benchmark.main(["--quick", "--arms", "bahdanau", "--no-joey", "--onmt-arms", "bahdanau",
                          "--batch-tokens", "200", "--matmul-size", "256", "--rounds", "2",
                          "--work", str(tmp_path), *data])
    onmt = res["onmt"]["arms"]["bahdanau"]
    assert onmt["train"]["tgt_tok_per_s"] > 0 and onmt["params"] > 0
    assert onmt["greedy"]["sent_per_s"] > 0 and onmt["beam5"]["sent_per_s"] > 0
    assert len(onmt["train"]["tgt_tok_per_s_rounds"]) == 2
    assert len(res["onmt"]["round_ratios"]["bahdanau"]) == 2
    assert res["onmt"]["ratios"]["bahdanau"]["train_tgt_tok_per_s"] > 0
