"""The JSON API of `seq2seq-serve` (FastAPI's TestClient over in-memory translators):
answer shapes, limits and bad input as 4xx JSON naming the limit, the `none` arm's
missing alignment, concurrency, the OpenAPI schema and the page."""

from __future__ import annotations

import asyncio
import builtins
import io
import pathlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from fixtures_translate import PAIRS, trained_word_translator, word_translator

from seq2seq.serve.app import create_app
from seq2seq.serve.models import ServedModel
from seq2seq.serve.schemas import Limits
from seq2seq.serve.worker import DecodeWorker

LIMITS = dict(max_chars=60, max_sentences=4, max_beam=6, max_nbest=3)
SOURCE = "creó dios los cielos y la tierra"


def served() -> list[ServedModel]:
    return [ServedModel.wrap("none", word_translator("none"), "none"),
            ServedModel.wrap("bahdanau", trained_word_translator(), "bahdanau")]


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with TestClient(create_app(served(), Limits.of(**LIMITS), default_beam=4)) as c:
        yield c


def post(client: TestClient, **body: Any) -> httpx.Response:
    return client.post("/v1/translate", json=body)


# ---------------------------------------------------------------- answers


def test_translate_gives_each_models_hypotheses_subwords_and_attention(client: TestClient) -> None:
    r = post(client, sentences=[SOURCE, "la tierra"], nbest=3, attention=True)
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["beam"], body["nbest"]) == (4, 3)  # the server's default beam
    assert [o["model"] for o in body["outputs"]] == ["none", "bahdanau"]
    out = body["outputs"][1]
    assert (out["attention"], out["alignment"]) == ("bahdanau", True)
    first, second = out["sentences"]
    assert first["source"] == SOURCE and not first["truncated"]
    assert first["src_tokens"] == ["▁" + w for w in SOURCE.split()]
    best = first["hypotheses"][0]
    assert best["text"] == "god created the heaven and the earth"  # memorised
    assert second["hypotheses"][0]["text"] == "the earth"
    assert len(first["hypotheses"]) == 3
    scores = [h["score"] for h in first["hypotheses"]]
    assert scores == sorted(scores, reverse=True) and len({h["text"] for h in first["hypotheses"]}) == 3
    for hyp in first["hypotheses"]:
        att = np.array(hyp["attention"])
        assert att.shape == (len(hyp["tgt_tokens"]), len(first["src_tokens"]))
        np.testing.assert_allclose(att.sum(axis=1), 1.0, atol=1e-3)  # rounded to 4 decimals


def test_answers_equal_the_translator_and_attention_only_on_request(client: TestClient) -> None:
    [expected] = trained_word_translator().translate(["los cielos"], beam=2)
    out = post(client, sentences=["los cielos"], beam=2, models=["bahdanau"]).json()["outputs"]
    assert len(out) == 1
    hyp = out[0]["sentences"][0]["hypotheses"][0]
    assert (hyp["text"], hyp["tgt_tokens"]) == (expected.text, expected.tgt_tokens)
    assert hyp["score"] == pytest.approx(expected.score, abs=1e-6)
    assert hyp["attention"] is None  # not asked for


def test_none_arm_reports_no_alignment(client: TestClient) -> None:
    out = post(client, sentences=[SOURCE], attention=True, models=["none"]).json()["outputs"][0]
    assert (out["attention"], out["alignment"]) == ("none", False)
    assert all(h["attention"] is None for h in out["sentences"][0]["hypotheses"])
    info = {m["name"]: m for m in client.get("/v1/models").json()["models"]}
    assert info["none"]["alignment"] is False and info["bahdanau"]["alignment"] is True


def test_empty_sentence_gives_an_empty_translation(client: TestClient) -> None:
    s = post(client, sentences=["", "  "], models=["bahdanau"]).json()["outputs"][0]["sentences"]
    assert [(x["src_tokens"], x["hypotheses"][0]["text"]) for x in s] == [([], ""), ([], "")]


def test_models_and_health(client: TestClient) -> None:
    body = client.get("/v1/models").json()
    assert [m["name"] for m in body["models"]] == ["none", "bahdanau"]
    params = sum(p.numel() for p in trained_word_translator().model.parameters())
    assert body["models"][1]["parameters"] == params > 0
    assert body["limits"]["max_sentences"] == 4 and body["default_beam"] == 4
    assert body["limits"]["max_body_bytes"] > 4 * 60
    health = client.get("/v1/health").json()
    assert health["status"] == "ok" and health["models"] == 2 and health["decoded_sentences"] > 0


# ---------------------------------------------------------------- limits and bad input


