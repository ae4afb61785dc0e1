"""The OpenAI-compatible API of `ragkit serve`, as a FastAPI `APIRouter` (`router`):

- `GET /health` (no token): {"status", "documents", "generator", "busy"}
- `GET /v1/models`: `ragkit` (every document) and `ragkit:NAME` per ingested document
- `POST /v1/chat/completions`: the last user message is the question, earlier turns are
  context (in the prompt, not searched with); documents are picked by the model
  (`ragkit:NAME`) and/or `"docs": [NAME, ...]` in the body. Streaming (SSE) or not.

The routes read the shared `ServeState` from `request.app.state.ragkit` (put there by
`ragkit.serve.app.create_app`). A request becomes one `ragkit.answer.ask.ask` call on the
loaded generator, in a worker thread, one at a time (`ServeState.run_generation`).

Answers carry their citations twice: in the message content, as a "Sources:" list any
chat UI shows, and structured, as top-level `citations` and `ragkit` objects on the
response (non-streaming) or on the chunk with `finish_reason` (streaming).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import uuid
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from ragkit.errors import UsageError
from ragkit.serve.answer_json import (  # noqa: F401  (re-exported: the routes' answer shapes)
    SOURCES_HEAD,
    citation_json,
    claims_json,
    content_text,
    finish_reason,
    ragkit_json,
    sources_text,
    usage_json,
)
from ragkit.serve.errors import ApiError, error_for
from ragkit.serve.server_state import Cancelled, Job, QueueFull, ServeState

log = logging.getLogger("ragkit.serve")

MODEL_ALL = "ragkit"
MODEL_PREFIX = "ragkit:"

# ---------------------------------------------------------------------- request bodies


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool = False


class ChatRequest(BaseModel):
    """The OpenAI chat request; sampling fields are accepted and ignored (ragkit's
    settings decide), unknown fields are ignored, known fields of the wrong type are 400."""

    model_config = ConfigDict(extra="allow")
    model: str = MODEL_ALL
    messages: list[Message] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    n: int | None = Field(None, ge=1)
    docs: list[str] | None = Field(None, description="documents to answer from (names as `ragkit ask --doc` takes them)")
    temperature: float | None = None
    top_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    user: str | None = None


def message_text(m: Message, i: int) -> str:
    if m.content is None:
        return ""
    if isinstance(m.content, str):
        return m.content
    out = []
    for j, part in enumerate(m.content):
        if part.type != "text" or part.text is None:
            raise ApiError(400, f"content part of type {part.type!r} is not supported (text only)",
                           code="invalid_request", param=f"messages.{i}.content.{j}")
        out.append(part.text)
    return "\n".join(out)


def strip_sources(text: str) -> str:
    """An earlier answer without its "Sources:" list (the prompt has the sources)."""
    k = text.find(SOURCES_HEAD)
    return text[:k] if k >= 0 else text


def split_messages(messages: list[Message]) -> tuple[str, list[tuple[str, str]]]:
    """(question, earlier turns): the last user message, and the user/assistant turns
    before it. System messages are ignored: ragkit's own system prompt keeps answers to
    the sources."""
    last = max((i for i, m in enumerate(messages) if m.role == "user"), default=None)
    if last is None:
        raise ApiError(400, "no user message: the last user message is the question", code="invalid_request",
                       param="messages")
    question = message_text(messages[last], last).strip()
    if not question:
        raise ApiError(400, "the question (the last user message) is empty", code="invalid_request",
                       param=f"messages.{last}.content")
    turns = []
    for i, m in enumerate(messages[:last]):
        if m.role not in ("user", "assistant"):
            continue
        text = message_text(m, i)
        text = (strip_sources(text) if m.role == "assistant" else text).strip()
        if text:
            turns.append(("User" if m.role == "user" else "Assistant", text))
    return question, turns


def fit_context(turns: list[tuple[str, str]], generator, reserve: int) -> str | None:
    """The most recent turns as plain text, within `reserve` prompt tokens (its heading
    included); older turns are dropped first, then the start of the oldest one kept."""
    from ragkit.retrieve.prompt import CONTEXT_HEAD

    if not turns or reserve <= 0:
        return None

    def cost(text: str) -> int:
        return len(generator.tokenize(CONTEXT_HEAD + text.strip(), special=False))

    lines = [f"{who}: {text}" for who, text in turns]
    while lines:
        text = "\n".join(lines)
        if cost(text) <= reserve:
            return text
        if len(lines) == 1:
            break
        lines.pop(0)
    text = lines[0] if lines else ""
    lo, hi, best = 1, len(text), ""
    while lo <= hi:  # the longest tail of the one remaining turn that fits
        mid = (lo + hi) // 2
        cand = "…" + text[len(text) - mid:]
        if cost(cand) <= reserve:
            best, lo = cand, mid + 1
        else:
            hi = mid - 1
    return best or None


def docs_for(model: str, docs: list[str] | None) -> list[str]:
    if model == MODEL_ALL:
        names: list[str] = []
    elif model.startswith(MODEL_PREFIX) and model[len(MODEL_PREFIX):].strip():
        names = [model[len(MODEL_PREFIX):].strip()]
    else:
        raise ApiError(404, f"the model {model!r} does not exist: use {MODEL_ALL!r} or {MODEL_PREFIX}DOCUMENT "
                            "(GET /v1/models lists them)", code="model_not_found", param="model")
    for d in docs or []:
        if not d.strip():
            raise ApiError(400, "an empty document name in docs", code="invalid_request", param="docs")
        if d.strip() not in names:
            names.append(d.strip())
    for d in names:
        if "/" in d or "\\" in d:  # over HTTP, documents are named, never located by a path
            raise ApiError(400, f"name documents by file name, not by path: {d!r}", code="invalid_request",
                           param="docs" if d in (docs or []) else "model")
    return names


# ---------------------------------------------------------------------- answers


class Events:
    """What the worker thread reports, read by the request: ("text", piece),
    ("done", AskResult), ("error", exc), ("cancelled", None). `next()` returns None when
    the client has disconnected (and cancels the job)."""

    POLL_S = 0.2

    def __init__(self, request: Request, job: Job):
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue = asyncio.Queue()
        self.request = request
        self.job = job
        self._get: asyncio.Future | None = None
        self._checked = 0.0

    def put(self, kind: str, value: Any) -> None:  # from the worker thread
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, (kind, value))
        except RuntimeError:  # the loop is closed (shutdown)
            pass

    async def _gone(self) -> bool:
        if await self.request.is_disconnected():
            self.job.cancel.set()
            return True
        return False

    async def next(self):
        while True:
            if self._get is None:
                self._get = asyncio.ensure_future(self.queue.get())
            done, _ = await asyncio.wait({self._get}, timeout=self.POLL_S)
            now = time.monotonic()
            if done:
                ev, self._get = self._get.result(), None
                if now - self._checked >= self.POLL_S:  # tokens may flow faster than the poll
                    self._checked = now
                    if await self._gone():
                        return None
                return ev
            self._checked = now
            if await self._gone():
                return None

    def close(self) -> None:
        if self._get is not None and not self._get.done():
            self._get.cancel()


def start_answer(state: ServeState, job: Job, events: Events, *, question: str, docs: list[str], context: str | None,
                 max_tokens: int | None) -> None:
    """Run one `ask` in a worker thread, holding the generator; report on `events`."""
    from ragkit.answer.ask import ask

    settings = state.settings
    counted = {"pieces": 0}

    def on_text(piece: str) -> None:
        if job.cancel.is_set():
            raise Cancelled()
        counted["pieces"] += 1
        events.put("text", piece)

    def answer():
        return ask(question, state.session, docs or None, on_text=on_text, context=context,
                   context_reserve=settings.serve.history_tokens, max_tokens=max_tokens)

    def work() -> None:
        try:
            result = state.run_generation(answer, job)
        except Cancelled:
            state.stats["cancelled"] += 1
            log.info("ragkit serve: client disconnected; generation stopped after %d pieces", counted["pieces"])
            events.put("cancelled", None)
        except BaseException as exc:  # reported to the client, never raised in the thread
            state.stats["failed"] += 1
            events.put("error", exc)
        else:
            state.stats["answered"] += 1
            events.put("done", result)
        finally:
            state.release(job)

    threading.Thread(target=work, name="ragkit-answer", daemon=True).start()


# ---------------------------------------------------------------------- the routes

router = APIRouter()


def _state(request: Request) -> ServeState:
    """The app's shared state (`create_app` puts it on `app.state.ragkit`)."""
    return request.app.state.ragkit


