"""The prompt route of the OpenAI-compatible backend (ids -> text -> chat) and how
engine answers map to ragkit errors, against a STAND-IN SERVER: a tiny scripted HTTP
server written here (http.server on loopback), because a real engine cannot be made to
answer "context length exceeded" once and then succeed, or to refuse a route on cue. The
client side is the real one (ragkit's generator on the official openai client, the real
tokenizer). The real engine path is tests/test_openai_backend.py (llama_cpp.server)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import make_settings

from ragkit.errors import RagkitError
from ragkit.generate.openai_compat import OpenAICompatGenerator

# llama_cpp.server's own answer to a prompt over its n_ctx (llama_cpp/server/errors.py)
CONTEXT_400 = (400, {"error": {
    "message": "This model's maximum context length is 2048 tokens, however you requested 2100 tokens "
               "(2052 in your prompt; 48 for the completion). Please reduce your prompt; or completion length.",
    "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}})
NOT_A_STRING_422 = (422, {"error": {"message": "prompt must be a string", "type": "invalid_request_error"}})
NOT_FOUND_404 = (404, {"detail": "Not Found"})


def completion(text: str, usage: dict | None = None, **extra) -> tuple[int, dict]:
    body = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "text": text, "finish_reason": "stop", "logprobs": None}], **extra}
    if usage is not None:
        body["usage"] = usage
    return 200, body


def chat_completion(text: str) -> tuple[int, dict]:
    return 200, {"id": "chat-1", "object": "chat.completion", "created": 1, "model": "m",
                 "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}


class StandIn:
    """Answers each POST with the next scripted (status, body) for its path (the last one
    repeats), or with server-sent events when the body is a list of events; records every
    request as (path, json body)."""

    def __init__(self, script: dict[str, list]):
        self.script = {k: list(v) for k, v in script.items()}
        self.seen: list[tuple[str, dict]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):  # quiet
                pass

            def _answer(self, status, body, headers=()):
                data = json.dumps(body).encode()
                self.send_response(status)
                for k, v in headers:
                    self.send_header(k, v)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._answer(200, {"object": "list", "data": [{"id": "m", "object": "model", "created": 1, "owned_by": "x"}]})

            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n) or b"{}")
                outer.seen.append((self.path, body))
                steps = outer.script.get(self.path) or [NOT_FOUND_404]
                step = steps.pop(0) if len(steps) > 1 else steps[0]
                status, payload = step[0], step[1]
                headers = step[2] if len(step) > 2 else ()
                if isinstance(payload, list):  # server-sent events
                    self.send_response(status)
                    self.send_header("Content-Type", "text/event-stream")
                    self.end_headers()
                    for ev in payload:
                        self.wfile.write(f"data: {json.dumps(ev)}\n\n".encode())
                        self.wfile.flush()
                    self.wfile.write(b"data: [DONE]\n\n")
                    return
                self._answer(status, payload, headers)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def paths(self) -> list[str]:
        return [p for p, _ in self.seen]

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def standin():
    servers: list[StandIn] = []

    def make(script):
        s = StandIn(script)
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.close()


def generator(url: str, *, stream: bool = False, **gen) -> OpenAICompatGenerator:
    cfg = {"backend": "openai", "base_url": url, "remote_model": "m", "retries": 2, "max_tokens": 16}
    cfg.update(gen)
    return OpenAICompatGenerator(make_settings(Path("unused-store"), **cfg), stream=stream)


def prompt(g, system: str = "Be brief.", user: str = "Say yes.") -> list[int]:
    """A prompt in the generator's own chat template, built as ragkit builds prompts."""
    from ragkit.retrieve.prompt import render_chat_parts

    pre, mid, post = render_chat_parts(g.chat_template)
    return (g.tokenize(pre, special=True, add_bos=True) + g.tokenize(system, special=False) + g.tokenize(mid, special=True)
            + g.tokenize(user, special=False) + g.tokenize(post, special=True))


