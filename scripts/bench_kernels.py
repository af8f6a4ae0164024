"""The pointwise and selection kernels behind two decoding/training choices, on this CPU.

    .venv/bin/python scripts/bench_kernels.py [--threads 1] [--json out.json]

- ``tanh`` against ``sigmoid`` on a (rows, source length, attention size) tensor: the
  additive attention computes vᵀ tanh(z) as 2 vᵀ σ(2z) - Σv because torch's CPU tanh
  was several times slower (docs/performance.md#additive-attention-through-the-sigmoid).
- ``torch.topk`` against :func:`seq2seq.inference.vocab.row_topk` on (rows, vocabulary)
  log-probabilities: the beam search's per-row top 2k.
- With ``--encoder``: a bidirectional encoder layer's forward + backward as the encoder
  runs it (one direction after the other, each on all ``--threads``) against the two
  directions side by side in two Python threads, one torch thread each (issue 17 asked
  about the two cores; docs/performance.md#tried-and-dropped).
- With ``--new-shapes``: a decoder-step product ((rows, 3H) @ (3H, 3H), as
  ``nn.Linear``) in fp32 and bf16, warm (the same shape again) and cold (every product
  with a row count this process has not met), since the packed step loop meets new row
  counts every batch and oneDNN builds a bf16 kernel for each
  (docs/performance.md#machine-e-intel-with-amx-stop-42).

Each figure is the median of ``--repeats`` calls in this process, after one warm-up;
the CPU (model and flags) is printed with them. Run it with ``ATEN_CPU_CAPABILITY=avx2``
to time torch's AVX2 kernels on an AVX-512 CPU.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seq2seq.inference.vocab import row_topk
from seq2seq.precision import timed
from seq2seq.runtime import cpu_description

CPU = torch.device("cpu")


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    """Median wall time of ``fn`` in milliseconds, after one untimed call."""
    fn()
    times = sorted(timed(fn, CPU) for _ in range(repeats))
    return times[len(times) // 2] * 1e3


def pointwise(rows: int, src_len: int, size: int, repeats: int) -> dict[str, float]:
    """ms of tanh and sigmoid (out of place) in fp32 and bf16."""
    out = {}
    x = torch.randn(rows, src_len, size) * 3
    for name, t in (("fp32", x), ("bf16", x.bfloat16())):
        buf = torch.empty_like(t)
        out[f"tanh_{name}"] = median_ms(lambda t=t, buf=buf: torch.tanh(t, out=buf), repeats)
        out[f"sigmoid_{name}"] = median_ms(lambda t=t, buf=buf: torch.sigmoid(t, out=buf), repeats)
    return out


def selection(rows: int, vocab: int, k: int, repeats: int) -> dict[str, float]:
    """ms of torch.topk and row_topk over fp32 log-probabilities."""
    logp = torch.log_softmax(torch.randn(rows, vocab) * 3, dim=1)
    assert torch.equal(row_topk(logp, k)[0], logp.topk(k, dim=1)[0])
    return {"torch_topk": median_ms(lambda: logp.topk(k, dim=1), repeats),
            "row_topk": median_ms(lambda: row_topk(logp, k), repeats)}


def encoder_directions(batch: int, src_len: int, size: int, threads: int, repeats: int
                       ) -> dict[str, float]:
    """ms of one bidirectional GRU layer's forward + backward on (batch, src_len, size):
    directions one after the other on ``threads`` threads, and side by side on one each."""
    fwd, bwd = nn.GRU(size, size, batch_first=True), nn.GRU(size, size, batch_first=True)
    x = torch.randn(batch, src_len, size, requires_grad=True)
    x_rev = x.detach().flip(1).requires_grad_()

    def one(rnn: nn.GRU, inp: Tensor) -> None:
        out, _ = rnn(inp)
        torch.autograd.grad(out.square().sum(), [inp, *rnn.parameters()])

    def in_turn() -> None:
        one(fwd, x)
        one(bwd, x_rev)

    def side_by_side(pool: ThreadPoolExecutor) -> None:
        for job in [pool.submit(one, fwd, x), pool.submit(one, bwd, x_rev)]:
            job.result()

    torch.set_num_threads(threads)
    out = {"in_turn": median_ms(in_turn, repeats)}
    torch.set_num_threads(1)  # torch's thread count is process-wide: each worker gets one
    try:
        with ThreadPoolExecutor(2) as pool:
            out["side_by_side"] = median_ms(lambda: side_by_side(pool), repeats)
    finally:
        torch.set_num_threads(threads)
    return out


def new_shapes(rows: int, size: int, count: int, repeats: int) -> dict[str, float]:
    """ms of one (rows, size) @ (size, size) product, as ``F.linear`` runs it, in fp32 and
    bf16: ``warm_*`` the median of the same shape repeated, ``cold_*`` the mean over
    ``count`` products whose row counts (rows + 1, rows + 2, ...) this process has not met
    before; the difference is about what building a kernel for a new shape costs."""
    out = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        w = torch.randn(size, size, dtype=dtype)
        x = torch.randn(rows, size, dtype=dtype)
        out[f"warm_{name}"] = median_ms(lambda x=x, w=w: F.linear(x, w), repeats)
        xs = [torch.randn(rows + i, size, dtype=dtype) for i in range(1, count + 1)]
        seconds = timed(lambda xs=xs, w=w: [F.linear(x, w) for x in xs], CPU)
        out[f"cold_{name}"] = seconds / count * 1e3
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--rows", type=int, default=330, help="decoder rows (sentences x beam)")
    p.add_argument("--src-len", type=int, default=30)
    p.add_argument("--attn-size", type=int, default=256)
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--k", type=int, default=10, help="per-row top k (2 x beam)")
    p.add_argument("--encoder", action="store_true",
                   help="also time a bidirectional encoder layer's directions in turn and side by side")
    p.add_argument("--batch", type=int, default=96,
                   help="--encoder: sentences per batch; --new-shapes: the warm product's rows")
    p.add_argument("--new-shapes", type=int, default=0, metavar="N",
                   help="also time N products of new row counts against a warm one, fp32 and bf16")
    p.add_argument("--step-size", type=int, default=768,
                   help="--new-shapes: the product's inner and output size (3H of a GRU)")
    p.add_argument("--json", default="")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    record = {"cpu": cpu_description(), "torch": torch.__version__, "threads": args.threads,
              "kernels": torch.backends.cpu.get_cpu_capability(),
              "pointwise_ms": pointwise(args.rows, args.src_len, args.attn_size, args.repeats),
              "selection_ms": selection(args.rows, args.vocab, args.k, args.repeats)}
    pw, sel = record["pointwise_ms"], record["selection_ms"]
    print(f"CPU {record['cpu']['model']} {' '.join(record['cpu']['flags'])}; torch "
          f"{record['torch']} {record['kernels']} kernels, {args.threads} thread(s)")
    for dtype in ("fp32", "bf16"):
        print(f"{dtype}: tanh {pw[f'tanh_{dtype}']:.2f} ms, sigmoid {pw[f'sigmoid_{dtype}']:.2f} ms "
              f"(x{pw[f'tanh_{dtype}'] / pw[f'sigmoid_{dtype}']:.2f}) on "
              f"({args.rows}, {args.src_len}, {args.attn_size})")
    print(f"top {args.k} of ({args.rows}, {args.vocab}): torch.topk {sel['torch_topk']:.2f} ms, "
          f"row_topk {sel['row_topk']:.2f} ms (x{sel['torch_topk'] / sel['row_topk']:.2f})")
    if args.encoder:
        enc = record["encoder_ms"] = encoder_directions(args.batch, args.src_len, args.attn_size,
                                                        args.threads, args.repeats)
        print(f"bidirectional GRU layer fwd+bwd on ({args.batch}, {args.src_len}, {args.attn_size}): "
              f"in turn on {args.threads} thread(s) {enc['in_turn']:.1f} ms, side by side on one "
              f"thread each {enc['side_by_side']:.1f} ms (x{enc['in_turn'] / enc['side_by_side']:.2f})")
    if args.new_shapes:
        new = record["new_shapes_ms"] = new_shapes(args.batch, args.step_size, args.new_shapes,
                                                   args.repeats)
        for dtype in ("fp32", "bf16"):
            print(f"{dtype} ({args.batch}, {args.step_size}) @ ({args.step_size}, "
                  f"{args.step_size}): {new[f'warm_{dtype}']:.3f} ms warm, "
                  f"{new[f'cold_{dtype}']:.3f} ms with a new row count each")
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
