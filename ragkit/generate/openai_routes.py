"""The route an OpenAI-compatible engine takes a pre-templated prompt by, learnt from its
answers, and the errors ragkit reports for it (ragkit.generate.openai_compat uses them)."""

from __future__ import annotations

import re

from ragkit.errors import RagkitError
from ragkit.openai_http import error_code as _error_code

_NEXT_ROUTE = {"ids": "text", "text": "chat"}
_ROUTE_MISSING = {404, 405, 501}  # the server has no such route (or method)
# What engines say when a prompt does not fit their context (llama_cpp.server and
# OpenAI: code context_length_exceeded, "maximum context length"; vLLM: "maximum context
# length", max_model_len; llama-server: "exceeds the available context size",
# exceed_context_size_error; SGLang: "longer than the model's context length"; TGI:
# "must be <= N"). Checked before anything else, so a message that also mentions the
# prompt never reads as "this route is unsupported".
_CONTEXT_ERROR = re.compile(
    r"context[ _-]?(length|window|size)|maximum context|exceed_context|n_ctx|max_model_len|tokens.{0,40}must be <= ?\d+"
    r"|input is too (long|large)|prompt is too long|too many tokens",
    re.I,
)
# What engines say when they take only a string prompt (llama_cpp.server: pydantic
# "Input should be a valid string" at ('body', 'prompt', 'str'); Go engines: "cannot
# unmarshal array into ... prompt of type string"; others: "prompt must be a string").
_PROMPT_NOT_IDS = re.compile(
    r"\bprompt\b.{0,200}\b(str|string|unmarshal|array|list|integers?|type)\b"
    r"|\b(str|string|unmarshal|array|list|integers?|type)\b.{0,200}\bprompt\b",
    re.I | re.S,
)


class _NoLogprobs(Exception):
    """The engine gives no log-probabilities (choose falls back to a short answer)."""




class RemoteGeneratorError(RagkitError):
    """The OpenAI-compatible engine answered with an error, or an answer we cannot read."""

    exit_code = 3


class GeneratorUnreachable(RemoteGeneratorError):
    """No connection to the engine (refused, timed out, reset) after every retry."""

    def __init__(self, message: str, *, hint: str | None = None, attempts: int = 0):
        super().__init__(message, hint=hint)
        self.attempts = attempts


class PromptTooLong(RemoteGeneratorError):
    """The engine's context is smaller than the prompt ragkit budgeted for its n_ctx.
    A configuration mismatch (generator.n_ctx vs the server's), hence exit code 2."""

    exit_code = 2

    def __init__(self, message: str, *, hint: str | None = None, prompt_tokens: int = 0, n_ctx: int = 0):
        super().__init__(message, hint=hint)
        self.prompt_tokens = prompt_tokens
        self.n_ctx = n_ctx


def is_context_error(exc: Exception, detail: str) -> bool:
    return _error_code(exc) in ("context_length_exceeded", "exceed_context_size_error") or bool(_CONTEXT_ERROR.search(detail))


def next_route(route: str, status: int, detail: str) -> str | None:
    """The route to try after `route` was refused with `status`/`detail`, when that answer
    is evidence the engine does not support the route; None when it is not (then the
    error is the caller's to report, and the route stays)."""
    if route in ("ids", "text") and status in _ROUTE_MISSING and not re.search(r"\bmodel\b", detail, re.I):
        return "chat"  # no /v1/completions at all: the text form would hit the same missing route
    if route == "ids" and status in (400, 422) and _PROMPT_NOT_IDS.search(detail):
        return "text"
    return None