@pytest.mark.parametrize(("body", "status", "limit"), [
    ({"sentences": ["dios"] * 5}, 413, "max_sentences"),
    ({"sentences": ["dios", "a" * 61]}, 413, "max_chars"),
    ({"sentences": ["dios"], "beam": 7}, 422, "max_beam"),
    ({"sentences": ["dios"], "beam": 6, "nbest": 4}, 422, "max_nbest"),
])
def test_over_a_limit_is_4xx_json_naming_it(client: TestClient, body: dict, status: int,
                                            limit: str) -> None:
    r = client.post("/v1/translate", json=body)
    assert r.status_code == status
    err = r.json()
    assert (err["error"], err["limit"], err["allowed"]) == ("limit_exceeded", limit, LIMITS[limit])
    assert limit in err["message"]


def test_at_the_limits_is_fine(client: TestClient) -> None:
    r = post(client, sentences=["dios " * 11 + "dios"] * 4, beam=6, nbest=3, models=["bahdanau"])
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(("body", "where"), [
    ({"sentences": "dios"}, "sentences"),  # one string, not a list
    ({"sentences": [3]}, "sentences.0"),
    ({"sentences": ["dios"], "beam": "5"}, "beam"),  # strict: no string numbers
    ({"sentences": ["dios"], "beam": 2.5}, "beam"),
    ({"sentences": ["dios"], "beam": 0}, "beam"),
    ({"sentences": []}, "sentences"),
    ({"sentences": ["dios"], "models": []}, "models"),
    ({"sentences": ["dios"], "colour": "red"}, "colour"),  # unknown key
    ({}, "sentences"),
    ([1, 2], "body"),
])
def test_wrong_types_are_422_naming_the_field(client: TestClient, body: Any, where: str) -> None:
    r = client.post("/v1/translate", json=body)
    assert r.status_code == 422, r.text
    err = r.json()
    assert err["error"] == "invalid_request" and err["message"].startswith(where), err


def test_nbest_over_beam_is_422(client: TestClient) -> None:
    r = post(client, sentences=["dios"], beam=2, nbest=3)
    assert r.status_code == 422 and "nbest=3 must be <= beam=2" in r.json()["message"]


def test_unknown_model_is_404_naming_the_loaded_ones(client: TestClient) -> None:
    r = post(client, sentences=["dios"], models=["bahdanau", "transformer"])
    assert r.status_code == 404
    err = r.json()
    assert err["error"] == "unknown_model" and "'transformer'" in err["message"]
    assert "none, bahdanau" in err["message"]


@pytest.mark.parametrize("raw", [b"{not json", b"", b'{"sentences": ["a"]', "ñ".encode("latin-1")])
def test_invalid_json_is_400(client: TestClient, raw: bytes) -> None:
    r = client.post("/v1/translate", content=raw, headers={"content-type": "application/json"})
    assert r.status_code in (400, 422) and r.status_code != 500
    if raw:
        assert r.status_code == 400 and r.json()["error"] == "invalid_json"


