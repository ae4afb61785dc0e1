"""Generation on an OpenAI-compatible engine (llama-server, vLLM, SGLang, llama_cpp.server).

ragkit still builds and budgets the prompt itself, with the model's own tokenizer loaded
locally from the same GGUF (`vocab_only=True`, no weights): `generator.model` names the
GGUF, `generator.remote_model` the model name sent to the engine.

The HTTP side is the official `openai` client: streaming (server-sent events), timeouts,
and retries with exponential backoff on connection errors, timeouts, 408/409/429 and
5xx (`generator.retries`, `generator.timeout_s`). It talks to `generator.base_url` only:
no proxy from the environment, no redirects, and a request hook that refuses any other
origin.

What is ragkit's own is the route the pre-templated prompt takes:

1. `/v1/completions` with the list of token ids ("ids"): exact, the template is not
   re-tokenized by the engine (vLLM, SGLang and llama-server accept it);
2. else `/v1/completions` with the prompt as text ("text"), detokenized from the ids
   (llama_cpp.server accepts only strings);
3. else `/v1/chat/completions` ("chat") with a system and a user message recovered from
   the template, for engines that serve only chat.

The client cannot make that choice: it is about what this engine accepts, learnt from
its answers. A route is left only on evidence that the engine does not support it (a
400/422 saying the prompt must be a string, or a 404/405/501 for the completions route)
and the choice is remembered for the life of the generator. Any other rejection, a
context-length error above all, leaves the route as it is and is reported as it is.
"""

from __future__ import annotations

import atexit
import re
import time
import weakref
from typing import Any, Callable

from ragkit.config import Settings
from ragkit.errors import UsageError
from ragkit.generate.base import Choice, Generation, choice_from_tokens, option_tokens
from ragkit.generate.openai_routes import (  # noqa: F401  (re-exported: their old home)
    _CONTEXT_ERROR,
    _NEXT_ROUTE,
    _PROMPT_NOT_IDS,
    _ROUTE_MISSING,
    GeneratorUnreachable,
    PromptTooLong,
    RemoteGeneratorError,
    _NoLogprobs,
    is_context_error,
    next_route,
)
from ragkit.openai_http import CONNECT_TIMEOUT_S, NO_API_KEY, normalize_base_url
from ragkit.openai_http import connection_reason as _reason
from ragkit.openai_http import error_detail as _detail
from ragkit.openai_http import origin as _origin

# the clients alive now (weakly: this keeps none alive), closed before interpreter teardown
_LIVE: "weakref.WeakSet[OpenAICompatGenerator]" = weakref.WeakSet()
# top log-probabilities asked per scored position (vLLM's default --max-logprobs is 20)
TOP_LOGPROBS = 20


@atexit.register
def _close_clients() -> None:
    for g in list(_LIVE):
        g.close()