def test_a_context_length_error_does_not_downgrade_the_route(standin):
    srv = standin({"/v1/completions": [CONTEXT_400, completion("Yes.")]})
    g = generator(srv.url)
    ids = prompt(g)
    with pytest.raises(RagkitError, match=rf"prompt of {len(ids)} tokens \+ 8 new tokens.*n_ctx 2048.*maximum context length is 2048") as info:
        g.generate(ids, max_tokens=8)
    assert info.value.exit_code == 2  # a configuration mismatch: the server's context is smaller
    assert g.mode == "ids"
    assert srv.paths() == ["/v1/completions"]  # one request: not retried, no other route tried
    out = g.generate(ids, max_tokens=8)
    assert out.text == "Yes." and out.extra["mode"] == g.mode == "ids"
    assert [b["prompt"] for _, b in srv.seen] == [ids, ids]  # token ids both times


def test_prompt_must_be_a_string_moves_to_text_for_good(standin):
    srv = standin({"/v1/completions": [NOT_A_STRING_422, completion("Yes."), completion("Again.")]})
    g = generator(srv.url)
    ids = prompt(g)
    assert g.generate(ids, max_tokens=8).extra["mode"] == "text"
    assert g.generate(ids, max_tokens=8).text == "Again."
    sent = [b["prompt"] for _, b in srv.seen]
    assert sent[0] == ids and sent[1] == sent[2] == g.prompt_text(ids) and isinstance(sent[1], str)


def test_an_unrelated_rejection_is_reported_and_changes_nothing(standin):
    bad = (400, {"error": {"message": "max_tokens must be at least 1, got 0.", "type": "BadRequestError"}})
    srv = standin({"/v1/completions": [bad, completion("Yes.")]})
    g = generator(srv.url)
    ids = prompt(g)
    with pytest.raises(RagkitError, match=r"rejected the request \(ids: HTTP 400: max_tokens must be at least 1"):
        g.generate(ids, max_tokens=8)
    assert g.mode == "ids" and srv.paths() == ["/v1/completions"]
    assert g.generate(ids, max_tokens=8).extra["mode"] == "ids"


def test_no_completions_route_goes_to_chat(standin):
    srv = standin({"/v1/completions": [NOT_FOUND_404], "/v1/chat/completions": [chat_completion("Yes.")]})
    g = generator(srv.url)
    out = g.generate(prompt(g), max_tokens=8)
    assert out.text == "Yes." and out.extra["mode"] == g.mode == "chat"
    # a missing route is missing for text prompts too: straight to chat, one request each
    assert srv.paths() == ["/v1/completions", "/v1/chat/completions"]
    assert srv.seen[1][1]["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say yes."}]


def test_a_model_not_found_404_is_not_a_missing_route(standin):
    nf = (404, {"object": "error", "message": "The model `m` does not exist.", "type": "NotFoundError", "code": 404})
    srv = standin({"/v1/completions": [nf]})
    g = generator(srv.url)
    with pytest.raises(RagkitError, match="does not exist"):
        g.generate(prompt(g), max_tokens=8)
    assert g.mode == "ids" and srv.paths() == ["/v1/completions"]


def test_usage_and_cached_tokens_from_a_stream(standin):
    """Streamed pieces, the final usage chunk (OpenAI's prompt_tokens_details.cached_tokens)
    and llama-server's timings.cache_n when no usage detail is given."""
    def chunk(text, **kw):
        return {"id": "c", "object": "text_completion", "created": 1, "model": "m",
                "choices": [{"index": 0, "text": text, "finish_reason": kw.pop("finish", None), "logprobs": None}], **kw}

    usage = {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15, "prompt_tokens_details": {"cached_tokens": 9}}
    events = [chunk("Ye"), chunk("s"), chunk(".", finish="stop"),
              {"id": "c", "object": "text_completion", "created": 1, "model": "m", "choices": [], "usage": usage}]
    timed = [chunk("Yes.", finish="stop", timings={"cache_n": 7, "prompt_n": 5}),
             {"id": "c", "object": "text_completion", "created": 1, "model": "m", "choices": [],
              "usage": {"prompt_tokens": 12, "completion_tokens": 2, "total_tokens": 14}}]
    srv = standin({"/v1/completions": [(200, events), (200, timed), (200, [chunk("Yes.", finish="stop")])]})
    g = generator(srv.url, stream=True)
    ids = prompt(g)
    pieces: list[str] = []
    out = g.generate(ids, max_tokens=8, on_text=pieces.append)
    assert pieces == ["Ye", "s", "."] and out.text == "Yes." and out.finish_reason == "stop"
    assert (out.prompt_tokens, out.completion_tokens, out.cached_tokens) == (12, 3, 9)
    assert out.extra["cached_reported"] and out.extra["usage_reported"]
    assert srv.seen[0][1]["stream"] is True and srv.seen[0][1]["stream_options"] == {"include_usage": True}
    out = g.generate(ids, max_tokens=8)
    assert (out.completion_tokens, out.cached_tokens) == (2, 7) and out.extra["cached_reported"]
    # nothing reported: the prompt size is ours, completion tokens are counted locally, cache 0 and said so
    out = g.generate(ids, max_tokens=8)
    assert out.prompt_tokens == len(ids) and out.completion_tokens == len(g.tokenize("Yes.", special=False))
    assert out.cached_tokens == 0 and not out.extra["cached_reported"] and not out.extra["usage_reported"]


