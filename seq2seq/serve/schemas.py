"""The JSON API's request and response models: FastAPI validates with them and builds
the OpenAPI schema (``/v1/openapi.json``) from them.

The request model is made per server (:func:`translate_request_model`), so the schema
states the limits this server enforces and the names of the models it has loaded.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# pydantic's error type for each limit of a request field: (field, error type) -> limit
LIMIT_ERRORS = {
    ("sentences", "too_long"): "max_sentences",
    ("sentences", "string_too_long"): "max_chars",
    ("beam", "less_than_equal"): "max_beam",
    ("nbest", "less_than_equal"): "max_nbest",
}


class Limits(BaseModel):
    """What one request may ask for (the server's ``limits.*`` settings)."""

    max_chars: int = Field(description="characters per sentence")
    max_sentences: int = Field(description="sentences per request")
    max_beam: int
    max_nbest: int
    timeout_s: float = Field(description="a request not decoded within this gets 408")
    max_queue: int = Field(description="decoding jobs (one per request and model) that may wait; "
                                       "more get 429")
    max_body_bytes: int = Field(description="request bodies larger than this get 413")

    @classmethod
    def of(cls, max_chars: int = 1000, max_sentences: int = 16, max_beam: int = 10,
           max_nbest: int = 5, timeout_s: float = 30.0, max_queue: int = 64) -> Limits:
        """The limits with ``max_body_bytes`` derived: the most a valid request can take,
        each character escaped as JSON's longest form (a surrogate pair, 12 bytes), plus
        room for the keys and the other fields."""
        return cls(max_chars=max_chars, max_sentences=max_sentences, max_beam=max_beam,
                   max_nbest=max_nbest, timeout_s=timeout_s, max_queue=max_queue,
                   max_body_bytes=max_sentences * (12 * max_chars + 8) + 4096)


def translate_request_model(limits: Limits, names: list[str], default_beam: int) -> type[BaseModel]:
    """The /v1/translate request model for these limits, these model names and this
    default beam. Strict: "5" is not a beam, and unknown keys are refused."""
    model_name = Literal[tuple(names)]  # type: ignore[valid-type]
    sentence = Annotated[str, Field(max_length=limits.max_chars)]

    class TranslateRequest(BaseModel):
        model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={
            "examples": [{"sentences": ["En el principio creó Dios los cielos y la tierra."],
                          "beam": default_beam, "nbest": 1, "attention": True}]})

        sentences: list[sentence] = Field(
            min_length=1, max_length=limits.max_sentences,
            description="Spanish sentences, one translation each; an empty one gives \"\"")
        beam: int = Field(default_beam, ge=1, le=limits.max_beam, description="beam size; 1 = greedy search")
        nbest: int = Field(1, ge=1, le=limits.max_nbest,
                           description="hypotheses returned per sentence, best first; <= beam")
        models: list[model_name] | None = Field(  # type: ignore[valid-type]
            None, min_length=1, description="which loaded models translate; default: all of them")
        attention: bool = Field(False, description="also return each hypothesis's attention "
                                                   "matrix (models with attention only)")

        @model_validator(mode="after")
        def _nbest_within_beam(self) -> TranslateRequest:
            if self.nbest > self.beam:
                raise ValueError(f"nbest={self.nbest} must be <= beam={self.beam}: raise the "
                                 "beam or lower nbest")
            return self

    return TranslateRequest


class Hypothesis(BaseModel):
    text: str = Field(description="the detokenized translation")
    score: float = Field(description="length-normalised log-probability (higher is better)")
    tgt_tokens: list[str] = Field(description="the target subwords written (no BOS/EOS)")
    attention: list[list[float]] | None = Field(
        None, description="(len(tgt_tokens), len(src_tokens)) weights, row t = where the model "
        "looked when writing target subword t; null unless attention=true was asked and the "
        "model has attention")


class SentenceResult(BaseModel):
    source: str
    src_tokens: list[str] = Field(description="the source subwords the model read")
    truncated: bool = Field(description="the source was cut to the model's maximum length")
    hypotheses: list[Hypothesis] = Field(description="nbest hypotheses, best first")


class ModelOutput(BaseModel):
    model: str
    attention: str = Field(description="none | bahdanau | luong")
    alignment: bool = Field(description="false for attention=none: one fixed vector, no alignment")
    sentences: list[SentenceResult] = Field(description="one per request sentence, in order")


class TranslateResponse(BaseModel):
    beam: int
    nbest: int
    outputs: list[ModelOutput] = Field(description="one per requested model, in request order")
    elapsed_ms: float = Field(description="time from receiving the request to the answer")


class ModelInfo(BaseModel):
    name: str
    attention: str = Field(description="none | bahdanau | luong (an ensemble's joined by +)")
    alignment: bool = Field(description="false for attention=none: one fixed vector, no alignment")
    parameters: int
    runs: list[str] = Field(description="run folder(s) it was loaded from (several: an ensemble)")
    training: dict[str, Any] | None = Field(
        description="the run's summary.json: steps, epochs, train_time_s, best_dev_bleu, ...")
    settings: dict[str, Any] = Field(description="decoding settings: max_src_tokens, alpha, ...")


class ModelsResponse(BaseModel):
    models: list[ModelInfo]
    limits: Limits
    default_beam: int


class Health(BaseModel):
    status: Literal["ok"]
    models: int
    waiting_jobs: int = Field(description="decoding jobs in the queue now")
    decoded_sentences: int = Field(description="sentences decoded since start (per model)")
    uptime_s: float


class ErrorResponse(BaseModel):
    """Every 4xx answer: a code, one line to show a person, and the limit it hit if any."""

    error: str = Field(description="limit_exceeded | invalid_json | invalid_request | "
                                   "unknown_model | timeout | queue_full | not_found "
                                   "(also for a wrong method, 405)")
    message: str
    limit: str | None = Field(None, description="the limit's name, e.g. max_sentences")
    allowed: int | float | None = Field(None, description="the limit's value")
    detail: list[dict[str, Any]] | None = Field(None, description="pydantic's errors, if any")
