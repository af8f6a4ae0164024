"""Load test of `seq2seq-serve` on loopback: N concurrent clients, M requests each.

    .venv/bin/python scripts/bench_serve.py --clients 8 --requests 25 \
        --serve reproduction=runs/reproduce_quick --sentences test.es --out bench_serve.json
    .venv/bin/python scripts/bench_serve.py --url http://127.0.0.1:8000/ ...   # a running server

With ``--serve`` it starts the server itself (``port=0``, plus the given overrides) and
stops it afterwards. Every client keeps one HTTP connection and sends its requests one
after another, each of ``--per-request`` sentences taken in turn from ``--sentences``
(one per line; default: a few verses of Genesis 1, RV1909), translated by every loaded
model. It reports p50/p95/max latency, requests/s and sentences/s (request sentences;
each is translated by every model), errors (any non-200 answer), and the server's
resident memory after a warm-up, after the run, and its peak (Linux /proc), so a leak or
unbounded queue shows. The standard library only: it measures the server, not a client.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

GENESIS = [
    "En el principio crió Dios los cielos y la tierra.",
    "Y la tierra estaba desordenada y vacía, y las tinieblas estaban sobre la haz del "
    "abismo, y el Espíritu de Dios se movía sobre la haz de las aguas.",
    "Y dijo Dios: Sea la luz: y fué la luz.",
    "Y vió Dios que la luz era buena: y apartó Dios la luz de las tinieblas.",
    "Y llamó Dios á la luz Día, y á las tinieblas llamó Noche: y fué la tarde y la mañana "
    "un día.",
]


def start_server(overrides: list[str]) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-c", "from seq2seq.cli import serve_main; serve_main()",
           "port=0", *overrides]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    match = re.search(r"on (http://\S+/)", line)
    if not match:
        proc.kill()
        sys.exit(f"the server did not start: {line!r}")
    return proc, match.group(1)


def memory_kib(pid: int) -> dict[str, int]:
    """VmRSS (now) and VmHWM (peak) of a process, in KiB; {} off Linux."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    return {k: int(v) for k, v in re.findall(r"^(VmRSS|VmHWM):\s+(\d+) kB", text, re.M)}


def client(url: str, bodies: list[bytes], latencies: list[float], errors: list[str]) -> None:
    parsed = urlparse(url)
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=300)
    for body in bodies:
        start = time.perf_counter()
        try:
            conn.request("POST", "/v1/translate", body, {"Content-Type": "application/json"})
            answer = conn.getresponse()
            payload = answer.read()
            if answer.status != 200:
                errors.append(f"{answer.status}: {payload[:200]!r}")
        except OSError as err:
            errors.append(repr(err))
            conn.close()
            conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=300)
        latencies.append(time.perf_counter() - start)
    conn.close()


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--requests", type=int, default=25, help="per client")
    p.add_argument("--per-request", type=int, default=1, help="sentences per request")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--sentences", default="", help="a file of source sentences, one a line")
    p.add_argument("--url", default="", help="a running server; else --serve starts one")
    p.add_argument("--serve", nargs="*", default=[], help="seq2seq-serve overrides")
    p.add_argument("--out", default="", help="also write the record as JSON here")
    args = p.parse_args()
    sources = (Path(args.sentences).read_text(encoding="utf-8").splitlines()
               if args.sentences else GENESIS)
    sources = [s for s in sources if s.strip()]
    proc, url = (None, args.url) if args.url else start_server(args.serve)
    try:
        pid = proc.pid if proc else 0
        n, k = args.clients * args.requests, args.per_request
        bodies = [json.dumps({"sentences": [sources[(i * k + j) % len(sources)] for j in range(k)],
                              "beam": args.beam}).encode() for i in range(n)]
        warm: list[float] = []
        client(url, bodies[:3], warm, [])  # first decodes allocate; not timed
        before = memory_kib(pid)
        latencies: list[float] = []
        errors: list[str] = []
        threads = [threading.Thread(target=client, args=(url, bodies[c::args.clients], latencies, errors))
                   for c in range(args.clients)]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - start
        after = memory_kib(pid)
    finally:
        if proc:
            proc.terminate()
            proc.wait(30)
    lat = sorted(latencies)
    q = statistics.quantiles(lat, n=100)
    record = {
        "clients": args.clients, "requests_per_client": args.requests, "sentences_per_request": k,
        "beam": args.beam, "requests": len(lat), "errors": len(errors), "wall_s": round(wall, 2),
        "latency_s": {"p50": round(q[49], 3), "p95": round(q[94], 3), "max": round(lat[-1], 3)},
        "requests_per_s": round(len(lat) / wall, 2), "sentences_per_s": round(len(lat) * k / wall, 2),
        "server_rss_mib": {"after_warmup": round(before.get("VmRSS", 0) / 1024, 1),
                           "after_run": round(after.get("VmRSS", 0) / 1024, 1),
                           "peak": round(after.get("VmHWM", 0) / 1024, 1)},
        "cpu": cpu_model(), "cores": os.cpu_count(), "serve": args.serve or args.url,
        "first_errors": errors[:3],
    }
    print(json.dumps(record, indent=2, ensure_ascii=False))
    if args.out:
        Path(args.out).write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