def test_5xx_is_retried_by_the_client_with_backoff(standin):
    srv = standin({"/v1/completions": [(503, {"error": {"message": "loading model"}}), completion("Yes.")]})
    g = generator(srv.url)
    t0 = time.monotonic()
    out = g.generate(prompt(g), max_tokens=8)
    assert out.text == "Yes." and g.attempts == 2 and len(srv.seen) == 2
    assert time.monotonic() - t0 >= 0.3  # the openai client's backoff (0.5 s less up to 25% jitter)


def test_5xx_after_every_retry_is_a_remote_error(standin):
    srv = standin({"/v1/completions": [(500, {"error": {"message": "CUDA out of memory"}})]})
    g = generator(srv.url, retries=1)
    with pytest.raises(RagkitError, match=r"failed: HTTP 500: CUDA out of memory \(2 attempts\)") as info:
        g.generate(prompt(g), max_tokens=8)
    assert info.value.exit_code == 3 and g.mode == "ids" and len(srv.seen) == 2


def test_a_redirect_to_another_host_is_not_followed(standin, no_outbound_network):
    srv = standin({"/v1/completions": [(307, {}, [("Location", "http://203.0.113.7/v1/completions")])]})
    g = generator(srv.url)
    before = len(no_outbound_network)
    with pytest.raises(RagkitError):
        g.generate(prompt(g), max_tokens=8)
    assert all(a[1][0] == "127.0.0.1" for a in no_outbound_network[before:])
    assert srv.paths() == ["/v1/completions"]


@pytest.mark.parametrize("status,detail,route,nxt", [
    # evidence that the id list is not taken: the text form next
    (422, "1 validation error: {'type': 'string_type', 'loc': ('body', 'prompt', 'str'), 'msg': 'Input should be a valid string'}", "ids", "text"),
    (400, "json: cannot unmarshal array into Go struct field CompletionRequest.prompt of type string", "ids", "text"),
    # no completions route: chat next, from either completions form
    (404, "Not Found", "ids", "chat"),
    (405, "Method Not Allowed", "text", "chat"),
    # no evidence: stay, and report
    (400, "max_tokens must be at least 1, got 0.", "ids", None),
    (422, "temperature must be <= 2", "ids", None),
    (404, "The model `kimi` does not exist.", "ids", None),
    (400, "prompt must be a string", "text", None),  # the text form is a string: something else is wrong
    (404, "Not Found", "chat", None),  # nothing after chat
])
def test_route_changes_only_on_evidence(status, detail, route, nxt):
    from ragkit.generate.openai_compat import next_route

    assert next_route(route, status, detail) == nxt


@pytest.mark.parametrize("detail", [
    "This model's maximum context length is 2048 tokens, however you requested 2100 tokens (2052 in your prompt; 48 for the completion).",
    "the request exceeds the available context size, try increasing it",  # llama-server
    "The input (3000 tokens) is longer than the model's context length (2048 tokens).",  # SGLang
    "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 2048. Given: 2100",  # TGI
])
def test_context_errors_are_recognised(detail):
    from ragkit.generate.openai_compat import _CONTEXT_ERROR

    assert _CONTEXT_ERROR.search(detail)
    assert not _CONTEXT_ERROR.search("temperature must be <= 2") and not _CONTEXT_ERROR.search("prompt must be a string")