async def ensure_loaded(state: ServeState) -> None:
    if not state.loaded:
        try:
            await run_in_threadpool(state.load)
        except Exception as exc:
            raise error_for(exc) from None


async def documents(state: ServeState) -> list:
    try:
        return await run_in_threadpool(state.documents)
    except Exception as exc:
        raise error_for(exc) from None


@router.get("/health")
async def health(request: Request):
    state = _state(request)
    status, n = "ok", 0
    try:
        n = len(await run_in_threadpool(state.documents))
    except Exception:
        status = "degraded"
    if not state.loaded:
        status = "degraded"
    return {"status": status, "documents": n, "generator": state.generator_name, "busy": state.busy,
            "queued": state.waiting}


def model_card(state: ServeState, model_id: str) -> dict:
    return {"id": model_id, "object": "model", "created": state.created, "owned_by": "ragkit"}


async def model_ids(state: ServeState) -> list[str]:
    names = sorted({r.name for r in await documents(state)}, key=str.lower)
    return [MODEL_ALL] + [MODEL_PREFIX + n for n in names]


@router.get("/v1/models")
async def list_models(request: Request):
    state = _state(request)
    return {"object": "list", "data": [model_card(state, m) for m in await model_ids(state)]}


@router.get("/v1/models/{model_id:path}")
async def get_model(model_id: str, request: Request):
    state = _state(request)
    if model_id not in await model_ids(state):
        raise ApiError(404, f"the model {model_id!r} does not exist", code="model_not_found", param="model")
    return model_card(state, model_id)


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatRequest, request: Request):
    state = _state(request)
    settings = state.settings
    if body.n not in (None, 1):
        raise ApiError(400, "n must be 1", code="invalid_request", param="n")
    question, turns = split_messages(body.messages)
    names = docs_for(body.model, body.docs)
    records = await documents(state)
    if not records:
        where = settings.store_url or settings.store
        raise ApiError(503, f"the store at {where} holds no documents yet: ingest some first",
                       code="store_unavailable")
    if names:
        from ragkit.retrieve.search import UnknownDocument, resolve_docs

        try:
            resolve_docs(records, names)
        except UnknownDocument as exc:
            raise ApiError(404, str(exc), code="document_not_found",
                           param="model" if body.model.startswith(MODEL_PREFIX) and len(names) == 1 else "docs") from None
        except UsageError as exc:  # a name that matches several documents
            raise ApiError(400, str(exc), code="invalid_request", param="docs") from None
    await ensure_loaded(state)
    context = await run_in_threadpool(fit_context, turns, state.generator, settings.serve.history_tokens)
    try:
        job = state.admit()
    except QueueFull as exc:
        raise ApiError(429, f"the generator is busy: {exc}; retry later", code="queue_full",
                       headers={"Retry-After": str(exc.retry_after)}) from None
    events = Events(request, job)
    start_answer(state, job, events, question=question, docs=names, context=context,
                 max_tokens=body.max_completion_tokens or body.max_tokens)
    rid = f"chatcmpl-{uuid.uuid4().hex[:24]}"
    created = int(time.time())
    try:
        first = await events.next()
    except BaseException:
        job.cancel.set()
        events.close()
        raise
    if first is None or first[0] == "cancelled":
        events.close()
        return JSONResponse({"error": {"message": "client disconnected", "type": "invalid_request_error",
                                       "param": None, "code": "client_disconnected"}}, status_code=499)
    if first[0] == "error":
        events.close()
        return error_for(first[1]).response()
    show = settings.retrieve.show_unverified
    if not body.stream:
        return await complete(events, first, rid, created, body.model, job, show)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    return StreamingResponse(sse(events, first, rid, created, body.model, include_usage, job, show),
                             media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def complete(events: Events, ev, rid: str, created: int, model: str, job: Job, show: bool):
    """The non-streamed answer: wait for the worker's end, answer the whole completion.
    `show`: `retrieve.show_unverified` (the model's own text in an unverified answer)."""
    try:
        while ev is not None and ev[0] == "text":
            ev = await events.next()
    finally:
        if ev is None or ev[0] not in ("done", "error"):
            job.cancel.set()
        events.close()
    if ev is None or ev[0] == "cancelled":
        return JSONResponse(ApiError(499, "client disconnected", code="client_disconnected").body(), status_code=499)
    if ev[0] == "error":
        return error_for(ev[1]).response()
    result = ev[1]
    by_n = {c.n: c for c in result.prompt.contexts}
    return {
        "id": rid, "object": "chat.completion", "created": created, "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content_text(result, show)},
                     "finish_reason": finish_reason(result), "logprobs": None}],
        "usage": usage_json(result),
        "citations": [citation_json(c, by_n) for c in result.citations],
        "claims": claims_json(result),
        "ragkit": ragkit_json(result, show),
    }


