"""The FastAPI app: the versioned JSON API and the page at ``/``.

    POST /v1/translate     sentences, beam, nbest, models, attention -> each model's hypotheses
    GET  /v1/models        what is loaded (attention, parameters, training summary) and the limits
    GET  /v1/health        liveness and the decoding queue
    GET  /v1/openapi.json  the schema (FastAPI's interactive /docs is off: it loads from a CDN)
    GET  /                 the page (static/index.html, app.js, style.css, held in memory)

Every 4xx answer is an :class:`~seq2seq.serve.schemas.ErrorResponse`; going over a limit
names it. Decoding happens on the :class:`~seq2seq.serve.worker.DecodeWorker` thread.
"""
# no `from __future__ import annotations`: FastAPI reads the endpoint's annotation, and the
# request model is a class made inside create_app, which a string could not name

import asyncio
import time
from collections.abc import Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from seq2seq.serve.models import ServedModel
from seq2seq.serve.schemas import (
    LIMIT_ERRORS,
    ErrorResponse,
    Health,
    Hypothesis,
    Limits,
    ModelInfo,
    ModelOutput,
    ModelsResponse,
    SentenceResult,
    TranslateResponse,
    translate_request_model,
)
from seq2seq.serve.worker import DecodeWorker, QueueFull

STATIC = {"index.html": "text/html", "app.js": "text/javascript", "style.css": "text/css"}
# the page loads nothing from elsewhere; an injected script could not either
PAGE_HEADERS = {"Content-Security-Policy": "default-src 'self'; img-src 'self' data:",
                "X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache"}
ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse, "description": what} for code, what in (
        (400, "the body is not valid JSON"), (404, "a requested model is not loaded"),
        (408, "not decoded within limits.timeout_s"),
        (413, "over max_sentences, max_chars or max_body_bytes"),
        (422, "a wrong type or value, or over max_beam / max_nbest"),
        (429, "the decoding queue is full (limits.max_queue); retry shortly"))}


def error(status: int, code: str, message: str, limit: str | None = None,
          allowed: int | float | None = None, detail: list[dict[str, Any]] | None = None,
          headers: dict[str, str] | None = None) -> JSONResponse:
    body = ErrorResponse(error=code, message=message, limit=limit, allowed=allowed, detail=detail)
    return JSONResponse(body.model_dump(), status_code=status, headers=headers)


def body_too_large(max_bytes: int) -> JSONResponse:
    return error(413, "limit_exceeded", f"the request body is over {max_bytes} bytes (no valid "
                 "request is larger under limits.max_sentences and limits.max_chars)",
                 "max_body_bytes", max_bytes)


class BodyLimit:
    """Answer 413 to a body over ``max_bytes`` before it is read into memory: declared by
    Content-Length, or counted as a chunked body arrives (FastAPI passes an HTTPException
    raised while it reads the body on to the app's handler)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"0")
        if declared.isdigit() and int(declared) > self.max_bytes:
            await body_too_large(self.max_bytes)(scope, receive, send)
            return
        received = 0

        async def counted() -> Any:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_bytes:
                raise HTTPException(413)
            return message

        await self.app(scope, counted, send)


def validation_error(errors: Sequence[Any], limits: Limits, names: list[str]) -> JSONResponse:
    """pydantic's errors as one ErrorResponse: invalid JSON 400, an unknown model 404, a
    limit 413 (size) or 422 (beam, nbest) naming it, anything else 422."""
    detail = [{"type": e["type"], "loc": list(e["loc"]), "msg": e["msg"]} for e in errors]
    fields = [(tuple(str(x) for x in e["loc"][1:]), e) for e in errors]
    for e in errors:
        if e["type"] == "json_invalid":
            return error(400, "invalid_json", f"the body is not valid JSON ({e['msg']})", detail=detail)
    for loc, e in fields:
        limit = LIMIT_ERRORS.get((loc[0] if loc else "", e["type"]))
        if limit:
            value = getattr(limits, limit)
            status = 413 if limit in ("max_sentences", "max_chars") else 422
            return error(status, "limit_exceeded", f"{'.'.join(loc)}: {e['msg']} (the server's "
                         f"{limit} is {value})", limit, value, detail)
    for loc, e in fields:
        if e["type"] == "literal_error" and loc[:1] == ("models",):
            return error(404, "unknown_model", f"model {e.get('input')!r} is not loaded; the "
                         f"loaded models are {', '.join(names)}", detail=detail)
    where = "; ".join(f"{'.'.join(loc) or 'body'}: {e['msg']}" for loc, e in fields)
    return error(422, "invalid_request", where, detail=detail)


def model_output(served: ServedModel, translations: Sequence[Any], attention: bool) -> ModelOutput:
    """Translations (seq2seq.inference.translator.Translation) as the API's ModelOutput; attention
    matrices only if asked and meaningful, rounded to 4 decimals (the page draws them)."""
    keep = attention and served.alignment

    def hyp(t: Any) -> Hypothesis:
        att = t.attention.astype(float).round(4).tolist() if keep else None
        return Hypothesis(text=t.text, score=t.score, tgt_tokens=t.tgt_tokens, attention=att)

    sentences = [SentenceResult(source=t.source, src_tokens=t.src_tokens, truncated=t.truncated,
                                hypotheses=[hyp(t), *(hyp(a) for a in t.alternatives)])
                 for t in translations]
    return ModelOutput(model=served.name, attention=served.attention, alignment=served.alignment,
                       sentences=sentences)


def static_files() -> dict[str, bytes]:
    """The page's files, read once: no request reads a file."""
    folder = resources.files("seq2seq.serve") / "static"
    return {name: (folder / name).read_bytes() for name in STATIC}


