"""Generation on an OpenAI-compatible engine (llama-server, vLLM, SGLang, llama_cpp.server).

ragkit still builds and budgets the prompt itself, with the model's own tokenizer loaded
locally from the same GGUF (`vocab_only=True`, no weights): `generator.model` names the
GGUF, `generator.remote_model` the model name sent to the engine. The pre-templated
prompt goes to `/v1/completions`, streamed:

1. as the list of token ids (exact: the template is not re-tokenized; vLLM, SGLang and
   llama-server accept it),
2. else as text, detokenized from the ids (llama_cpp.server accepts only strings),
3. else, when the engine has no completions endpoint, to `/v1/chat/completions` as a
   system and a user message recovered from the template.

The first that works is remembered for the life of the generator. Connect errors and
5xx answers are retried with exponential backoff; 4xx answers are not.
"""

from __future__ import annotations

import atexit
import json
import time
from typing import Any, Callable, Iterator

from ragkit.config import Settings
from ragkit.errors import RagkitError, UsageError
from ragkit.generate.base import Generation

BACKOFF_S = 0.5  # first retry delay; doubles each retry
MAX_BACKOFF_S = 8.0
_FALLBACK_STATUS = {400, 404, 405, 415, 422, 501}  # "this engine does not take that request"

_GENERATORS: dict[tuple, "OpenAICompatGenerator"] = {}


@atexit.register
def _close_clients() -> None:
    for g in list(_GENERATORS.values()):
        g.close()
    _GENERATORS.clear()


class RemoteGeneratorError(RagkitError):
    """The OpenAI-compatible engine answered with an error, or an answer we cannot read."""

    exit_code = 3


class GeneratorUnreachable(RemoteGeneratorError):
    """No connection to the engine (refused, timed out, reset) after every retry."""

    def __init__(self, message: str, *, hint: str | None = None, attempts: int = 0):
        super().__init__(message, hint=hint)
        self.attempts = attempts


class _HTTPStatus(Exception):
    def __init__(self, status: int, detail: str):
        super().__init__(f"HTTP {status}: {detail}")
        self.status = status
        self.detail = detail
        self.attempts = 1


def _detail(body: bytes) -> str:
    """The server's own error message, on one line and short."""
    text = body.decode("utf-8", errors="replace").strip()
    try:
        obj = json.loads(text)
        if isinstance(obj, dict):
            e = obj.get("error", obj.get("detail", obj.get("message", obj)))
            if isinstance(e, dict):
                e = e.get("message", e)
            text = e if isinstance(e, str) else json.dumps(e, ensure_ascii=False)
    except ValueError:
        pass
    text = " ".join(text.split())
    return text[:300] + ("…" if len(text) > 300 else "") if text else "(no message)"


def _reason(exc: BaseException) -> str:
    import httpx

    msg = str(exc).lower()
    if isinstance(exc, (httpx.ConnectTimeout, httpx.PoolTimeout)):
        return "connection timed out"
    if isinstance(exc, httpx.ReadTimeout):
        return "no answer within generator.timeout_s"
    if "refused" in msg:
        return "connection refused"
    if "name or service not known" in msg or "nodename nor servname" in msg or "name resolution" in msg:
        return "unknown host"
    if isinstance(exc, (httpx.RemoteProtocolError, httpx.ReadError)):
        return "the connection was closed"
    return " ".join(str(exc).split()) or type(exc).__name__


def normalize_base_url(url: str) -> str:
    url = url.strip().rstrip("/")
    if "://" not in url:
        url = "http://" + url
    if url.endswith("/v1"):
        url = url[: -len("/v1")]
    return url