async def sse(events: Events, ev, rid: str, created: int, model: str, include_usage: bool, job: Job, show: bool):
    """The streamed answer: SSE chunks as the worker reports, the citations on the chunk
    with `finish_reason`, then `[DONE]`; a client gone stops the generation."""
    base = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model}

    def chunk(delta: dict, finish: str | None = None, **extra) -> str:
        obj = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}], **extra}
        if include_usage:
            obj.setdefault("usage", None)
        return "data: " + json.dumps(obj, ensure_ascii=False) + "\n\n"

    from ragkit.answer.ask import StreamGate

    finished = False
    # the text is shown as it comes, less what may be the abstention sentence (shown only
    # once the sources say so) and, with show_unverified off, nothing before the check:
    # the stream ends on the content a non-streamed answer has
    gate = StreamGate(hold_all=not show)
    try:
        yield chunk({"role": "assistant", "content": ""})
        while ev is not None:
            kind, value = ev
            if kind == "text":
                value = gate.feed(value)
                if value:
                    yield chunk({"content": value})
            elif kind == "done":
                result = value
                tail = gate.finish(content_text(result, show))
                if tail:
                    yield chunk({"content": tail})
                by_n = {c.n: c for c in result.prompt.contexts}
                yield chunk({}, finish_reason(result), citations=[citation_json(c, by_n) for c in result.citations],
                            claims=claims_json(result), ragkit=ragkit_json(result, show))
                if include_usage:
                    yield "data: " + json.dumps({**base, "choices": [], "usage": usage_json(result)}) + "\n\n"
                yield "data: [DONE]\n\n"
                finished = True
                return
            elif kind == "error":
                yield "data: " + json.dumps(error_for(value).body(), ensure_ascii=False) + "\n\n"
                finished = True
                return
            else:  # cancelled
                return
            ev = await events.next()
    finally:
        if not finished:
            job.cancel.set()  # the client went away: stop generating for it
        events.close()