class OpenAICompatGenerator:
    def __init__(self, settings: Settings, *, stream: bool = True):
        import httpx2
        import openai

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
        self.stream = stream
        self.mode = "ids"  # the prompt route: "ids" -> "text" -> "chat" (module docstring)
        self.no_logprobs: str | None = None  # why choose cannot score on this engine, once learnt
        # the tokenizer, from the same GGUF, without weights
        self.tok = LlamaCppGenerator.from_settings(settings, vocab_only=True)
        self.chat_template = self.tok.chat_template
        self.attempts = 0  # generation requests sent, retries included (for tests and reports)
        self._allowed = _origin(self.base_url)
        http = openai.DefaultHttpxClient(
            trust_env=False,  # never route a loopback engine through a proxy from the environment
            follow_redirects=False,  # nor follow it to another host
            event_hooks={"request": [self._on_request], "response": [self._on_response]},
        )
        self.client = openai.OpenAI(
            base_url=self.base_url + "/v1",
            api_key=cfg.api_key or NO_API_KEY,
            max_retries=max(cfg.retries, 0),
            timeout=openai.Timeout(cfg.timeout_s, connect=min(cfg.timeout_s, CONNECT_TIMEOUT_S)),
            http_client=http,
        )
        self._httpx2 = httpx2
        _LIVE.add(self)

    @classmethod
    def from_settings(cls, settings: Settings, *, vocab_only: bool = False) -> "OpenAICompatGenerator":
        # vocab_only makes no difference: nothing is loaded but the tokenizer; a Session
        # holds the generator (tokenizer, HTTP connection pool, negotiated route)
        return cls(settings)

    def close(self) -> None:
        try:
            self.client.close()
        except Exception:
            pass

    # ------------------------------------------------------------ HTTP hooks

    def _on_request(self, request) -> None:
        # The client only ever builds URLs from base_url; this makes it a guarantee.
        if _origin(request.url) != self._allowed:
            raise RemoteGeneratorError(f"refusing a request to {request.url}: ragkit talks only to generator.base_url {self.base_url}")
        if request.method == "POST":
            self.attempts += 1

    def _on_response(self, response) -> None:
        # llama_cpp.server wraps every exception of a route, FastAPI's request validation
        # included, into a 500 (llama_cpp/server/errors.py, RouteErrorHandler). A body it
        # cannot validate is a client error: retrying cannot help, and it is the evidence
        # that says "this engine does not take token ids". Report it as the 422 FastAPI
        # would have sent, before the client decides on a retry.
        if response.status_code == 500:
            response.read()
            if "validation error" in response.text.lower():
                response.status_code = 422
            elif "logprobs is not supported" in response.text.lower():  # started without --logits_all: not transient either
                response.status_code = 400

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
        from ragkit.generate.chat_template import render_chat_parts

        text = self.prompt_text(prompt_ids)
        pre, mid, post = render_chat_parts(self.chat_template)
        if text.startswith(pre) and text.endswith(post) and mid in text[len(pre):]:
            system, user = text[len(pre): len(text) - len(post)].split(mid, 1)
            return [{"role": "system", "content": system}, {"role": "user", "content": user}]
        return [{"role": "user", "content": text}]

    # ------------------------------------------------------------ requests

    def _params(self, max_tokens: int) -> dict[str, Any]:
        import openai

        cfg = self.cfg
        params: dict[str, Any] = {
            # vLLM and SGLang want the served model's name; others take any or none
            "model": self.remote_model or openai.omit,
            "max_tokens": max_tokens,
            "temperature": cfg.temperature,
            "top_p": cfg.top_p,
            "seed": cfg.seed,
            # not in OpenAI's API; llama.cpp and vLLM/SGLang read them
            "extra_body": {"min_p": cfg.min_p, "repeat_penalty": cfg.repeat_penalty, "repetition_penalty": cfg.repeat_penalty},
        }
        if self.stream:
            params["stream"] = True
            params["stream_options"] = {"include_usage": True}
        return params

    def _request(self, route: str, prompt_ids: list[int], max_tokens: int, on_text) -> tuple[Generation, dict]:
        """One generation request on one route (the client retries inside it). Returns the
        generation and the server's usage block ({} when it sent none)."""
        params = self._params(max_tokens)
        out = Generation()
        usage: dict = {}
        parts: list[str] = []
        t0 = time.perf_counter()

        def take(obj) -> None:
            if getattr(obj, "usage", None) is not None:
                usage.update(obj.usage.model_dump(exclude_none=True))
            timings = (getattr(obj, "model_extra", None) or {}).get("timings")
            if isinstance(timings, dict):  # llama-server: cache_n = prompt tokens reused
                usage.setdefault("_timings", timings)
            for choice in getattr(obj, "choices", None) or []:
                if route == "chat":
                    msg = getattr(choice, "delta", None) or getattr(choice, "message", None)
                    piece = getattr(msg, "content", None)
                else:
                    piece = getattr(choice, "text", None)
                if piece:
                    if not parts:
                        out.ttft_s = time.perf_counter() - t0
                    parts.append(piece)
                    if on_text is not None:
                        on_text(piece)
                if getattr(choice, "finish_reason", None):
                    out.finish_reason = choice.finish_reason

        if route == "chat":
            answer = self.client.chat.completions.create(messages=self.chat_messages(prompt_ids), **params)
        else:
            prompt = list(prompt_ids) if route == "ids" else self.prompt_text(prompt_ids)
            answer = self.client.completions.create(prompt=prompt, **params)
        if self.stream:
            try:
                with answer:
                    for chunk in answer:
                        take(chunk)
            except self._httpx2.HTTPError as exc:  # the stream broke after the answer began
                said = "mid-answer" if parts else "before the first token"
                raise RemoteGeneratorError(
                    f"the generator at {self.base_url} closed the stream {said}: {_reason(exc)}"
                ) from None
        else:
            take(answer)
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
            data = self.client.with_options(max_retries=0, timeout=min(self.cfg.timeout_s, CONNECT_TIMEOUT_S)).models.list().data
            if len(data) == 1 and data[0].id:
                self.remote_model = data[0].id
                self.name = self.remote_model
        except Exception:
            self.remote_model = None  # try again next time (the server may be starting)

    # ------------------------------------------------------------ generation

    def generate(self, prompt_ids: list[int], *, max_tokens: int, on_text: Callable[[str], None] | None = None) -> Generation:
        if len(prompt_ids) + max_tokens > self.n_ctx:
            raise UsageError(f"prompt of {len(prompt_ids)} tokens + {max_tokens} new tokens exceeds n_ctx {self.n_ctx}")
        gen, usage = self._on_routes(prompt_ids, max_tokens, lambda route: self._request(route, prompt_ids, max_tokens, on_text))
        return self._finish(gen, usage, prompt_ids)

    def _on_routes(self, prompt_ids: list[int], max_tokens: int, send: Callable[[str], Any], *, refuse: Callable | None = None) -> Any:
        """`send(route)` on the negotiated route, moving to the next route on evidence
        the engine does not support this one, and every other failure reported as a
        RagkitError. `refuse(status, detail)`, when given, may return an exception to
        raise instead of the generic one (choose: "this engine gives no log-probabilities")."""
        import openai

        self._resolve_model()
        rejected: list[str] = []
        while True:
            route = self.mode
            before = self.attempts
            try:
                return send(route)
            except openai.APIConnectionError as exc:  # APITimeoutError included; retried by the client
                n = self.attempts - before
                raise GeneratorUnreachable(
                    f"cannot reach the generator at {self.base_url}: {_reason(exc)}",
                    hint=f"{n} attempt{'s' if n != 1 else ''}; is the server running? check generator.base_url",
                    attempts=n,
                ) from None
            except openai.APIStatusError as exc:
                status, detail = exc.status_code, _detail(exc)
                n = self.attempts - before
                if status in (401, 403):
                    raise RemoteGeneratorError(
                        f"the generator at {self.base_url} refused the request: HTTP {status}: {detail}",
                        hint="check generator.api_key",
                    ) from None
                if is_context_error(exc, detail):
                    raise PromptTooLong(
                        f"the generator at {self.base_url} cannot take a prompt of {len(prompt_ids)} tokens "
                        f"+ {max_tokens} new tokens (ragkit budgeted it for generator.n_ctx {self.n_ctx}): {detail}",
                        hint="set generator.n_ctx to the server's context size (llama_cpp.server --n_ctx, "
                             "llama-server -c, vLLM --max-model-len)",
                        prompt_tokens=len(prompt_ids), n_ctx=self.n_ctx,
                    ) from None
                if refuse is not None and (mine := refuse(status, detail)) is not None:
                    raise mine from None
                rejected.append(f"{route}: HTTP {status}: {detail}")
                nxt = next_route(route, status, detail)
                if nxt is None:
                    if status >= 500:
                        raise RemoteGeneratorError(
                            f"the generator at {self.base_url} failed: HTTP {status}: {detail}",
                            hint=f"{n} attempt{'s' if n != 1 else ''}",
                        ) from None
                    raise RemoteGeneratorError(
                        f"the generator at {self.base_url} rejected the request ({'; '.join(rejected)})"
                    ) from None
                self.mode = nxt
            except openai.APIError as exc:  # an error event inside the stream
                raise RemoteGeneratorError(f"the generator at {self.base_url} failed: {_detail(exc)}") from None

    # ------------------------------------------------------------ choosing

    def choose(self, prompt_ids: list[int], options: list[str], *, score: str = "mean") -> Choice:
        """Score each option as the continuation of the prompt, as the in-process engine
        does (ragkit.generate.llama.LlamaCppGenerator.choose), from the engine's own
        log-probabilities: one `/v1/completions` request with `max_tokens=1` and
        `logprobs=TOP_LOGPROBS` per distinct prefix (the prompt; the prompt and "Not" for
        "Not mentioned"), the option's next token read from the top log-probabilities
        (llama-server, vLLM, SGLang; llama_cpp.server started with `--logits_all true`).

        An engine that gives no log-probabilities (llama_cpp.server without logits_all,
        an engine that serves only chat) is asked for a short answer instead and the
        option read from it: the Choice says so (`scored=False`, `note`), and the
        fallback is remembered for the life of the generator."""
        toks = option_tokens(self, prompt_ids, options, score)
        t0 = time.perf_counter()
        if self.no_logprobs is None and self.mode != "chat":
            try:
                return self._choose_scored(prompt_ids, toks, score, t0)
            except _NoLogprobs as exc:
                self.no_logprobs = str(exc)
        elif self.no_logprobs is None:
            self.no_logprobs = "it serves only chat completions, which score no continuation"
        return self._choose_by_text(prompt_ids, options, t0)

    def _choose_scored(self, prompt_ids: list[int], toks: dict[str, list[int]], score: str, t0: float) -> Choice:
        # the prefixes whose next-token distribution is needed, shortest first
        prefixes = sorted({tuple(ids[:i]) for ids in toks.values() for i in range(len(ids))}, key=len)
        tops: dict[tuple, dict[str, float]] = {}
        usage0: dict = {}
        ttft = 0.0
        for pre in prefixes:
            tops[pre], usage = self._next_token_logprobs(list(prompt_ids) + list(pre))
            if not pre:
                usage0, ttft = usage, time.perf_counter() - t0
        per_token: dict[str, list[float]] = {}
        beyond: list[str] = []
        for o, ids in toks.items():
            lps = []
            for i, t in enumerate(ids):
                top = tops[tuple(ids[:i])]
                piece = self._piece(t)
                if piece in top:
                    lps.append(top[piece])
                else:  # below the engine's top-k: at most the k-th log-probability
                    lps.append(min(top.values()))
                    beyond.append(o)
            per_token[o] = lps
        details = usage0.get("prompt_tokens_details") or {}
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        ch = choice_from_tokens(per_token, score, prompt_tokens=int(usage0.get("prompt_tokens") or len(prompt_ids)),
                                cached_tokens=int(cached or (usage0.get("_timings") or {}).get("cache_n") or 0),
                                ttft_s=ttft, total_s=time.perf_counter() - t0)
        if beyond:
            ch.note = (f"{', '.join(dict.fromkeys(beyond))}: below the engine's top {TOP_LOGPROBS} log-probabilities, "
                       "scored at the k-th (an upper bound)")
        return ch

    def _piece(self, token: int) -> str:
        """A token's text as engines key their top log-probabilities by it."""
        return self.tok.llm.detokenize([token], special=True).decode("utf-8", errors="ignore")

    def _next_token_logprobs(self, ids: list[int]) -> tuple[dict[str, float], dict]:
        """The engine's top log-probabilities for the token after `ids`, and its usage block."""
        import openai

        def send(route: str):
            if route == "chat":
                raise _NoLogprobs("it serves only chat completions, which score no continuation")
            params = self._params(1)
            params.pop("stream", None)
            params.pop("stream_options", None)
            params["temperature"] = 0.0
            prompt = list(ids) if route == "ids" else self.prompt_text(ids)
            answer = self.client.completions.create(prompt=prompt, logprobs=TOP_LOGPROBS, **params)
            usage = answer.usage.model_dump(exclude_none=True) if getattr(answer, "usage", None) is not None else {}
            timings = (getattr(answer, "model_extra", None) or {}).get("timings")
            if isinstance(timings, dict):
                usage["_timings"] = timings
            lp = answer.choices[0].logprobs if answer.choices else None
            top = (lp.top_logprobs or [None])[0] if lp is not None else None
            if not top:
                raise _NoLogprobs("it answered without log-probabilities")
            return {str(k): float(v) for k, v in top.items()}, usage

        def refuse(status: int, detail: str):
            if re.search(r"logprob|logits_all", detail, re.I):
                return _NoLogprobs(f"it refused log-probabilities: HTTP {status}: {detail}")
            return None

        if self.mode == "chat":
            raise _NoLogprobs("it serves only chat completions, which score no continuation")
        try:
            out = self._on_routes(ids, 1, send, refuse=refuse)
        except openai.APIError as exc:  # an answer the client could not read as a completion
            raise _NoLogprobs(f"it answered without log-probabilities ({_detail(exc)})") from None
        if self.mode == "chat":  # the completions route turned out missing
            raise _NoLogprobs("it serves only chat completions, which score no continuation")
        return out

    def _choose_by_text(self, prompt_ids: list[int], options: list[str], t0: float) -> Choice:
        from ragkit.generate.base import choose_by_text

        ch = choose_by_text(self, prompt_ids, options, note=f"not scored: the generator at {self.base_url} gives no "
                                                          f"log-probabilities ({self.no_logprobs})")
        ch.total_s = time.perf_counter() - t0
        return ch

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