class OpenAICompatGenerator:
    def __init__(self, settings: Settings, *, backoff_s: float | None = None, stream: bool = True):
        import httpx

        from ragkit.generate.llama import LlamaCppGenerator

        cfg = settings.generator
        if not cfg.base_url:
            raise UsageError(
                "generator.backend is 'openai' but generator.base_url is not set",
                hint="set RAGKIT_GENERATOR__BASE_URL=http://127.0.0.1:8080 or [generator] base_url in ragkit.toml",
            )
        self.cfg = cfg
        self.base_url = normalize_base_url(cfg.base_url)
        self.remote_model = cfg.remote_model
        self.name = cfg.remote_model or cfg.model
        self.n_ctx = cfg.n_ctx
        self.backoff_s = BACKOFF_S if backoff_s is None else backoff_s
        self.stream = stream
        self.mode = "ids"  # "ids" -> "text" -> "chat": the first the engine accepts
        # the tokenizer, from the same GGUF, without weights
        self.tok = LlamaCppGenerator.from_settings(settings, vocab_only=True)
        self.chat_template = self.tok.chat_template
        headers = {"Accept": "application/json, text/event-stream"}
        if cfg.api_key:
            headers["Authorization"] = f"Bearer {cfg.api_key}"
        self.client = httpx.Client(
            timeout=httpx.Timeout(cfg.timeout_s, connect=min(cfg.timeout_s, 10.0)),
            headers=headers,
            trust_env=False,  # never route loopback engines through a proxy from the environment
        )
        self.attempts = 0  # HTTP attempts made, for tests and reports

    @classmethod
    def from_settings(cls, settings: Settings, *, vocab_only: bool = False) -> "OpenAICompatGenerator":
        # one generator (tokenizer, HTTP connection pool, negotiated mode) per configuration;
        # vocab_only makes no difference: nothing is loaded but the tokenizer
        key = (settings.generator.model_dump_json(), str(settings.cache_dir))
        if key not in _GENERATORS:
            _GENERATORS[key] = cls(settings)
        return _GENERATORS[key]

    def close(self) -> None:
        try:
            self.client.close()
        except Exception:
            pass

    # ------------------------------------------------------------ tokens (local)

    def tokenize(self, text: str, *, special: bool, add_bos: bool = False) -> list[int]:
        return self.tok.tokenize(text, special=special, add_bos=add_bos)

    def detokenize(self, ids: list[int]) -> str:
        return self.tok.detokenize(ids)

    def special_token_ids(self) -> set[int]:
        return self.tok.special_token_ids()

    def prompt_text(self, prompt_ids: list[int]) -> str:
        """The prompt as text, turn markers included, without a leading BOS (engines add
        their own to a text prompt).

        An engine tokenizes a text prompt with special-token parsing on, so a marker such
        as `<|im_end|>` written inside a document would become a real turn marker there.
        Runs of ordinary tokens are therefore detokenized on their own, and any marker
        text inside them is broken with a WORD JOINER (U+2060) after its first character;
        only the template's own control tokens come out as markers."""
        llm = self.tok.llm
        ids = list(prompt_ids)
        if ids and ids[0] == llm.token_bos():
            ids = ids[1:]
        special, markers = self._specials()
        out: list[str] = []
        run: list[int] = []

        def flush() -> None:
            if run:
                text = llm.detokenize(run, special=True).decode("utf-8", errors="replace")
                for m in markers:
                    if m in text:
                        text = text.replace(m, m[0] + "\u2060" + m[1:])
                out.append(text)
                run.clear()

        for t in ids:
            if t in special:
                flush()
                out.append(llm.detokenize([t], special=True).decode("utf-8", errors="replace"))
            else:
                run.append(t)
        flush()
        return "".join(out)

    def _specials(self) -> tuple[set[int], list[str]]:
        if not hasattr(self, "_special_cache"):
            ids = self.tok.special_token_ids()
            llm = self.tok.llm
            texts = {llm.detokenize([t], special=True).decode("utf-8", errors="replace") for t in ids}
            self._special_cache = (ids, sorted((t for t in texts if len(t) > 1), key=len, reverse=True))
        return self._special_cache

    def chat_messages(self, prompt_ids: list[int]) -> list[dict[str, str]]:
        """System and user messages recovered from the templated prompt (for engines that
        only serve chat). The engine applies its own template to them."""
        from ragkit.retrieve.prompt import render_chat_parts

        text = self.prompt_text(prompt_ids)
        pre, mid, post = render_chat_parts(self.chat_template)
        if text.startswith(pre) and text.endswith(post) and mid in text[len(pre):]:
            system, user = text[len(pre): len(text) - len(post)].split(mid, 1)
            return [{"role": "system", "content": system}, {"role": "user", "content": user}]
        return [{"role": "user", "content": text}]

    # ------------------------------------------------------------ HTTP

    def _sampling(self, max_tokens: int) -> dict[str, Any]:
        cfg = self.cfg
        body: dict[str, Any] = {
            "max_tokens": max_tokens,
            "temperature": cfg.temperature,
            "top_p": cfg.top_p,
            "seed": cfg.seed,
            # not in OpenAI's API; llama.cpp and vLLM/SGLang read them
            "min_p": cfg.min_p,
            "repeat_penalty": cfg.repeat_penalty,
            "repetition_penalty": cfg.repeat_penalty,
        }
        if self.remote_model:
            body["model"] = self.remote_model
        if self.stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        return body

    def _post(self, path: str, body: dict, on_text: Callable[[str], None] | None) -> tuple[Generation, dict]:
        """One request with retries on connect errors and 5xx. Returns the generation and
        the server's usage block ({} when it sent none)."""
        import httpx

        url = self.base_url + path
        attempt = 0
        while True:
            attempt += 1
            self.attempts += 1
            started = [False]
            try:
                return self._once(url, body, on_text, started)
            except _HTTPStatus as exc:
                if exc.status < 500 or attempt > self.cfg.retries:
                    exc.attempts = attempt
                    raise
            except httpx.TransportError as exc:
                if started[0]:  # text already went to the caller: do not repeat it
                    raise RemoteGeneratorError(
                        f"the generator at {self.base_url} closed the stream mid-answer: {_reason(exc)}"
                    ) from None
                if isinstance(exc, httpx.ReadTimeout) or attempt > self.cfg.retries:
                    raise GeneratorUnreachable(
                        f"cannot reach the generator at {self.base_url}: {_reason(exc)}",
                        hint=f"{attempt} attempt{'s' if attempt > 1 else ''}; is the server running? check generator.base_url",
                        attempts=attempt,
                    ) from None
            time.sleep(min(self.backoff_s * 2 ** (attempt - 1), MAX_BACKOFF_S))

    def _once(self, url: str, body: dict, on_text, started: list[bool]) -> tuple[Generation, dict]:
        out = Generation()
        usage: dict = {}
        parts: list[str] = []
        t0 = time.perf_counter()

        def take(obj: dict) -> None:
            if not isinstance(obj, dict):
                return
            if obj.get("error"):
                raise RemoteGeneratorError(f"the generator at {self.base_url} failed: {_detail(json.dumps(obj).encode())}")
            if obj.get("usage"):
                usage.update(obj["usage"])
            if isinstance(obj.get("timings"), dict):  # llama-server: cache_n = prompt tokens reused
                usage.setdefault("_timings", obj["timings"])
            for choice in obj.get("choices") or []:
                piece = choice.get("text")
                if piece is None:
                    piece = (choice.get("delta") or choice.get("message") or {}).get("content")
                if piece:
                    if not parts:
                        out.ttft_s = time.perf_counter() - t0
                    parts.append(piece)
                    started[0] = True
                    if on_text is not None:
                        on_text(piece)
                if choice.get("finish_reason"):
                    out.finish_reason = choice["finish_reason"]

        with self.client.stream("POST", url, json=body) as resp:
            if resp.status_code >= 400:
                detail = _detail(resp.read())
                status = resp.status_code
                if status == 500 and "validation error" in detail.lower():
                    status = 422  # llama_cpp.server answers a request it cannot parse with 500
                raise _HTTPStatus(status, detail)
            ctype = resp.headers.get("content-type", "")
            if "text/event-stream" in ctype:
                for data in _sse_data(resp.iter_lines()):
                    if data.strip() == "[DONE]":
                        break
                    try:
                        take(json.loads(data))
                    except ValueError:
                        raise RemoteGeneratorError(
                            f"the generator at {self.base_url} sent an unreadable event: {data[:120]!r}"
                        ) from None
            else:
                raw = resp.read()
                try:
                    take(json.loads(raw))
                except ValueError:
                    raise RemoteGeneratorError(
                        f"the generator at {self.base_url} sent an answer that is not JSON: {_detail(raw)}"
                    ) from None
        out.total_s = time.perf_counter() - t0
        if not parts:
            out.ttft_s = out.total_s
        out.text = "".join(parts)
        return out, usage

    def _resolve_model(self) -> None:
        """vLLM and SGLang want the served model's name; ask the engine when none is set."""
        if self.remote_model is not None:
            return
        self.remote_model = ""
        try:
            r = self.client.get(self.base_url + "/v1/models", timeout=min(self.cfg.timeout_s, 10.0))
            data = (r.json().get("data") or []) if r.status_code == 200 else []
            if len(data) == 1 and data[0].get("id"):
                self.remote_model = data[0]["id"]
                self.name = self.remote_model
        except Exception:
            self.remote_model = None  # try again next time (the server may be starting)

    # ------------------------------------------------------------ generation

    def generate(self, prompt_ids: list[int], *, max_tokens: int, on_text: Callable[[str], None] | None = None) -> Generation:
        if len(prompt_ids) + max_tokens > self.n_ctx:
            raise UsageError(f"prompt of {len(prompt_ids)} tokens + {max_tokens} new tokens exceeds n_ctx {self.n_ctx}")
        self._resolve_model()
        rejected: list[str] = []
        while True:
            body = self._sampling(max_tokens)
            if self.mode == "chat":
                path = "/v1/chat/completions"
                body["messages"] = self.chat_messages(prompt_ids)
            else:
                path = "/v1/completions"
                body["prompt"] = list(prompt_ids) if self.mode == "ids" else self.prompt_text(prompt_ids)
            try:
                gen, usage = self._post(path, body, on_text)
                break
            except _HTTPStatus as exc:
                if exc.status in (401, 403):
                    raise RemoteGeneratorError(
                        f"the generator at {self.base_url} refused the request: {exc}", hint="check generator.api_key"
                    ) from None
                if exc.status >= 500:
                    raise RemoteGeneratorError(
                        f"the generator at {self.base_url} failed: {exc}", hint=f"{exc.attempts} attempts"
                    ) from None
                rejected.append(f"{self.mode}: {exc}")
                nxt = {"ids": "text", "text": "chat"}.get(self.mode)
                if exc.status not in _FALLBACK_STATUS or nxt is None:
                    raise RemoteGeneratorError(
                        f"the generator at {self.base_url} rejected the request ({'; '.join(rejected)})"
                    ) from None
                self.mode = nxt
        return self._finish(gen, usage, prompt_ids)

    def _finish(self, gen: Generation, usage: dict, prompt_ids: list[int]) -> Generation:
        timings = usage.pop("_timings", {}) if usage else {}
        gen.extra["mode"] = self.mode
        gen.extra["usage_reported"] = bool(usage)
        gen.extra["usage"] = dict(usage)
        gen.prompt_tokens = int(usage.get("prompt_tokens") or len(prompt_ids))
        if usage.get("completion_tokens") is not None:
            gen.completion_tokens = int(usage["completion_tokens"])
        else:
            gen.completion_tokens = len(self.tok.tokenize(gen.text, special=False)) if gen.text else 0
        details = usage.get("prompt_tokens_details") or {}
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        if cached is None:
            cached = timings.get("cache_n")
        gen.cached_tokens = int(cached or 0)
        gen.extra["cached_reported"] = cached is not None
        return gen


def _sse_data(lines: Iterator[str]) -> Iterator[str]:
    """The data of each server-sent event (multi-line data joined; comments skipped)."""
    buf: list[str] = []
    for line in lines:
        if not line.strip():
            if buf:
                yield "\n".join(buf)
                buf = []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        if field == "data":
            buf.append(value[1:] if value.startswith(" ") else value)
    if buf:
        yield "\n".join(buf)
