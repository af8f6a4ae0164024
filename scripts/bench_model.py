"""Model speed on synthetic batches: training target tokens/s per attention, decoding sentences/s.

    PYTHONPATH=. .venv/bin/python scripts/bench_model.py [--threads 2] [--repeats 5] [--json out.json]

Synthetic data (no corpus needed): batches of ~3000 target tokens, source and target
lengths uniform in 20-40, vocabulary 8000 per side, emb = hidden = 256, GRU,
bidirectional encoder, dropout 0.2. Times forward + cross-entropy + backward (no
optimizer step); the first batch of each arm is warm-up and excluded; the median
(and the minimum: other processes on a shared machine only ever add time) of the
repeats is reported. Lengths are not bucketed, so about a quarter of the target
positions are padding; --skip-padding times the training path instead
(``forward(targets=)``: finished rows leave the step loop, the fused loss skips padding). With --decode also greedy and beam-5 sentences/s (eval mode).
The real-corpus benchmark against JoeyNMT is scripts/benchmark.py (issue 6).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import torch.nn.functional as F

from seq2seq.config import AttentionConfig, ModelConfig
from seq2seq.constants import BOS_ID, EOS_ID, PAD_ID
from seq2seq.inference.search import beam_search, greedy
from seq2seq.model import build_model, count_parameters

ARMS = {
    "none": AttentionConfig(name="none"),
    "bahdanau": AttentionConfig(name="bahdanau"),
    "luong": AttentionConfig(name="luong", score="general", input_feeding=True),
    "luong-nofeed": AttentionConfig(name="luong", score="general", input_feeding=False),
}


def synthetic_batch(tokens: int, vocab: int, lo: int, hi: int, gen: torch.Generator
                    ) -> tuple[torch.Tensor, ...]:
    """Random sentences until ~``tokens`` target tokens: src (B,S), lens (B,), tgt_in/out (B,T)."""
    src_lens, tgt_lens = [], []
    while sum(tgt_lens) < tokens:
        src_lens.append(int(torch.randint(lo, hi + 1, (1,), generator=gen)))
        tgt_lens.append(int(torch.randint(lo, hi + 1, (1,), generator=gen)))
    b, s, t = len(src_lens), max(src_lens), max(tgt_lens) + 1
    src = torch.full((b, s), PAD_ID)
    tgt = torch.full((b, t + 1), PAD_ID)
    for i, (ls, lt) in enumerate(zip(src_lens, tgt_lens, strict=True)):
        src[i, :ls] = torch.randint(4, vocab, (ls,), generator=gen)
        tgt[i, 0] = BOS_ID
        tgt[i, 1:lt + 1] = torch.randint(4, vocab, (lt,), generator=gen)
        tgt[i, lt + 1] = EOS_ID
    return src, torch.tensor(src_lens), tgt[:, :-1], tgt[:, 1:]


def time_training(model: torch.nn.Module, batch: tuple[torch.Tensor, ...], repeats: int,
                  skip_padding: bool = False) -> list[float]:
    """Wall and process-CPU seconds per forward+backward, after one warm-up call.

    skip_padding: the training path, ``forward(targets=)``, which skips padded positions.
    CPU seconds stay honest on a busy machine (time spent waiting for a core is not
    counted); with one thread they estimate the wall time of an idle machine.
    """
    src, lens, tgt_in, tgt_out = batch
    mask = tgt_out != PAD_ID
    times, cpu = [], []
    for i in range(repeats + 1):
        start, start_cpu = time.perf_counter(), time.process_time()
        if skip_padding:
            loss = model(src, lens, tgt_in, targets=tgt_out) / int(mask.sum())
        else:
            logits = model(src, lens, tgt_in)
            loss = F.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(),
                                   ignore_index=PAD_ID)
        loss.backward()
        model.zero_grad(set_to_none=True)
        if i:
            times.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
    return times, cpu


def time_decoding(model: torch.nn.Module, batch: tuple[torch.Tensor, ...], sentences: int
                  ) -> dict[str, float]:
    src, lens = batch[0][:sentences], batch[1][:sentences]
    src = src[:, : int(lens.max())]
    out = {}
    model.eval()
    for name, fn in (("greedy", lambda: greedy(model, src, lens)),
                     ("beam5", lambda: beam_search(model, src, lens, beam=5))):
        fn()  # warm-up
        start = time.perf_counter()
        fn()
        out[f"{name}_sent_per_s"] = len(lens) / (time.perf_counter() - start)
    model.train()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=3000)
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--size", type=int, default=256, help="embedding and hidden size")
    parser.add_argument("--rnn", default="gru", choices=["gru", "lstm"])
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--decode", type=int, default=0, metavar="N",
                        help="also time greedy and beam-5 decoding of N sentences")
    parser.add_argument("--skip-padding", action="store_true",
                        help="time the training path, forward(targets=), which skips padding")
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    batch = synthetic_batch(args.tokens, args.vocab, 20, 40, gen)
    n_tgt = int((batch[3] != PAD_ID).sum())
    n_src = int(batch[1].sum())
    results = {"threads": args.threads, "target_tokens": n_tgt, "source_tokens": n_src,
               "target_positions": int(batch[3].numel()), "skip_padding": args.skip_padding,
               "load_average": os.getloadavg(),
               "batch_size": int(batch[0].size(0)), "torch": torch.__version__, "arms": {}}
    print(f"batch: {results['batch_size']} sentences, {n_tgt} target tokens in "
          f"{results['target_positions']} padded positions, {n_src} source tokens; "
          f"{args.threads} threads; load average {os.getloadavg()[0]:.2f}")
    print(f"{'arm':14s} {'params':>10s} {'s/batch':>8s} {'min s':>7s} {'cpu s':>7s} "
          f"{'tgt tok/s':>10s} "
          f"{'src tok/s':>10s}"
          + ("  greedy/s  beam5/s" if args.decode else ""))
    for arm in args.arms.split(","):
        torch.manual_seed(0)
        cfg = ModelConfig(rnn_type=args.rnn, emb_size=args.size, hidden_size=args.size,
                          attention=ARMS[arm])
        model = build_model(cfg, args.vocab, args.vocab).train()
        times, cpu = time_training(model, batch, args.repeats, args.skip_padding)
        sec = statistics.median(times)
        row = {"params": count_parameters(model), "sec_per_batch": sec, "times": times,
               "cpu_times": cpu, "cpu_sec_per_batch": statistics.median(cpu),
               "tgt_tok_per_s": n_tgt / sec, "src_tok_per_s": n_src / sec}
        line = (f"{arm:14s} {row['params']:10d} {sec:8.3f} {min(times):7.3f} "
                f"{row['cpu_sec_per_batch']:7.3f} {row['tgt_tok_per_s']:10.0f} "
                f"{row['src_tok_per_s']:10.0f}")
        if args.decode:
            row.update(time_decoding(model, batch, args.decode))
            line += f"  {row['greedy_sent_per_s']:8.1f} {row['beam5_sent_per_s']:8.1f}"
        results["arms"][arm] = row
        print(line, flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=2)


if __name__ == "__main__":
    main()