@dataclass
class Served:
    """What the endpoints share: the models by name, the limits, the decoding thread."""

    models: dict[str, ServedModel]
    limits: Limits
    default_beam: int
    worker: DecodeWorker
    started: float = field(default_factory=time.monotonic)


def create_app(models: Sequence[ServedModel], limits: Limits, default_beam: int = 5,
               threads: int = 0) -> FastAPI:
    """The app serving ``models`` (names unique) under ``limits``; the decoding thread
    starts and stops with the app (use TestClient as a context manager)."""
    by_name = {m.name: m for m in models}
    served = Served(by_name, limits, default_beam, DecodeWorker(by_name, limits.max_queue, threads))

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> Any:
        served.worker.start()
        try:
            yield
        finally:
            await asyncio.to_thread(served.worker.stop)

    app = FastAPI(title="seq2seq-serve", version="1", lifespan=lifespan, docs_url=None,
                  redoc_url=None, openapi_url="/v1/openapi.json",
                  description="Spanish -> English translation with RNN encoder-decoders whose "
                              "attention is none, bahdanau or luong.")
    app.state.worker = served.worker
    app.add_middleware(BodyLimit, max_bytes=limits.max_body_bytes)
    add_error_handlers(app, served)
    add_translate(app, served)
    add_info(app, served)
    add_page(app, static_files())
    return app


def add_error_handlers(app: FastAPI, served: Served) -> None:
    limits, names = served.limits, list(served.models)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Any, exc: RequestValidationError) -> JSONResponse:
        return validation_error(exc.errors(), limits, names)

    @app.exception_handler(HTTPException)
    async def _http(_: Any, exc: HTTPException) -> JSONResponse:
        if exc.status_code == 413:  # BodyLimit, counting a chunked body
            return body_too_large(limits.max_body_bytes)
        # FastAPI's own 400 is a body it could not parse (e.g. not UTF-8)
        code = {400: "invalid_json", 404: "not_found"}.get(exc.status_code, "invalid_request")
        return error(exc.status_code, code, str(exc.detail), headers=exc.headers)


def add_translate(app: FastAPI, served: Served) -> None:
    """POST /v1/translate: one job per requested model on the decoding thread, awaited
    together up to ``limits.timeout_s``."""
    limits, worker, names = served.limits, served.worker, list(served.models)
    TranslateRequest = translate_request_model(limits, names, served.default_beam)  # noqa: N806

    @app.post("/v1/translate", response_model=TranslateResponse, responses=ERRORS)
    async def translate(req: TranslateRequest) -> Any:  # type: ignore[valid-type]
        """Translate each sentence with each requested model (default: all loaded)."""
        t0 = time.perf_counter()
        wanted = req.models or names
        futures = []
        try:
            for name in wanted:
                futures.append(worker.submit(name, req.sentences, req.beam, req.nbest))
        except QueueFull:
            for f in futures:
                f.cancel()
            return error(429, "queue_full", f"the server is busy: {limits.max_queue} decoding jobs "
                         "are waiting (limits.max_queue); retry shortly", "max_queue",
                         limits.max_queue, headers={"Retry-After": "1"})
        try:
            results = await asyncio.wait_for(
                asyncio.gather(*(asyncio.wrap_future(f) for f in futures)), limits.timeout_s)
        except TimeoutError:  # wait_for cancelled the jobs; the worker skips them if not begun
            return error(408, "timeout", f"not decoded within {limits.timeout_s} s "
                         "(limits.timeout_s): send fewer or shorter sentences, or a smaller beam",
                         "timeout_s", limits.timeout_s)
        outputs = [model_output(served.models[n], r, req.attention)
                   for n, r in zip(wanted, results, strict=True)]
        return TranslateResponse(beam=req.beam, nbest=req.nbest, outputs=outputs,
                                 elapsed_ms=round(1000 * (time.perf_counter() - t0), 2))


def add_info(app: FastAPI, served: Served) -> None:
    """GET /v1/models and /v1/health."""

    @app.get("/v1/models", response_model=ModelsResponse)
    async def list_models() -> ModelsResponse:
        """The loaded models, in the page's order, and this server's limits."""
        infos = [ModelInfo(name=m.name, attention=m.attention, alignment=m.alignment,
                           parameters=m.parameters, runs=m.runs, training=m.training,
                           settings=m.settings) for m in served.models.values()]
        return ModelsResponse(models=infos, limits=served.limits, default_beam=served.default_beam)

    @app.get("/v1/health", response_model=Health)
    async def health() -> Health:
        return Health(status="ok", models=len(served.models), waiting_jobs=served.worker.waiting,
                      decoded_sentences=served.worker.decoded_sentences,
                      uptime_s=round(time.monotonic() - served.started, 1))


def add_page(app: FastAPI, page: dict[str, bytes]) -> None:
    """GET / and /static/{app.js,style.css}, from memory."""

    @app.get("/", include_in_schema=False)
    async def index() -> Response:
        return Response(page["index.html"], media_type="text/html", headers=PAGE_HEADERS)

    @app.get("/static/{name}", include_in_schema=False)
    async def static(name: str) -> Response:
        if name not in page or name == "index.html":
            return error(404, "not_found", f"no static file {name!r}")
        return Response(page[name], media_type=STATIC[name], headers=PAGE_HEADERS)
