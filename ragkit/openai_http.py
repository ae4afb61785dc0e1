"""The HTTP side shared by ragkit's clients of OpenAI-compatible engines (the generator in
`ragkit.generate.openai_compat`, the embedder in `ragkit.embed.openai`, the reranker):
base-URL handling, timeouts, and reading an engine's errors into one short line. The
clients themselves are the official `openai` package's; this is only what ragkit adds.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit

# Placeholder key for engines started without one: the openai client refuses to build
# without a key, and vLLM's and llama.cpp's docs use this value for keyless servers.
NO_API_KEY = "EMPTY"
CONNECT_TIMEOUT_S = 10.0


def error_detail(exc: Exception) -> str:
    """The server's own error message, on one line and short."""
    import openai

    text = ""
    if isinstance(exc, openai.APIStatusError):
        try:
            text = exc.response.text
        except Exception:  # the body was never read
            text = ""
    body: Any = getattr(exc, "body", None)
    if text:
        try:
            body = json.loads(text)
        except ValueError:
            body = text
    if isinstance(body, dict):
        e = body.get("error", body.get("detail", body.get("message", body)))
        if isinstance(e, dict):
            e = e.get("message", e)
        text = e if isinstance(e, str) else json.dumps(e, ensure_ascii=False)
    elif body is not None and not isinstance(body, str):
        text = json.dumps(body, ensure_ascii=False)
    elif isinstance(body, str):
        text = body
    if not text:
        text = getattr(exc, "message", "") or str(exc)
    text = " ".join(text.split())
    return text[:300] + ("…" if len(text) > 300 else "") if text else "(no message)"


def error_code(exc: Exception) -> str:
    code = getattr(exc, "code", None)
    body = getattr(exc, "body", None)
    if code is None and isinstance(body, dict):
        inner = body.get("error", body)
        code = inner.get("code") if isinstance(inner, dict) else None
    return str(code or "")


def connection_reason(exc: BaseException) -> str:
    """Why a connection failed, in a few words, from the transport error under the
    openai client's APIConnectionError (httpx2 underneath)."""
    import httpx2

    cause = exc.__cause__ or exc.__context__ or exc
    msg = str(cause).lower()
    if isinstance(cause, (httpx2.ConnectTimeout, httpx2.PoolTimeout)):
        return "connection timed out"
    if isinstance(cause, httpx2.ReadTimeout):
        return "no answer within generator.timeout_s"
    if isinstance(cause, httpx2.TimeoutException):
        return "timed out"
    if "refused" in msg:
        return "connection refused"
    if "name or service not known" in msg or "nodename nor servname" in msg or "name resolution" in msg:
        return "unknown host"
    if isinstance(cause, (httpx2.RemoteProtocolError, httpx2.ReadError)):
        return "the connection was closed"
    return " ".join(str(cause).split()) or type(cause).__name__


def normalize_base_url(url: str) -> str:
    url = url.strip().rstrip("/")
    if "://" not in url:
        url = "http://" + url
    if url.endswith("/v1"):
        url = url[: -len("/v1")]
    return url


def origin(url: Any) -> tuple[str, str, int | None]:
    u = urlsplit(str(url))
    port = u.port or {"http": 80, "https": 443}.get(u.scheme)
    return u.scheme, (u.hostname or "").lower(), port
