"""The errors of `ragkit serve`, OpenAI-shaped: {"error": {"message", "type", "param", "code"}}.

`ApiError` is an error answered with its HTTP status; `error_for(exc)` maps an exception
from ragkit to one (anything else: 500, details in the server log only);
`install_error_handlers(app)` makes every error of the app, FastAPI's own included
(validation, 404, 405), answer in that shape.
"""

from __future__ import annotations

import json
import logging
import traceback

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ragkit.errors import ConfigError, ModelNotFound, RagkitError, StoreError, StoreLocked, UsageError

log = logging.getLogger("ragkit.serve")

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



def install_error_handlers(app: FastAPI) -> None:
    """Answer every error of `app` as {"error": {...}}: ApiError as it is, a request body
    that does not validate as 400, FastAPI's HTTP errors with their status, anything else
    through `error_for`."""

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
