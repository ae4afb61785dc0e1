"""`ragkit serve` is safe by default: loopback only unless a token guards it, the token on
every route but /health (routes added later included), bounded bodies and queue, a
client that goes away frees the generator, and nothing leaves loopback."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import threading
import time

import httpx
import openai
import pytest
from conftest import ROOT, in_ci, make_settings
from fastapi.routing import APIRoute
from serve_fixture import RAGKIT, SMALL, free_port, running_server
from starlette.routing import Mount, Route
from starlette.testclient import TestClient

from ragkit.commands.serve import check_bind
from ragkit.errors import UsageError
from ragkit.serve.app import create_app

LONG_Q = "List every obligation of the receiving party, quoting each in full."
LONG_DOC = "ragkit:common-paper-mutual-nda-v1-standard-terms.md"
ERROR_KEYS = {"message", "type", "param", "code"}


def error_of(r: httpx.Response) -> dict:
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == ERROR_KEYS, body
    assert "Traceback" not in r.text
    return body["error"]


# ---------------------------------------------------------------------- binding


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.20", "10.0.0.1", "example.com", "::ffff:10.0.0.1"])
def test_non_loopback_bind_needs_a_token(host):
    with pytest.raises(UsageError) as e:
        check_bind(host, None)
    assert e.value.exit_code == 2 and "--token" in str(e.value) and host in str(e.value)
    check_bind(host, "s3cret")  # with a token it may


@pytest.mark.parametrize("host", ["127.0.0.1", "127.3.2.1", "::1", "[::1]", "localhost"])
def test_loopback_bind_needs_no_token(host):
    from ragkit.serve.guard import is_loopback_host

    assert is_loopback_host(host.strip("[]"))
    check_bind(host, None)  # raises UsageError when it refuses


def test_an_empty_token_is_refused():
    with pytest.raises(UsageError):
        check_bind("0.0.0.0", "  ")


def _serve(args: list[str], env: dict | None = None, timeout: int = 120) -> subprocess.CompletedProcess:
    import os

    full = {k: v for k, v in os.environ.items() if not k.startswith("RAGKIT_SERVE__")}
    full.update({**SMALL, **(env or {})})
    return subprocess.run([*RAGKIT, "serve", *args], cwd=ROOT, env=full, capture_output=True, text=True, timeout=timeout)


def test_the_command_refuses_a_public_bind_without_a_token(nda_store):
    store = str(nda_store.store)
    # refused before any model loads: the generator named here does not exist, so loading it
    # would exit 3 (test_a_model_that_cannot_load_exits_3); the refusal is exit 2 and names no model
    missing = {"RAGKIT_GENERATOR__MODEL": "/nonexistent/never-loaded.gguf"}
    res = _serve(["--store", store, "--host", "0.0.0.0", "--port", str(free_port())], env=missing)
    assert res.returncode == 2, res.stderr
    assert "refusing to serve on 0.0.0.0" in res.stderr and "--token" in res.stderr and "Traceback" not in res.stderr
    assert "never-loaded" not in res.stderr
    # the setting route (RAGKIT_SERVE__HOST), with --json: one JSON error line
    res = _serve(["--store", store, "--port", str(free_port()), "--json"], env={"RAGKIT_SERVE__HOST": "0.0.0.0"})
    assert res.returncode == 2
    assert json.loads(res.stdout.strip().splitlines()[-1])["exit_code"] == 2


def test_a_model_that_cannot_load_exits_3(nda_store, tmp_path):
    res = _serve(["--store", str(nda_store.store), "--port", str(free_port())],
                 env={"RAGKIT_GENERATOR__MODEL": str(tmp_path / "missing.gguf")})
    assert res.returncode == 3, res.stderr
    assert "missing.gguf" in res.stderr and "Traceback" not in res.stderr


def _can_bind_all() -> bool:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("0.0.0.0", 0))
        return True
    except OSError:
        return False


def test_a_public_bind_with_a_token_starts_and_requires_it(nda_store, tmp_path):
    """With a token the server starts on 0.0.0.0 (where the sandbox allows binding it;
    else on 127.0.0.1 with the token from RAGKIT_SERVE__TOKEN) and every API call needs it."""
    token = "public-t0ken"
    if _can_bind_all():
        kw = {"token": token, "extra_args": ("--host", "0.0.0.0")}
    else:
        kw = {"env": {"RAGKIT_SERVE__TOKEN": token}}
    with running_server(nda_store.store, log_dir=tmp_path, **kw) as srv:
        srv.token = token
        assert srv.ready["token_required"] is True
        if "extra_args" in kw:
            assert srv.ready["host"] == "0.0.0.0"
        with pytest.raises(openai.AuthenticationError):
            srv.client(api_key="nope").models.list()
        assert [m.id for m in srv.client().models.list().data][0] == "ragkit"
        assert httpx.get(srv.url + "/health", trust_env=False).status_code == 200


# ---------------------------------------------------------------------- the app's guard


@pytest.fixture(scope="module")
def guarded_app(nda_store):
    # preload=False: the guard is checked without loading a model
    return create_app(nda_store, token="app-t0ken", preload=False)


def _concrete(path: str) -> str:
    return re.sub(r"\{(\w+)(?::(\w+))?\}", lambda m: "1" if m.group(2) == "int" else "x", path)


def _routes(routes, prefix: str = "") -> list[tuple[str, str]]:
    """(method, concrete path) of every route, included routers and mounts walked."""
    out = []
    for r in routes:
        if isinstance(r, (APIRoute, Route)):
            for m in sorted((r.methods or {"GET"}) - {"HEAD"}):
                out.append((m, _concrete(prefix + r.path)))
        elif isinstance(r, Mount):
            inner = getattr(r, "routes", None) or []
            out += _routes(inner, prefix + r.path) if inner else [("GET", _concrete(prefix + r.path.rstrip("/")) + "/x")]
        elif hasattr(r, "original_router"):  # FastAPI's included router (include_router)
            ctx = getattr(r, "include_context", None)
            out += _routes(r.original_router.routes, prefix + (getattr(ctx, "prefix", "") or ""))
        else:
            raise AssertionError(f"a route of an unknown kind: {r!r}: teach this test to reach it")
    return out


def test_every_route_but_health_needs_the_token(guarded_app):
    client = TestClient(guarded_app, base_url="http://127.0.0.1:8000", raise_server_exceptions=False)
    routes = _routes(guarded_app.routes)
    assert ("POST", "/v1/chat/completions") in routes and ("GET", "/v1/models") in routes
    try:
        import ragkit.serve.web  # noqa: F401  (the web page's routes, when present, are covered too)

        assert any(p.startswith("/api/") for _, p in routes), routes
    except ImportError:
        pass
    try:
        from ragkit.serve.web import PUBLIC_PATHS as public_shell
    except ImportError:
        public_shell = frozenset()
    assert all(p == "/" or p.startswith("/static/") for p in public_shell)  # nothing else goes without a token
    routes = routes + [("GET", p) for p in sorted(public_shell) if ("GET", p) not in routes]
    checked = 0
    for method, path in routes + [("GET", "/no/such/route"), ("DELETE", "/v1/models")]:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "app-t0ken"},
                        {"Authorization": "Bearer app-t0ken-and-more"}, {"Authorization": "Basic app-t0ken"}):
            r = client.request(method, path, headers=headers, json={} if method in ("POST", "PUT", "PATCH") else None)
            if (method, path) == ("GET", "/health") or (method == "GET" and path in public_shell):
                # the health check and the page's shell (no document data) load without a token
                assert r.status_code == 200, (method, path, r.text)
                continue
            assert r.status_code == 401, (method, path, headers, r.status_code, r.text[:200])
            assert error_of(r)["code"] == "invalid_api_key" and r.headers["www-authenticate"] == "Bearer"
            assert "access-control-allow-origin" not in r.headers
            checked += 1
    assert checked >= 5 * 4
    ok = client.get("/v1/models", headers={"Authorization": "Bearer app-t0ken"})
    assert ok.status_code == 200 and ok.json()["data"][0]["id"] == "ragkit"
    assert "access-control-allow-origin" not in ok.headers  # no CORS by default


def test_dns_rebinding_and_cross_site_requests_are_refused(nda_store):
    app = create_app(nda_store, preload=False)  # loopback, no token
    client = TestClient(app, base_url="http://127.0.0.1:8000")
    assert client.get("/v1/models").status_code == 200
    assert client.get("/v1/models", headers={"Origin": "http://127.0.0.1:8000"}).status_code == 200  # same origin
    r = client.get("/v1/models", headers={"Host": "rebound.example:8000"})
    assert r.status_code == 400 and error_of(r)["code"] == "invalid_host"
    for origin in ("http://evil.example", "null", "http://127.0.0.1:9999"):
        r = client.post("/v1/chat/completions", headers={"Origin": origin},
                        json={"model": "ragkit", "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 403 and error_of(r)["code"] == "cross_origin", origin
    # a form-encoded or text/plain POST (what a page can send without a preflight) is no API call
    r = client.post("/v1/chat/completions", content=b'{"model": "ragkit", "messages": [{"role": "user", "content": "hi"}]}',
                    headers={"Content-Type": "text/plain"})
    assert r.status_code == 400 and error_of(r)["type"] == "invalid_request_error"


def test_missing_model_or_store_answers_503(nda_store, tmp_path):
    bad_model = nda_store.model_copy(update={"generator": nda_store.generator.model_copy(update={"model": str(tmp_path / "x.gguf")})})
    body = {"model": "ragkit", "messages": [{"role": "user", "content": "Which law governs?"}]}
    r = TestClient(create_app(bad_model, preload=False), base_url="http://127.0.0.1").post("/v1/chat/completions", json=body)
    assert r.status_code == 503 and error_of(r)["code"] == "model_unavailable" and "x.gguf" in error_of(r)["message"]
    no_store = make_settings(tmp_path / "no-store")
    client = TestClient(create_app(no_store, preload=False), base_url="http://127.0.0.1")
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 503 and error_of(r)["code"] == "store_unavailable"
    assert client.get("/health").json()["documents"] == 0
    assert [m["id"] for m in client.get("/v1/models").json()["data"]] == ["ragkit"]


# ---------------------------------------------------------------------- a real server: limits, queue, disconnects


@pytest.fixture(scope="module")
def server(nda_store, tmp_path_factory):
    """max_queue 1 and long answers, so the queue can be filled and a stream cut short."""
    with running_server(nda_store.store, extra_args=("--max-queue", "1"), env={"RAGKIT_GENERATOR__MAX_TOKENS": "400"},
                        log_dir=tmp_path_factory.mktemp("serve-sec")) as srv:
        yield srv


def test_oversized_bodies_are_413(server):
    client = server.client()
    with pytest.raises(openai.APIStatusError) as e:
        client.chat.completions.create(model="ragkit", messages=[{"role": "user", "content": "x" * 1_100_000}])
    assert e.value.status_code == 413 and e.value.body["code"] == "request_too_large"

    def chunks():  # no Content-Length: counted while it is read
        for _ in range(12):
            yield b" " * 100_000
        yield b'{"model": "ragkit", "messages": []}'

    r = httpx.post(server.base_url + "/chat/completions", content=chunks(), headers={"Content-Type": "application/json"},
                   trust_env=False, timeout=60)
    assert r.status_code == 413 and error_of(r)["code"] == "request_too_large"


def test_a_question_over_the_prompt_budget_is_413(server):
    with pytest.raises(openai.APIStatusError) as e:
        server.client().chat.completions.create(
            model="ragkit", messages=[{"role": "user", "content": "Which law governs? " + "again " * 5000}])
    assert e.value.status_code == 413 and e.value.body["code"] == "context_length_exceeded"
    assert "n_ctx 2048" in e.value.body["message"]


def test_malformed_requests_are_400_never_a_traceback(server):
    url = server.base_url + "/chat/completions"
    cases = [
        (b"{not json", "invalid_json", None),
        (b"[1, 2]", "invalid_request", None),
        (json.dumps({"model": "ragkit", "messages": "hello"}).encode(), "invalid_request", "messages"),
        (json.dumps({"model": "ragkit", "messages": [{"role": "user", "content": 5}]}).encode(), "invalid_request", "messages.0.content"),
        (json.dumps({"model": "ragkit", "messages": [{"role": "wizard", "content": "hi"}]}).encode(), "invalid_request", "messages.0.role"),
        (json.dumps({"model": "ragkit", "messages": [{"role": "user", "content": "hi"}], "max_tokens": "many"}).encode(), "invalid_request", "max_tokens"),
        (json.dumps({"model": "ragkit", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}).encode(),
         "invalid_request", "messages.0.content.0"),
        (json.dumps({"model": "ragkit", "messages": []}).encode(), "invalid_request", "messages"),
    ]
    for body, code, param in cases:
        r = httpx.post(url, content=body, headers={"Content-Type": "application/json"}, trust_env=False, timeout=30)
        assert r.status_code == 400, (body, r.status_code, r.text)
        err = error_of(r)
        assert err["code"] == code and err["type"] == "invalid_request_error", (body, err)
        if param is not None:
            assert (err["param"] or "").startswith(param), (body, err)
    r = httpx.get(server.url + "/v1/nothing", trust_env=False)
    assert r.status_code == 404 and error_of(r)["code"] == "not_found"
    assert server.health()["status"] == "ok"


def _stream_in_thread(server, question: str, model: str, timeout: float, out: dict, key: str) -> threading.Thread:
    def run():
        try:
            client = server.client(timeout=timeout)
            for _ in client.chat.completions.create(model=model, stream=True, messages=[{"role": "user", "content": question}]):
                pass
            out[key] = "finished"
        except Exception as exc:  # the read timeout: this client goes away
            out[key] = type(exc).__name__

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _wait(pred, timeout: float, what: str, server) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        h = server.health()
        if pred(h):
            return h
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached in {timeout} s: {h}\n{server.log()}")
        time.sleep(0.05)


def test_a_full_queue_answers_429_with_retry_after(server):
    server.wait_idle()
    out: dict = {}
    # A generates (a long answer from a prefill of a whole document), B waits: with
    # max_queue 1 the queue is full; both clients give up after 12 s, which frees it
    a = _stream_in_thread(server, LONG_Q, LONG_DOC, 12, out, "a")
    _wait(lambda h: h["busy"], 30, "A generating", server)
    b = _stream_in_thread(server, "Which law governs this agreement?", "ragkit:bonterms-mutual-nda-v1.pdf", 12, out, "b")
    _wait(lambda h: h["queued"] == 1, 30, "B waiting", server)
    with pytest.raises(openai.RateLimitError) as e:
        server.client().chat.completions.create(model=LONG_DOC, messages=[{"role": "user", "content": "Who signs?"}])
    assert int(e.value.response.headers["retry-after"]) >= 1
    assert e.value.body["code"] == "queue_full" and set(e.value.body) == ERROR_KEYS
    assert server.health()["status"] == "ok"  # /health answers while the generator is busy
    a.join(60)
    b.join(60)
    h = server.wait_idle(60)  # the clients that went away freed the generator and the queue
    assert h["busy"] is False and h["queued"] == 0


def test_a_client_that_disconnects_mid_stream_frees_the_generator(server):
    server.wait_idle()
    client = server.client()
    before = server.err_path.read_text(errors="replace").count("client disconnected; generation stopped")
    stream = client.chat.completions.create(model=LONG_DOC, stream=True, messages=[{"role": "user", "content": LONG_Q}])
    pieces = 0
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            pieces += 1
            if pieces == 3:
                break
    assert server.health()["busy"] is True  # still generating its (long) answer
    stream.close()  # the client goes away mid-answer
    # freed by the disconnect, not by finishing: the server logs the stop (how fast is a speed
    # figure and depends on the machine's load, so it is not asserted here)
    _wait(lambda h: not h["busy"], 120, "generator free", server)
    log = server.err_path.read_text(errors="replace")
    assert log.count("client disconnected; generation stopped") == before + 1, server.log()
    # the next request is answered (the KV cache still holds the document)
    r = client.chat.completions.create(model=LONG_DOC, max_tokens=8, messages=[{"role": "user", "content": LONG_Q}])
    assert r.choices[0].message.content.strip() and r.usage.completion_tokens > 0
    assert r.usage.prompt_tokens_details.cached_tokens > 0.5 * r.usage.prompt_tokens


# ---------------------------------------------------------------------- offline


def test_join_unfinished_reads_split_calls_whole():
    from test_network import join_unfinished, offending_lines

    split = ('7  sendto(20, "\\0", 1, 0, NULL, 0 <unfinished ...>\n'
             '8  futex(0x1, FUTEX_WAKE, 1) = 0\n'
             '7  <... sendto resumed>)            = 1\n'
             '9  connect(5, {sa_family=AF_INET, sin_port=htons(443), sin_addr=inet_addr("10.1.2.3")}, 16 <unfinished ...>\n'
             '9  <... connect resumed>)            = 0')
    joined = join_unfinished(split)
    assert joined.splitlines()[0] == '7  sendto(20, "\\0", 1, 0, NULL, 0)            = 1'
    assert [why for _, why in offending_lines(joined)] == ["non-loopback 10.1.2.3 port 443"]


@pytest.mark.complete
def test_the_server_reaches_nothing_but_loopback(nda_store, tmp_path):
    """`ragkit serve` under strace -f (threads, native code): answering a question sends
    nothing off loopback and looks up no name (tests/test_network.py's parser)."""
    from test_network import TRACED, _strace_cmd, join_unfinished, offending_lines

    cmd = _strace_cmd(tmp_path / "probe.log")
    if cmd is None:
        if in_ci():
            pytest.fail("strace cannot trace here: the OS-level network check must run in CI")
        pytest.skip("strace is not installed or cannot trace here")
    log = tmp_path / "serve.trace"
    prefix = [*cmd[:-2], "-o", str(log)]
    assert f"trace={TRACED}" in prefix
    with running_server(nda_store.store, prefix=prefix, log_dir=tmp_path, timeout=240) as srv:
        r = srv.client().chat.completions.create(model="ragkit:ai-osi-stack-mutual-nda.md", max_tokens=8,
                                                 messages=[{"role": "user", "content": "Which law governs?"}])
        assert r.usage.completion_tokens > 0
        proc = srv.proc
    # uvicorn shuts down gracefully on SIGTERM, then re-raises it (exit by that signal)
    assert proc.returncode in (0, -15), srv.log()
    trace = log.read_text(errors="replace")
    lines = trace.splitlines()
    top = lines[0].split()[0]  # the trace is of the server itself, to its end, threads included
    assert re.match(rf'^{top}\s+execve\("{re.escape(RAGKIT[0])}", .* = 0$', lines[0]), lines[0]
    assert any(re.match(rf"^{top}\s+\+\+\+ (exited with 0|killed by SIGTERM) ", ln) for ln in lines), lines[-3:]
    assert len({ln.split()[0] for ln in lines if ln.split() and ln.split()[0].isdigit()}) >= 2
    assert re.search(r"sendto\(\d+, \"HTTP/1\.1 200", trace), "the answer's send is not in the trace"
    assert offending_lines(join_unfinished(trace)) == []
    assert offending_lines(trace) == []  # the parser reads split calls as they are, too