def test_a_body_over_max_body_bytes_is_413_before_it_is_read(client: TestClient) -> None:
    limit = client.get("/v1/models").json()["limits"]["max_body_bytes"]
    big = b'{"sentences": ["' + b"a" * limit + b'"]}'
    r = client.post("/v1/translate", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["limit"] == "max_body_bytes"
    chunks = iter([b'{"sentences": ["', b"a" * limit, b'"]}'])  # no Content-Length: chunked
    r = client.post("/v1/translate", content=chunks, headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["limit"] == "max_body_bytes"


def test_unknown_paths_and_methods_are_json_4xx(client: TestClient) -> None:
    assert client.get("/v2/translate").json()["error"] == "not_found"
    assert client.get("/v1/translate").status_code == 405
    assert client.get("/static/../app.py").status_code == 404


def test_no_request_reads_or_writes_a_file(client: TestClient, monkeypatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"a request opened a file: {args}")

    for target, name in ((builtins, "open"), (io, "open"), (pathlib.Path, "open")):
        monkeypatch.setattr(target, name, refuse)
    for path in ("/", "/static/app.js", "/static/style.css", "/v1/models", "/v1/health",
                 "/v1/openapi.json"):
        assert client.get(path).status_code == 200, path
    assert post(client, sentences=[SOURCE], attention=True).status_code == 200


# ---------------------------------------------------------------- concurrency


def test_concurrent_requests_give_the_sequential_answers(client: TestClient) -> None:
    app = client.app
    bodies = [{"sentences": [s for s, _ in PAIRS[i % 6:i % 6 + 1 + i % 3]], "beam": 1 + i % 4}
              for i in range(24)]
    sequential = [post(client, **b).json()["outputs"] for b in bodies]

    async def together() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://serve") as ac:
            return await asyncio.gather(*(ac.post("/v1/translate", json=b) for b in bodies))

    answers = asyncio.run(together())
    assert [r.status_code for r in answers] == [200] * len(bodies)
    for alone, r in zip(sequential, answers, strict=True):
        for a, b in zip(alone, r.json()["outputs"], strict=True):
            texts = [[h["text"] for h in s["hypotheses"]] for s in a["sentences"]]
            assert texts == [[h["text"] for h in s["hypotheses"]] for s in b["sentences"]]
            for sa, sb in zip(a["sentences"], b["sentences"], strict=True):
                assert sa["hypotheses"][0]["score"] == pytest.approx(sb["hypotheses"][0]["score"], abs=1e-5)


class Gated:
    """A translator that waits for ``gate`` and checks that no two decodes overlap."""

    def __init__(self, gate: threading.Event, delay: float = 0.0) -> None:
        self.inner, self.gate, self.delay = trained_word_translator(), gate, delay
        self.model, self.max_src_tokens, self.search = self.inner.model, 50, self.inner.search
        self.busy = threading.Lock()
        self.calls: list[int] = []
        self.overlaps = 0

    def translate(self, sentences: list[str], **kwargs: Any) -> list[Any]:
        if not self.busy.acquire(blocking=False):
            self.overlaps += 1
            self.busy.acquire()
        try:
            self.gate.wait(10)
            time.sleep(self.delay)
            self.calls.append(len(sentences))
            return self.inner.translate(sentences, **kwargs)
        finally:
            self.busy.release()


def test_waiting_requests_are_batched_into_one_decode_never_two_at_once() -> None:
    gate = threading.Event()
    gated = Gated(gate)
    worker = DecodeWorker({"m": ServedModel.wrap("m", gated, "bahdanau")}, max_queue=32)
    worker.start()
    try:
        first = worker.submit("m", ["dios"], 2, 1)  # holds the decoding thread at the gate
        time.sleep(0.2)
        rest = [worker.submit("m", [s], 2, 1) for s, _ in PAIRS] + [worker.submit("m", ["dios"], 3, 1)]
        gate.set()
        answers = [f.result(10) for f in [first, *rest]]
    finally:
        worker.stop()
    # the six beam-2 jobs that waited were decoded as one list; the beam-3 job on its own
    assert gated.calls == [1, len(PAIRS), 1] and gated.overlaps == 0
    assert [a[0].text for a in answers[1:-1]] == [t for _, t in PAIRS]


def test_timeout_is_408_naming_it_and_a_full_queue_429() -> None:
    gate = threading.Event()
    model = ServedModel.wrap("slow", Gated(gate), "bahdanau")
    app = create_app([model], Limits.of(timeout_s=0.3, max_queue=2))
    with TestClient(app) as c:
        r = c.post("/v1/translate", json={"sentences": ["dios"]})  # waits at the gate: times out
        assert r.status_code == 408 and r.json()["limit"] == "timeout_s" and r.json()["allowed"] == 0.3
        worker = app.state.worker
        held = [worker.submit("slow", ["dios"], 1, 1) for _ in range(2)]  # the queue is full now
        r = c.post("/v1/translate", json={"sentences": ["dios"]})
        assert r.status_code == 429 and r.json()["limit"] == "max_queue"
        assert r.headers["retry-after"] == "1"
        gate.set()
        assert [f.result(10)[0].text for f in held] == ["god"] * 2
        assert c.post("/v1/translate", json={"sentences": ["dios"]}).status_code == 200


# ---------------------------------------------------------------- schema and page


def test_openapi_lists_the_endpoints_limits_and_models(client: TestClient) -> None:
    schema = client.get("/v1/openapi.json").json()
    assert set(schema["paths"]) == {"/v1/translate", "/v1/models", "/v1/health"}
    assert set(schema["paths"]["/v1/translate"]["post"]["responses"]) >= {
        "200", "400", "404", "408", "413", "422", "429"}
    request = schema["components"]["schemas"]["TranslateRequest"]["properties"]
    assert request["sentences"]["maxItems"] == 4 and request["sentences"]["items"]["maxLength"] == 60
    assert (request["beam"]["maximum"], request["nbest"]["maximum"]) == (6, 3)
    models = request["models"]["anyOf"][0]["items"]
    assert models["enum"] == ["none", "bahdanau"]
    for name in ("TranslateResponse", "ModelsResponse", "Health", "ErrorResponse"):
        assert name in schema["components"]["schemas"]


def test_the_page_is_served_whole_with_no_outside_resources(client: TestClient) -> None:
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in page.headers["content-security-policy"]
    html = page.text
    for needle in ('<label for="source">', 'id="beam"', 'id="nbest"', '/static/app.js',
                   '/static/style.css', 'name="viewport"'):
        assert needle in html
    for name in ("app.js", "style.css"):
        assert client.get(f"/static/{name}").status_code == 200
    for text in (html, client.get("/static/app.js").text, client.get("/static/style.css").text):
        assert "http://" not in text and "https://" not in text and "//cdn" not in text
    assert "One fixed vector, no alignment" in client.get("/static/app.js").text
