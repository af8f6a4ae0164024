"""`seq2seq-serve`: bind the port, load the models, serve the API and the page.

    seq2seq-serve reproduction=runs/reproduce_quick          # its three arms, side by side
    seq2seq-serve runs=[runs/none,runs/luong] port=8080
    seq2seq-serve runs=[[runs/s1,runs/s2]] names=[ensemble]  # an ensemble is one model

The port is bound before the (slow) model loading, so a port in use fails at once with
one line. The URL is printed when the server is ready (``port=0`` picks a free port).
"""

from __future__ import annotations

import errno
import socket
import sys
from typing import Any

from seq2seq.serve.models import ConfigError, ServedModel, load_served, model_specs


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on (host, port); ConfigError naming the fix if it is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        if err.errno == errno.EADDRINUSE:
            raise ConfigError(f"port {port} on {host} is in use: stop the other server or pass "
                              "another port= (port=0 picks a free one)") from None
        raise ConfigError(f"cannot listen on {host}:{port} ({err.strerror}): check host=") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def serve_main(cfg: Any) -> None:
    """Serve the models of a checked ServeConfig until Ctrl-C or SIGTERM."""
    specs = model_specs(cfg)  # a mistyped folder fails before the port and torch
    sock = bind(cfg.host, cfg.port)
    try:
        print(f"loading {len(specs)} model(s): {', '.join(n for n, _ in specs)}", file=sys.stderr)
        models = [load_served(name, members, cfg) for name, members in specs]
        run(models, cfg, sock)
    finally:
        sock.close()


def run(models: list[ServedModel], cfg: Any, sock: socket.socket) -> None:
    import uvicorn

    from seq2seq.serve.app import create_app
    from seq2seq.serve.schemas import Limits

    limits = Limits.of(**{k: cfg.limits[k] for k in cfg.limits})
    app = create_app(models, limits, cfg.beam, cfg.threads)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    server = uvicorn.Server(uvicorn.Config(app, log_level=str(cfg.log_level), access_log=False))
    # say where, once uvicorn is listening (its own line is at info level, off by default)
    print(f"serving {', '.join(m.name for m in models)} on http://{shown}:{port}/ "
          "(Ctrl-C stops)", flush=True)
    server.run(sockets=[sock])
