"""The OpenAI-compatible HTTP API of `ragkit serve`.

`create_app(settings)` builds a FastAPI app with:

- `GET /health` (no token): {"status", "documents", "generator", "busy"}
- `GET /v1/models`: `ragkit` (every document) and `ragkit:NAME` per ingested document
- `POST /v1/chat/completions`: the last user message is the question, earlier turns are
  context (in the prompt, not searched with); documents are picked by the model
  (`ragkit:NAME`) and/or `"docs": [NAME, ...]` in the body. Streaming (SSE) or not.

The app holds no pipeline logic: a request becomes one `ragkit.ask.ask` call on the
loaded generator, in a worker thread, one at a time (`ServeState.run_generation`).

Answers carry their citations twice: in the message content, as a "Sources:" list any
chat UI shows, and structured, as top-level `citations` and `ragkit` objects on the
response (non-streaming) or on the chunk with `finish_reason` (streaming).

Every route, including those `ragkit.serve.web.register(app)` adds, sits behind one ASGI
guard: Host and Origin checks (DNS rebinding, cross-site requests), the bearer token
(everything but GET /health), and the request body limit. Errors are OpenAI-shaped:
{"error": {"message", "type", "param", "code"}}.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import logging
import threading
import time
import traceback
import uuid
from contextlib import asynccontextmanager
from typing import Any, Literal
from urllib.parse import urlsplit

from fastapi import FastAPI, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from ragkit.config import Settings
from ragkit.errors import ConfigError, ModelNotFound, RagkitError, StoreError, StoreLocked, UsageError
from ragkit.serve.state import Cancelled, Job, QueueFull, ServeState

log = logging.getLogger("ragkit.serve")

MODEL_ALL = "ragkit"
MODEL_PREFIX = "ragkit:"
SOURCES_HEAD = "\n\nSources:\n"

# ---------------------------------------------------------------------- errors

_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 403: "invalid_request_error",
          404: "invalid_request_error", 405: "invalid_request_error", 413: "invalid_request_error",
          415: "invalid_request_error", 429: "rate_limit_error", 500: "server_error", 503: "server_error"}


class ApiError(Exception):
    """An error answered as {"error": {...}} with its HTTP status."""

    def __init__(self, status: int, message: str, *, code: str | None = None, param: str | None = None,
                 type: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.type = type or _TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


class BodyTooLarge(HTTPException):
    """Raised while the body is read, past the limit (a body sent without Content-Length)."""

    def __init__(self, limit: int):
        super().__init__(413, f"the request body is over the limit of {limit} bytes")


def error_for(exc: BaseException) -> ApiError:
    """The HTTP error for an exception from ragkit (or anything else: 500, no details)."""
    from ragkit.retrieve.prompt import BudgetExceeded
    from ragkit.retrieve.search import UnknownDocument

    try:
        from ragkit.generate.openai_compat import GeneratorUnreachable, PromptTooLong
    except ImportError:  # pragma: no cover - openai is a dependency
        GeneratorUnreachable = PromptTooLong = ()  # type: ignore[assignment]
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, (BudgetExceeded, PromptTooLong)):
        return ApiError(413, str(exc), code="context_length_exceeded", param="messages")
    if isinstance(exc, UnknownDocument):
        return ApiError(404, str(exc), code="document_not_found", param="docs")
    if isinstance(exc, (UsageError, ConfigError)):
        return ApiError(400, str(exc), code="invalid_request")
    if isinstance(exc, StoreLocked):
        return ApiError(503, str(exc), code="store_unavailable", headers={"Retry-After": "5"})
    if isinstance(exc, StoreError):
        return ApiError(503, str(exc), code="store_unavailable")
    if isinstance(exc, GeneratorUnreachable):
        return ApiError(503, str(exc), code="model_unavailable", headers={"Retry-After": "5"})
    if isinstance(exc, ModelNotFound) or (isinstance(exc, RagkitError) and exc.exit_code == 3):
        return ApiError(503, str(exc), code="model_unavailable")
    if isinstance(exc, RagkitError):
        return ApiError(500, str(exc), code="internal_error")
    log.error("internal error: %s", "".join(traceback.format_exception(exc)).rstrip())
    return ApiError(500, "internal server error (see the server log)", code="internal_error")


_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large", 415: "unsupported_media_type"}

# ---------------------------------------------------------------------- the guard


def is_loopback_host(host: str) -> bool:
    """localhost, 127.0.0.0/8, ::1 (no name lookup: any other name is not loopback)."""
    h = host.strip().strip("[]").lower()
    if h == "localhost":
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def _host_name(value: str) -> str:
    """The host part of a Host header value ("127.0.0.1:8000", "[::1]:8000", "localhost")."""
    v = value.strip().lower()
    if v.startswith("["):
        return v[1 : v.find("]")] if "]" in v else v
    return v.rsplit(":", 1)[0] if v.count(":") == 1 else v


def _public_paths() -> frozenset[str]:
    try:
        from ragkit.serve.web import PUBLIC_PATHS
    except ImportError:  # the web page is optional
        return frozenset()
    return PUBLIC_PATHS


class Guard:
    """ASGI middleware in front of every route (routes added later included):

    1. Host: when the server binds loopback, the Host header must name loopback, so a
       web page cannot reach it by DNS rebinding (an attacker's name resolving to 127.0.0.1).
    2. Origin: a browser request from another origin is refused (no cross-site POSTs or
       uploads; no CORS headers are ever sent, so no page can read answers either).
    3. Token: with one, every request but GET /health needs `Authorization: Bearer TOKEN`
       (compared with hmac.compare_digest).
    4. Body size: over `api_limit` bytes on /v1/ routes, `other_limit` elsewhere, and a
       route's own limit where it has one (`route_limits`: the upload route): 413.
    """

    def __init__(self, app, *, token: str | None, loopback_only: bool, api_limit: int, other_limit: int,
                 route_limits: dict[str, int] | None = None):
        self.app = app
        self.token = token.encode("utf-8") if token else None
        self.loopback_only = loopback_only
        self.api_limit = api_limit
        self.other_limit = other_limit
        self.route_limits = dict(route_limits or {})  # a route with its own (larger) limit: uploads

    def limit_for(self, path: str) -> int:
        if path in self.route_limits:
            return self.route_limits[path]
        return self.api_limit if path.startswith("/v1/") else self.other_limit

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        refused = self.check(scope)
        if refused is not None:
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
            else:
                await refused.response()(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope["path"])
        seen = 0

        async def limited_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise BodyTooLarge(limit)
            return message

        await self.app(scope, limited_receive, send)

    def check(self, scope) -> ApiError | None:
        headers: dict[bytes, bytes] = {}
        for k, v in scope.get("headers", []):
            headers.setdefault(k.lower(), v)
        host = headers.get(b"host", b"").decode("latin-1")
        if self.loopback_only and not is_loopback_host(_host_name(host) or "localhost"):
            return ApiError(400, f"Host {host!r} is not this server's loopback address (refused: DNS rebinding guard)",
                            code="invalid_host")
        origin = headers.get(b"origin")
        if origin is not None:
            o = origin.decode("latin-1").strip()
            parts = urlsplit(o)
            if o == "null" or parts.netloc.lower() != host.lower() or parts.scheme not in ("http", "https"):
                return ApiError(403, f"cross-origin request from {o!r} refused", code="cross_origin")
        # No token for GET /health, nor for the page's own shell (`/` and its three static
        # files, ragkit.serve.web.PUBLIC_PATHS): a browser navigation cannot send a header,
        # and they hold no document data; every route that does (documents, pages,
        # uploads, answers) still needs the token, which the page sends on each fetch.
        public = scope["type"] == "http" and scope.get("method") in ("GET", "HEAD") and (
            scope.get("path") == "/health" or scope.get("path") in _public_paths())
        if self.token is not None and not public:
            auth = headers.get(b"authorization", b"")
            scheme, _, cred = auth.partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(cred.strip(), self.token):
                return ApiError(401, "a valid token is required: send `Authorization: Bearer TOKEN`" if not auth
                                else "invalid token", code="invalid_api_key",
                                headers={"WWW-Authenticate": "Bearer"})
        if scope["type"] == "http":
            cl = headers.get(b"content-length")
            if cl is not None:
                try:
                    size = int(cl)
                except ValueError:
                    return ApiError(400, "invalid Content-Length", code="invalid_request")
                limit = self.limit_for(scope["path"])
                if size > limit:
                    return ApiError(413, f"the request body of {size} bytes is over the limit of {limit} bytes",
                                    code="request_too_large")
        return None


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


def citation_json(c, contexts: dict[int, Any]) -> dict:
    ctx = contexts.get(c.n)
    return {"n": c.n, "doc": c.doc, "doc_id": ctx.doc_id if ctx else None, "page": c.page,
            "page_end": ctx.page_end if ctx else None, "section": c.section, "quote": c.quote,
            "inferred": c.inferred}


def sources_text(result) -> str:
    """"\\n\\nSources:\\n[1] doc.pdf, p. 3, § 5.2 Title" lines ("(inferred)" when the
    citation was matched by wording, not marked by the model); empty when none."""
    from ragkit.retrieve.prompt import format_location

    if not result.citations:
        return ""
    by_n = {c.n: c for c in result.prompt.contexts}
    lines = []
    for c in result.citations:
        ctx = by_n.get(c.n)
        where = format_location(c.page, c.section, ctx.page_end if ctx else None)
        lines.append(f"[{c.n}] {c.doc}" + (f", {where}" if where else "") + (" (inferred)" if c.inferred else ""))
    return SOURCES_HEAD + "\n".join(lines)


def claims_json(result) -> list[dict]:
    """The answer's claims, each with the source sentence(s) that support it (empty for an
    abstention); `supported: false` marks a claim no source sentence supports."""
    return [c.to_json() for c in getattr(result, "claims", [])]


def content_text(result, show_model: bool = True) -> str:
    """The message content: the answer as `ragkit.ask.display_text` reads it (an unverified
    answer: the model's text, marked, then "Not verified against the sources." and the
    passages; never "The documents do not say." for what the documents say), then the
    "Sources:" list. A stream's text pieces are its beginning and the stream ends on the
    same content (`ragkit.ask.StreamGate`)."""
    from ragkit.ask import display_text

    return display_text(result, show_model=show_model) + sources_text(result)


def ragkit_json(result, show_model: bool = True) -> dict:
    """The `ragkit` object of an answer (non-streamed) or of a stream's final chunk: the
    outcome ("supported" | "unverified" | "not_found"), the passages shown for an
    unverified or quoted answer, the model's own text (unless `retrieve.show_unverified`
    is off), and, for compatibility, `abstained` (true for not_found only)."""
    model = getattr(result, "model_answer", None)
    return {
        "outcome": getattr(result, "outcome", "not_found" if result.abstained else "supported"),
        "answer_kind": getattr(result, "answer_kind", "generated"),
        "passages": [p.to_json() for p in getattr(result, "passages", [])],
        "model_answer": model if show_model else None,
        "unverified_reason": getattr(result, "unverified_reason", None),
        "abstained": result.abstained,
        "abstain_reason": result.abstain_reason,
        "unsupported_answer": getattr(result, "unsupported_answer", None) if show_model else None,
        "invalid_citations": list(result.invalid_citations),
        "mode": result.prompt.mode,
        "contexts": [{"n": c.n, "doc": c.doc, "doc_id": c.doc_id, "page": c.page_start, "page_end": c.page_end,
                      "section": c.section} for c in result.prompt.contexts],
        "timings": {k: round(v, 4) for k, v in result.timings.items()},
    }


def usage_json(result) -> dict:
    g = result.generation
    prompt = len(result.prompt.ids)
    completion = g.completion_tokens if g else 0
    cached = g.cached_tokens if g else 0
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def finish_reason(result) -> str:
    g = result.generation
    return "length" if g is not None and g.finish_reason == "length" else "stop"


# ---------------------------------------------------------------------- events from the worker


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
    from ragkit.ask import ask

    settings = state.settings
    counted = {"pieces": 0}

    def on_text(piece: str) -> None:
        if job.cancel.is_set():
            raise Cancelled()
        counted["pieces"] += 1
        events.put("text", piece)

    def answer():
        return ask(question, settings, docs or None, on_text=on_text, context=context,
                   context_reserve=settings.serve.history_tokens, max_tokens=max_tokens, generator=state.generator)

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


# ---------------------------------------------------------------------- the app


def create_app(settings: Settings, *, token: str | None = None, max_queue: int = 4, preload: bool = True,
               host: str | None = None) -> FastAPI:
    """The ragkit HTTP app. `token`: required bearer token (default: `serve.token` of the
    settings; None there too: no token). `max_queue`: requests that may wait for the
    generator (more get 429). `preload`: load the embedder and generator now (errors
    raise: ModelNotFound...); otherwise on the first request (errors answer 503).
    `host`: the address the server binds (default `serve.host`); on loopback, requests
    must name a loopback Host."""
    if token is None and settings.serve.token is not None:
        token = settings.serve.token.get_secret_value()
    token = token or None
    state = ServeState(settings, token=token, max_queue=max_queue)
    if preload:
        state.load()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        state.cancel_all()

    app = FastAPI(title="ragkit", version=_version(), docs_url=None, redoc_url=None, lifespan=lifespan,
                  description="Offline document question answering with citations, OpenAI-compatible.")
    app.state.ragkit = state
    bind = host if host is not None else settings.serve.host
    from ragkit.serve.web import UPLOAD_PATH, upload_limit_of, upload_request_cap

    app.add_middleware(Guard, token=token, loopback_only=is_loopback_host(bind),
                       api_limit=settings.serve.max_body_bytes, other_limit=(settings.serve.max_upload_mb + 1) * 1024 * 1024,
                       route_limits={UPLOAD_PATH: upload_request_cap(upload_limit_of(settings))})

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError):
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        errors = exc.errors()
        first = errors[0] if errors else {}
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        if first.get("type") == "json_invalid":
            return ApiError(400, "the request body is not valid JSON", code="invalid_json").response()
        msg = first.get("msg", "invalid request")
        where = ".".join(loc)
        return ApiError(400, f"{where}: {msg}" if where else msg, code="invalid_request", param=where or None).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        detail = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
        return ApiError(exc.status_code, detail, code=_HTTP_CODES.get(exc.status_code),
                        headers=dict(exc.headers or {})).response()

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception):
        return error_for(exc).response()

    # ------------------------------------------------------------ routes

    async def ensure_loaded() -> None:
        if not state.loaded:
            try:
                await run_in_threadpool(state.load)
            except Exception as exc:
                raise error_for(exc) from None

    async def documents() -> list:
        try:
            return await run_in_threadpool(state.documents)
        except Exception as exc:
            raise error_for(exc) from None

    @app.get("/health")
    async def health():
        status, n = "ok", 0
        try:
            n = len(await run_in_threadpool(state.documents))
        except Exception:
            status = "degraded"
        if not state.loaded:
            status = "degraded"
        return {"status": status, "documents": n, "generator": state.generator_name, "busy": state.busy,
                "queued": state.waiting}

    def model_card(model_id: str) -> dict:
        return {"id": model_id, "object": "model", "created": state.created, "owned_by": "ragkit"}

    async def model_ids() -> list[str]:
        names = sorted({r.name for r in await documents()}, key=str.lower)
        return [MODEL_ALL] + [MODEL_PREFIX + n for n in names]

    @app.get("/v1/models")
    async def list_models():
        return {"object": "list", "data": [model_card(m) for m in await model_ids()]}

    @app.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str):
        if model_id not in await model_ids():
            raise ApiError(404, f"the model {model_id!r} does not exist", code="model_not_found", param="model")
        return model_card(model_id)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatRequest, request: Request):
        if body.n not in (None, 1):
            raise ApiError(400, "n must be 1", code="invalid_request", param="n")
        question, turns = split_messages(body.messages)
        names = docs_for(body.model, body.docs)
        records = await documents()
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
        await ensure_loaded()
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
        if not body.stream:
            return await complete(events, first, rid, created, body.model, job)
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(sse(events, first, rid, created, body.model, include_usage, job),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def complete(events: Events, ev, rid: str, created: int, model: str, job: Job):
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
        show = settings.retrieve.show_unverified
        return {
            "id": rid, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content_text(result, show)},
                         "finish_reason": finish_reason(result), "logprobs": None}],
            "usage": usage_json(result),
            "citations": [citation_json(c, by_n) for c in result.citations],
            "claims": claims_json(result),
            "ragkit": ragkit_json(result, show),
        }

    async def sse(events: Events, ev, rid: str, created: int, model: str, include_usage: bool, job: Job):
        base = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model}

        def chunk(delta: dict, finish: str | None = None, **extra) -> str:
            obj = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}], **extra}
            if include_usage:
                obj.setdefault("usage", None)
            return "data: " + json.dumps(obj, ensure_ascii=False) + "\n\n"

        from ragkit.ask import StreamGate

        finished = False
        show = settings.retrieve.show_unverified
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

    try:
        from ragkit.serve import web
    except ImportError as exc:
        if exc.name != "ragkit.serve.web":
            raise
    else:
        web.register(app)
    return app


def _version() -> str:
    from ragkit import __version__

    return __version__

